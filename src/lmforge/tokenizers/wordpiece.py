"""WordPiece (BERT): normalize, split on spaces and punctuation, greedy longest match with ``##``.

Each word is cut greedily from the left into the longest pieces found in the vocabulary; pieces
after the first carry the prefix ``##``. If some position matches nothing, or the word is longer
than 100 characters, the whole word becomes ``[UNK]``::

    "unbelievably" -> un ##bel ##ie ##va ##bly       (all-MiniLM-L6-v2's vocabulary)

Training really learns WordPiece, not BPE: words start as ``u ##n ##b ...`` and the pair merged
next is the one with the best score ``count(ab) / (count(a) * count(b))`` (Schuster and Nakajima
2012, as described for BERT), which favours pairs whose parts are rare on their own.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from lmforge.errors import LmforgeError
from lmforge.tokenizers.base import Tokenizer, WordPieces
from lmforge.tokenizers.normalize import BertNormalizer
from lmforge.tokenizers.pretokenize import BERT_SPLIT
from lmforge.tokenizers.train import count_words, learn_merges, progress_bar

BERT_SPECIALS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
BERT_ROLES = {"pad": "[PAD]", "unk": "[UNK]", "cls": "[CLS]", "sep": "[SEP]", "mask": "[MASK]"}
CLEANUP = frozenset(".,?!")  # tokens the decoder glues to the previous one
BERT_TEMPLATE = {"single": ["[CLS]", "$A", "[SEP]"], "pair": ["[CLS]", "$A", "[SEP]", "$B:1", "[SEP]:1"]}


def greedy_longest_match(word: str, vocab: dict[str, int], prefix: str = "##",
                         max_len: int = 100) -> list[tuple[int, int]] | None:
    """Spans of the longest-match-first pieces of ``word``, or ``None`` if it cannot be covered.

    >>> greedy_longest_match("unable", {"un": 0, "##able": 1, "##a": 2})
    [(0, 2), (2, 6)]
    >>> greedy_longest_match("xyz", {"x": 0}) is None
    True
    """
    spans, start, n = [], 0, len(word)
    while start < n:
        end = min(n, start + max_len)
        while end > start:
            piece = word[start:end] if start == 0 else prefix + word[start:end]
            if piece in vocab:
                break
            end -= 1
        if end == start:
            return None
        spans.append((start, end))
        start = end
    return spans


class WordPieceTokenizer(Tokenizer):
    """BERT's tokenizer: ``BertNormalizer``, BERT pre-tokenization, greedy longest-match WordPiece."""

    kind = "wordpiece"
    special_joiner = " "
    pattern = BERT_SPLIT

    def __init__(self, tokens: Sequence[str], *, prefix: str = "##", max_input_chars_per_word: int = 100,
                 normalizer: BertNormalizer | None = None, cleanup: bool = True, **base: Any) -> None:
        if base.get("template") is None and {"[CLS]", "[SEP]"} <= set(base.get("special_tokens", ())):
            base["template"] = BERT_TEMPLATE
        super().__init__(tokens, **base)
        self.prefix = prefix
        self.max_input_chars_per_word = max_input_chars_per_word
        self.normalizer = normalizer or BertNormalizer()
        self.cleanup = cleanup
        self._longest = max((len(t) for t in self.vocab), default=1)

    @classmethod
    def from_vocab_file(cls, path: str | Path, lowercase: bool = True) -> WordPieceTokenizer:
        """A BERT ``vocab.txt`` (one token a line, id = line number) with BERT's defaults."""
        path = Path(path)
        try:
            tokens = path.read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError) as err:
            raise LmforgeError(f"{path}: cannot read vocabulary ({err})") from None
        while tokens and tokens[-1] == "":
            tokens.pop()
        missing = [t for t in BERT_SPECIALS if t not in tokens]
        if missing or len(set(tokens)) != len(tokens):
            raise LmforgeError(f"{path}: not a BERT vocabulary (missing {missing} or duplicate lines)")
        tok = cls(tokens, special_tokens=BERT_SPECIALS, roles=BERT_ROLES,
                  normalizer=BertNormalizer(lowercase=lowercase))
        tok.specials_in_text = True  # as BertTokenizerFast: [CLS] written in text is the token [CLS]
        return tok

    def _normalize(self, text: str) -> tuple[str, list[int] | None]:
        return self.normalizer(text)

    def _word_pieces(self, word: str) -> WordPieces:
        spans = None
        if len(word) <= self.max_input_chars_per_word:
            spans = greedy_longest_match(word, self.vocab, self.prefix, self._longest)
        if spans is None:
            if self.unk_id is None:
                raise LmforgeError(f"word {word[:40]!r} cannot be tokenized and there is no unk token")
            return (self.unk_id,), (self.roles["unk"],), ((0, len(word)),)
        tokens = tuple(word[s:e] if s == 0 else self.prefix + word[s:e] for s, e in spans)
        return tuple(self.vocab[t] for t in tokens), tokens, tuple(spans)

    def _decode_plain(self, tokens: list[str]) -> str:
        """Join pieces: ``##`` pieces glue to the previous one, others get a space.

        With ``cleanup`` (as Hugging Face, token by token), ``. , ? !`` get no space before them.

        >>> WordPieceTokenizer(["[UNK]", "un", "##able", ","])._decode_plain(["un", "##able", ",", "un"])
        'unable, un'
        """
        n, tight = len(self.prefix), CLEANUP if self.cleanup else ()
        return "".join(t[n:] if t.startswith(self.prefix) else t if t in tight else " " + t
                       for t in tokens).lstrip(" ")

    # ---- training ----------------------------------------------------------------------------
    @classmethod
    def train(cls, texts: Iterable[str], vocab_size: int, min_frequency: int = 2, *,
              special_tokens: Sequence[str] = BERT_SPECIALS, roles: dict[str, str] | None = None,
              lowercase: bool = True, workers: int = 1, progress: bool = False) -> WordPieceTokenizer:
        """Learn a WordPiece vocabulary by score-based merges (see the module docstring)."""
        roles = {r: t for r, t in (BERT_ROLES if roles is None else roles).items() if t in special_tokens}
        probe = cls(list(special_tokens), normalizer=BertNormalizer(lowercase=lowercase))
        counts = count_words(texts, probe._train_split, workers)
        counts.pop("", None)
        if not counts:
            raise LmforgeError("empty corpus: no words to learn from")
        prefix = probe.prefix
        alphabet = sorted({c for w in counts for c in w[:1]} | {prefix + c for w in counts for c in w[1:]})
        tokens = [*special_tokens, *(c for c in alphabet if c not in special_tokens)]
        if vocab_size < len(tokens):
            raise LmforgeError(f"--vocab-size {vocab_size} is smaller than the alphabet "
                               f"({len(tokens)} symbols, special tokens included)")
        ids = {t: i for i, t in enumerate(tokens)}
        words = [[ids[w[0]], *(ids[prefix + c] for c in w[1:])] for w in counts]

        def join(a: str, b: str) -> str:
            return a + b[len(prefix):]

        with progress_bar(vocab_size - len(tokens), progress) as bar:
            learn_merges(words, list(counts.values()), tokens, vocab_size, min_frequency, join=join,
                         wordpiece=True, on_merge=lambda: bar.update())
        return cls(tokens, special_tokens=special_tokens, roles=roles,
                   normalizer=BertNormalizer(lowercase=lowercase))

    def _train_split(self, text: str) -> list[str]:
        return [w for w in self.pattern.findall(self._normalize(text)[0])
                if len(w) <= self.max_input_chars_per_word]

    # ---- saving ------------------------------------------------------------------------------
    def _model_dict(self) -> dict[str, Any]:
        return {"prefix": self.prefix, "max_input_chars_per_word": self.max_input_chars_per_word,
                "normalizer": self.normalizer.to_dict(), "cleanup": self.cleanup}

    @classmethod
    def _from_model_dict(cls, model: dict[str, Any], **base: Any) -> Tokenizer:
        return cls(base.pop("tokens"), prefix=model["prefix"],
                   max_input_chars_per_word=model["max_input_chars_per_word"],
                   normalizer=BertNormalizer(**model["normalizer"]), cleanup=model.get("cleanup", True), **base)

    def save(self, directory: str | Path) -> Path:
        """Also writes a BERT ``vocab.txt`` (the readable file, loadable by any BERT tokenizer)."""
        path = super().save(directory)
        self.save_files(directory, {"vocab.txt": "\n".join(self.id_to_token) + "\n"})
        return path
