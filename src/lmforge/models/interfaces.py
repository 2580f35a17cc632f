"""What the generic code (generation, translation, inspection) may assume of a model: explicit Protocols.

An **encoder-decoder** (Vaswani's ``Seq2Seq``, the attention ``RNNSeq2Seq``, the ``GridCaptioner``) encodes a
source once and then decodes target tokens against it, with per-layer caches for incremental decoding:

    memory = model.encode(src_ids, src_mask).last_hidden_state            # (B, S, D)
    caches = model.new_caches(batch, max_len, memory_len)                 # preallocated / per-layer state
    logits = model.decode(tgt_ids, memory, src_mask, tgt_mask, caches).logits   # (B, T, V)

``lmforge.generation`` drives every model that satisfies it, and a decoder-only model (GPT) the same way
through its own ``new_caches``. ``is_encoder_decoder(model)`` is the one test the code uses.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Protocol, runtime_checkable

import torch


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


class SpecialIds(NamedTuple):
    """A model's special token ids, resolved by one rule (``special_ids``)."""

    eos: int | None
    pad: int
    bos: int | None
    decoder_start: int | None
    stops: list[int]


def special_ids(model: Any, tokenizer: Any = None) -> SpecialIds:
    """The ids decoding needs: pad = pad_id, else eos, else 0; an encoder-decoder's first target token =
    decoder_start_id, else bos_id; the tokens that stop a reply = [eos] (none without one)."""
    config = getattr(model, "config", None)
    eos, pad, bos = (getattr(config, name, None) for name in ("eos_id", "pad_id", "bos_id"))
    start = getattr(config, "decoder_start_id", None)
    return SpecialIds(eos, pad if pad is not None else (eos if eos is not None else 0), bos,
                      start if start is not None else bos, [eos] if eos is not None else [])
