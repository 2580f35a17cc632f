"""Long words (bpe.py's heap path): the ids of the merge_once reference and of Hugging Face `tokenizers`, in
O(n log n) work (counted, not timed), and never cached (a client's distinct megabyte words must not pile up)."""

from __future__ import annotations

import json
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lmforge.tokenizers import BPETokenizer, ByteLevelBPETokenizer, to_huggingface
from lmforge.tokenizers.bpe import SHORT_WORD, apply_merges, merge_word_fast

LETTERS = "etaoinshrdlu"


@pytest.fixture(scope="module")
def shakespeare() -> str:
    from lmforge.data.sources import shakespeare_text

    return shakespeare_text()[:60_000]


@pytest.fixture(scope="module")
def trained(shakespeare) -> dict[str, BPETokenizer]:
    return {"byte-bpe": ByteLevelBPETokenizer.train([shakespeare], vocab_size=800),
            "bpe": BPETokenizer.train([shakespeare], vocab_size=600)}


def reference(tok: BPETokenizer, word: str) -> tuple[list[int], list[tuple[int, int]]]:
    """The readable rule: merge_once until no learned pair is left."""
    ids, spans = tok._symbols(word)
    apply_merges(ids, spans, tok.ranks)
    return ids, spans


class CountingRanks(dict):
    """The merge table, counting every lookup: the work of encoding, measured without a clock."""

    lookups = 0

    def get(self, key, default=None):
        self.lookups += 1
        return super().get(key, default)

    def __getitem__(self, key):
        self.lookups += 1
        return super().__getitem__(key)

    def __contains__(self, key):
        self.lookups += 1
        return super().__contains__(key)


@pytest.mark.parametrize("kind", ["byte-bpe", "bpe"])
@settings(max_examples=300, deadline=None)
@given(word=st.text(alphabet=st.sampled_from(LETTERS + "ée'"), max_size=300))
def test_fast_merges_equal_merge_once_on_random_words(trained, kind, word):
    tok = trained[kind]
    ids, spans = tok._symbols(word)
    assert merge_word_fast(ids, spans, tok.ranks) == reference(tok, word)


@pytest.mark.parametrize("kind", ["byte-bpe", "bpe"])
def test_fast_merges_equal_merge_once_on_every_word_of_real_text(trained, shakespeare, kind):
    tok = trained[kind]
    words = set(tok.pattern.findall(shakespeare)) | {w.replace(" ", "") for w in shakespeare.split("\n\n")[:200]}
    for word in sorted(words):
        ids, spans = tok._symbols(word)
        assert merge_word_fast(ids, spans, tok.ranks) == reference(tok, word), word


def test_a_long_word_costs_n_log_n_lookups_not_n_squared(trained):
    tok = trained["byte-bpe"]
    word = "".join(random.Random(0).choices(LETTERS, k=20_000))
    expected = reference(tok, word)[0]
    tok.ranks = CountingRanks(tok.ranks)
    assert tok.encode_ordinary(word) == tok.encode(word).ids == expected
    # Per symbol: a lookup for its first pair, and at most three for each key popped or pushed (each merge pushes
    # two): under 10 per symbol, where merge_once rescans the word once per merge learned (hundreds of times).
    assert tok.ranks.lookups <= 2 * 10 * len(word), tok.ranks.lookups


def test_long_words_are_encoded_but_not_cached(trained):
    tok = trained["byte-bpe"]
    long_word, short_word = "x" * 1000, "hello"
    assert tok.encode_ordinary(f"{short_word} {long_word}") == reference(tok, short_word)[0] + \
        reference(tok, " " + long_word)[0]
    assert short_word in tok._cache and " " + long_word not in tok._cache


def test_long_words_equal_huggingface_tokenizers(trained, shakespeare):
    from tokenizers import Tokenizer

    tok = trained["byte-bpe"]
    hf = Tokenizer.from_str(json.dumps(to_huggingface(tok)))
    g = random.Random(1)
    words = ["".join(g.choices(LETTERS + "ab", k=n)) for n in (SHORT_WORD + 1, 50, 300, 2000, 20_000)]
    words += [shakespeare[i:i + 3000].replace(" ", "").replace("\n", "") for i in (0, 30_000)] + ["a" * 5000]
    for word in words:
        assert tok.encode_ordinary(word) == hf.encode(word, add_special_tokens=False).ids


@pytest.mark.slow
def test_smollm2_long_words_equal_the_reference_and_huggingface(shakespeare):
    from tokenizers import Tokenizer

    from lmforge.data.sources import smollm2_path
    from lmforge.interop.gguf import gguf_tokenizer, read_gguf

    tok = gguf_tokenizer(read_gguf(smollm2_path()))
    hf = Tokenizer.from_str(json.dumps(to_huggingface(tok)))
    g = random.Random(2)
    spans = ((0, 100), (1000, 3000), (9000, 10_000))
    words = ["".join(c for c in shakespeare[i:i + n] if c.isalpha()) for i, n in spans]
    words += ["".join(g.choices("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ", k=5000)), "a" * 4001,
              "ab" * 999 + "c", "日本語" * 300, "😀🤗" * 300]
    for word in words:  # each one word of GPT-2's split
        assert tok.pattern.findall(word) == [word]
        assert tok.encode_ordinary(word) == reference(tok, word)[0] == hf.encode(word, add_special_tokens=False).ids
