"""What the generic code (generation, translation, inspection) may assume of a model: explicit Protocols.

An **encoder-decoder** (Vaswani's ``Seq2Seq``, the attention ``RNNSeq2Seq``, the ``GridCaptioner``) encodes a
source once and then decodes target tokens against it, with per-layer caches for incremental decoding:

    memory = model.encode(src_ids, src_mask).last_hidden_state            # (B, S, D)
    caches = model.new_caches(batch, max_len, memory_len)                 # preallocated / per-layer state
    logits = model.decode(tgt_ids, memory, src_mask, tgt_mask, caches).logits   # (B, T, V)

``lmforge.generation`` drives every model that satisfies it, and a decoder-only model (GPT) the same way
through its own ``new_caches``. ``is_encoder_decoder(model)`` is the one test the code uses.

``special_ids(model, tokenizer)`` is the one place the ids generation needs are read: where a row stops, what
fills a finished row, what an empty prompt and an encoder-decoder's decoder start from.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import torch

from lmforge.errors import LmforgeError


@runtime_checkable
class EncoderDecoder(Protocol):
    """encode a source, decode targets against it, with caches (see the module docstring)."""

    config: Any

    def encode(self, src_ids: torch.Tensor, src_mask: torch.Tensor | None = None, *args: Any,
               **kwargs: Any) -> Any: ...

    def decode(self, tgt_ids: torch.Tensor, memory: torch.Tensor | None, src_mask: torch.Tensor | None = None,
               tgt_mask: torch.Tensor | None = None, caches: list | None = None, *args: Any, **kwargs: Any
               ) -> Any: ...

    def new_caches(self, batch: int, max_len: int, memory_len: int, dtype: torch.dtype | None = None,
                   device: torch.device | None = None) -> list: ...


def is_encoder_decoder(model: Any) -> bool:
    """True for Seq2Seq, RNNSeq2Seq and GridCaptioner (anything with encode, decode and new_caches)."""
    return isinstance(model, EncoderDecoder)


def generates_text(model: Any) -> bool:
    """A decoder-only LM (its forward takes caches) or an encoder-decoder: what ``lmforge generate`` drives."""
    from lmforge.models.decoder import Decoder

    return isinstance(model, Decoder) or is_encoder_decoder(model)


@dataclass(frozen=True)
class SpecialIds:
    """The special ids of a model, resolved once (``special_ids``)."""

    eos: int | None  # end of text
    pad: int  # fills a finished row and a left-padded prompt: pad_id, else eos, else 0
    bos: int | None  # beginning of text: an empty prompt starts from it
    decoder_start: int | None  # an encoder-decoder's first decoder token (None for a decoder-only model)
    stops: tuple[int, ...]  # the tokens that end a row: those given, else (eos,)

    def ending(self, more: Iterable[int] = ()) -> list[int]:
        """The stop tokens and ``more`` (a chat template's end-of-turn tokens), sorted, each once."""
        return sorted({*self.stops, *more})


def special_ids(model: Any, tokenizer: Any = None, *, stops: Sequence[int] | None = None, pad: int | None = None,
                start: int | None = None) -> SpecialIds:
    """The ids generation needs, by one rule. Each of eos / pad / bos is the model config's, else the tokenizer's
    (``model`` may be None: a chat format knows only its tokenizer); then

        pad            = ``pad`` given, else pad_id, else eos, else 0
        decoder_start  = ``start`` given, else decoder_start_id, else bos_id; an encoder-decoder without one is an
                         error naming it
        stops          = ``stops`` given (``[]``: none), else [eos] (none without an eos)

    >>> class Config: eos_id, pad_id, bos_id = 2, None, 1
    >>> class Model: config = Config()
    >>> special_ids(Model())
    SpecialIds(eos=2, pad=2, bos=1, decoder_start=None, stops=(2,))
    """
    config = getattr(model, "config", None)

    def read(name: str) -> int | None:
        value = getattr(config, name, None)
        return value if value is not None else getattr(tokenizer, name, None)

    eos, bos = read("eos_id"), read("bos_id")
    pad = next((i for i in (pad, read("pad_id"), eos) if i is not None), 0)
    decoder_start = None
    if is_encoder_decoder(model):
        decoder_start = next((i for i in (start, getattr(config, "decoder_start_id", None), bos) if i is not None),
                             None)
        if decoder_start is None:
            raise LmforgeError("decoder_start_id: the model config has no decoder_start_id or bos_id; pass start_id")
    stops = tuple(stops) if stops is not None else ((eos,) if eos is not None else ())
    return SpecialIds(eos, pad, bos, decoder_start, stops)
