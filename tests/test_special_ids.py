"""The model's special ids come from one function (issue 36, "declared once"): ``special_ids(model, tokenizer)``
gives eos, pad (pad_id, else eos, else 0), bos, an encoder-decoder's decoder start (decoder_start_id, else bos_id,
else an error naming it) and the stops (those given, else [eos])."""

from __future__ import annotations

import pytest

from lmforge.errors import LmforgeError
from lmforge.models.interfaces import SpecialIds, special_ids


def config(**ids: int | None) -> object:
    return type("Config", (), {"eos_id": None, "pad_id": None, "bos_id": None, **ids})()


class DecoderOnly:
    def __init__(self, **ids: int | None) -> None:
        self.config = config(**ids)


class EncoderDecoder(DecoderOnly):
    """What ``is_encoder_decoder`` recognises: encode, decode, new_caches."""

    def encode(self, *args): ...

    def decode(self, *args): ...

    def new_caches(self, *args): ...


class Tokenizer:
    eos_id, pad_id, bos_id = 7, 8, 9


@pytest.mark.parametrize(("model", "tokenizer", "expected"), [
    (DecoderOnly(eos_id=2, pad_id=0, bos_id=1), None, SpecialIds(2, 0, 1, None, (2,))),
    (DecoderOnly(eos_id=2, bos_id=1), None, SpecialIds(2, 2, 1, None, (2,))),  # no pad: eos
    (DecoderOnly(), None, SpecialIds(None, 0, None, None, ())),  # nothing: pad 0, no stop
    (DecoderOnly(eos_id=2), Tokenizer(), SpecialIds(2, 8, 9, None, (2,))),  # the config's first, then the tokenizer's
    (None, Tokenizer(), SpecialIds(7, 8, 9, None, (7,))),  # a chat format knows only its tokenizer
    (EncoderDecoder(eos_id=2, pad_id=0, bos_id=1), None, SpecialIds(2, 0, 1, 1, (2,))),  # starts from bos
    (EncoderDecoder(eos_id=2, bos_id=1, decoder_start_id=5), None, SpecialIds(2, 2, 1, 5, (2,))),
])
def test_special_ids_follow_one_rule(model, tokenizer, expected):
    assert special_ids(model, tokenizer) == expected


def test_special_ids_given_replace_the_models_and_a_start_is_required_of_an_encoder_decoder():
    model = EncoderDecoder(eos_id=2, pad_id=0, bos_id=1)
    assert special_ids(model, stops=[], pad=3, start=4) == SpecialIds(2, 3, 1, 4, ())
    assert special_ids(model, stops=[5, 6]).ending([6, 9, 2]) == [2, 5, 6, 9]
    with pytest.raises(LmforgeError, match=r"^decoder_start_id: .*pass start_id$"):
        special_ids(EncoderDecoder(eos_id=2))
    assert special_ids(EncoderDecoder(eos_id=2), start=0).decoder_start == 0  # 0 is an id, not "missing"


def test_special_ids_of_the_real_models():
    pytest.importorskip("torch", reason="builds lmforge's own decoder and encoder-decoder")
    from lmforge.models import Decoder, get_preset
    from lmforge.models.seq2seq import Seq2Seq

    gpt = Decoder(get_preset("gpt-tiny", eos_id=3, pad_id=None, bos_id=None))
    assert special_ids(gpt) == SpecialIds(3, 3, None, None, (3,))
    vaswani = Seq2Seq(get_preset("seq2seq-tiny"))
    assert special_ids(vaswani) == SpecialIds(2, 0, 1, 1, (2,))
