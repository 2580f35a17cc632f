"""Prefix caching: the keys and values of prompt beginnings seen before, reused instead of recomputed.

Chat requests share their first tokens: the template's system turn (SmolLM2's is 22 tokens of a typical
40-token prompt), a few-shot preamble, a long document asked several questions. The engine keeps the keys and
values of such beginnings in *blocks* of ``BLOCK`` tokens, each filed under the whole token sequence up to its end
(so a block is found only after the same beginning). A new prompt copies its longest run of cached blocks into
its slot and prefills only the rest, attending to the copied columns:

    prompt        [ block 0 | block 1 | rest ... ]            n tokens
    cached?         yes       yes       (at least one token is always computed: its logits give the next token)
    prefill       columns [2 * BLOCK, n), positions from 2 * BLOCK, keys [0, n)

What stays exact: a block's keys and values are those of its tokens at their positions, whatever followed
them, since attention is causal; and the continued prefill gives each position the bits the whole prompt's
prefill gives it (tests/test_prefix.py checks both, on the engine's thread count). Least recently used blocks
are dropped beyond ``capacity``. One block costs L layers x 2 x H_kv x BLOCK x d_head numbers (SmolLM2-135M in
float32: 0.35 MB). A model serving several LoRA adapters (adapters.py) files each block under its adapter too
(``tag``): the same tokens have other keys and values under another adapter.
"""

from __future__ import annotations

import collections
from collections.abc import Sequence

import torch

from lmforge.generation.slots import SlotCaches

BLOCK = 8  # tokens a block holds: SmolLM2's chat prompts share 25 tokens, 24 of them in blocks of 8 (16 in 16)


class PrefixCache:
    """Blocks of keys and values of prompt beginnings, by the tokens up to each block's end (least recently used
    dropped beyond ``capacity`` blocks). ``caches``: the engine's slots, which blocks are copied from and into.

    >>> # after a prompt of 40 tokens was prefilled into slot 3:  prefix.store(3, ids, 0)    -> 2 blocks kept
    >>> # a later prompt with the same first 32 tokens:          prefix.longest(other) == 32
    >>> #                                                        prefix.load(5, other, 32)   -> columns [0, 32)
    """

    def __init__(self, caches: SlotCaches, capacity: int) -> None:
        self.caches, self.capacity = caches, capacity
        self.blocks: collections.OrderedDict[tuple[int, ...], list[tuple[torch.Tensor, torch.Tensor]]] = \
            collections.OrderedDict()
        self.hits = self.misses = 0  # prompt tokens taken from the cache / computed

    @staticmethod
    def key(ids: Sequence[int], end: int, tag: int) -> tuple[int, ...]:
        """What a block is filed under: the tokens up to its end (and the adapter ``tag``, when not 0)."""
        return tuple(ids[:end]) if not tag else (-tag, *ids[:end])

    def longest(self, ids: Sequence[int], tag: int = 0) -> int:
        """How many of the prompt's first tokens are cached (a multiple of BLOCK, always less than len(ids))."""
        found = 0
        for end in range(BLOCK, len(ids), BLOCK):  # never the whole prompt: its last token must be computed
            if self.key(ids, end, tag) not in self.blocks:
                break
            found = end
        return found

    def load(self, slot: int, ids: Sequence[int], start: int, tag: int = 0) -> None:
        """Copy the cached blocks of the prompt's first ``start`` tokens into columns [0, start) of ``slot``."""
        kvs = self.caches.all()
        for end in range(BLOCK, start + 1, BLOCK):
            key = self.key(ids, end, tag)
            self.blocks.move_to_end(key)
            for kv, (k, v) in zip(kvs, self.blocks[key], strict=True):
                kv.k[slot, :, end - BLOCK: end] = k  # (H_kv, BLOCK, d)
                kv.v[slot, :, end - BLOCK: end] = v

    def store(self, slot: int, ids: Sequence[int], start: int, tag: int = 0) -> None:
        """Keep the blocks of a prompt just prefilled into ``slot`` (its whole blocks not kept yet), its first
        ``start`` tokens having come from the cache."""
        self.hits += start
        self.misses += len(ids) - start
        kvs = self.caches.all()
        for end in range(BLOCK, len(ids) + 1, BLOCK):
            key = self.key(ids, end, tag)
            if key in self.blocks:
                self.blocks.move_to_end(key)
                continue
            self.blocks[key] = [(kv.k[slot, :, end - BLOCK: end].clone(), kv.v[slot, :, end - BLOCK: end].clone())
                                for kv in kvs]
            if len(self.blocks) > self.capacity:
                self.blocks.popitem(last=False)
