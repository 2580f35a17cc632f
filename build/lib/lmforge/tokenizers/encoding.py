"""``Encoding``: what a tokenizer returns for one text (or pair), the same fields as Hugging Face's.

    >>> enc = Encoding([101, 7592, 102], ["[CLS]", "hello", "[SEP]"], [(0, 0), (0, 5), (0, 0)], [None, 0, None],
    ...                [0, 0, 0], [1, 0, 1], [1, 1, 1])
    >>> enc.pad(5, 0, "[PAD]"); enc.ids, enc.attention_mask
    ([101, 7592, 102, 0, 0], [1, 1, 1, 0, 0])
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Encoding:
    """One encoded text (or pair): parallel lists, one entry per token.

    ``offsets`` are character spans into the original text (of the sequence the token came from;
    ``(0, 0)`` for added special tokens), ``word_ids`` the index of the pre-tokenized word
    (``None`` for special tokens), ``type_ids`` 0 for the first sequence and 1 for the second,
    ``special_tokens_mask`` 1 for tokens the template or padding added and for special tokens
    recognised in the text (never for ordinary text, even an ``[UNK]``), ``attention_mask`` 0 for padding.
    """

    ids: list[int] = field(default_factory=list)
    tokens: list[str] = field(default_factory=list)
    offsets: list[tuple[int, int]] = field(default_factory=list)
    word_ids: list[int | None] = field(default_factory=list)
    type_ids: list[int] = field(default_factory=list)
    special_tokens_mask: list[int] = field(default_factory=list)
    attention_mask: list[int] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.ids)

    def _fields(self) -> list[list]:
        return [self.ids, self.tokens, self.offsets, self.word_ids, self.type_ids,
                self.special_tokens_mask, self.attention_mask]

    def truncate(self, n: int) -> None:
        """Keep the first ``n`` tokens."""
        for values in self._fields():
            del values[n:]

    def pad(self, length: int, pad_id: int, pad_token: str, left: bool = False) -> None:
        """Pad to ``length`` with ``pad_id`` (attention mask 0, special mask 1)."""
        n = length - len(self)
        if n <= 0:
            return
        extra = [[pad_id] * n, [pad_token] * n, [(0, 0)] * n, [None] * n, [0] * n, [1] * n, [0] * n]
        for values, pad in zip(self._fields(), extra, strict=True):
            values[:] = pad + values if left else values + pad
