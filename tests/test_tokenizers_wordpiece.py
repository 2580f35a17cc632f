"""WordPiece (BERT): ids identical to transformers' BertTokenizerFast with all-MiniLM-L6-v2's vocab.txt."""

from __future__ import annotations

from collections import Counter
from itertools import pairwise

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lmforge.tokenizers import WordPieceTokenizer, load_tokenizer
from lmforge.tokenizers.normalize import BertNormalizer
from lmforge.tokenizers.train import learn_merges, merge_word

TRICKY = [
    "Héllo Wörld! Ça va? Ångström naïve café",
    "中文字符测试，日本語のテキスト。한국어",
    "emoji 🤗🚀 and ZWJ 👩‍👩‍👧 family",
    "control\x00chars\x07here\x1f and\ttabs\r\nnewline\x0b\x0cff \x85 \u200b zero-width \ufeff bom",
    "İstanbul ΣΊΣΥΦΟΣ straße ﬁ ligature Ⅻ",
    "don't stop-believing... (1,000.50$) [brackets] {x} <tag> @user #hash",
    "a" * 101 + " short " + "b" * 100,
]


@pytest.fixture(scope="module")
def minilm():
    from lmforge.data.sources import minilm_path

    return minilm_path()


@pytest.fixture(scope="module")
def ours(minilm):
    return load_tokenizer(minilm / "vocab.txt")


@pytest.fixture(scope="module")
def hf(minilm):
    from transformers import BertTokenizerFast

    return BertTokenizerFast.from_pretrained(str(minilm))


def test_reference_examples(ours):
    assert ours.encode("Hello world").ids == [101, 7592, 2088, 102]
    assert ours.encode("Unbelievably, tokenization works!").tokens[1:-1] == [
        "un", "##bel", "##ie", "##va", "##bly", ",", "token", "##ization", "works", "!"]
    assert (ours.cls_id, ours.sep_id, ours.pad_id, ours.unk_id, ours.mask_id) == (101, 102, 0, 100, 103)
    assert ours.vocab_size == 30522


def test_normalizer_keeps_offsets_into_the_original():
    text, index = BertNormalizer()("Ça 中!")
    assert text == "ca  中 !" and index == [0, 1, 2, 3, 3, 3, 4]


def test_words_over_100_characters_are_unk(ours):
    assert ours.encode("a" * 101, add_special_tokens=False).tokens == ["[UNK]"]
    assert ours.encode("a" * 100, add_special_tokens=False).tokens != ["[UNK]"]


def test_offsets_and_word_ids(ours):
    text = "Héllo, WORLD"
    enc = ours.encode(text)
    assert enc.tokens == ["[CLS]", "hello", ",", "world", "[SEP]"]
    assert enc.offsets == [(0, 0), (0, 5), (5, 6), (7, 12), (0, 0)]
    assert enc.word_ids == [None, 0, 1, 2, None]


@pytest.mark.slow
def test_ids_identical_to_transformers_on_shakespeare(ours, hf):
    from lmforge.data.sources import shakespeare_text

    lines = shakespeare_text()[:200_000].splitlines()
    assert [e.ids for e in ours.encode_batch(lines)] == hf(lines)["input_ids"]
    joined = "\n".join(lines)
    assert ours.encode(joined).ids == hf(joined)["input_ids"]


@pytest.mark.slow
@pytest.mark.parametrize("text", TRICKY)
def test_ids_tokens_and_decode_identical_on_tricky_text(ours, hf, text):
    enc = ours.encode(text)
    assert enc.ids == hf(text)["input_ids"]
    assert enc.tokens == hf.convert_ids_to_tokens(enc.ids)
    assert ours.decode(enc.ids, skip_special_tokens=True) == hf.decode(enc.ids, skip_special_tokens=True)


@pytest.mark.slow
def test_special_tokens_in_text_match_transformers_and_can_be_plain_text(ours, hf):
    text = "[CLS] stays plain[MASK]text [SEP][PAD]"
    assert ours.encode(text).ids == hf(text)["input_ids"]  # a vocab.txt tokenizer splits them out, as BERT's
    assert ours.encode(text, allowed_special="all").ids == hf(text)["input_ids"]
    plain = ours.encode(text, allow_special=False).ids  # --no-allow-special: ordinary text, never special ids
    assert not set(plain[1:-1]) & ours.special_ids


@pytest.mark.slow
@pytest.mark.parametrize("max_length", [6, 9, 12, 40])
def test_pairs_with_longest_first_truncation_match_transformers(ours, hf, max_length):
    a, b = "The quick brown fox jumps over the lazy dog", "A short one."
    enc = ours.encode_pair(a, b, max_length=max_length)
    ref = hf(a, b, truncation="longest_first", max_length=max_length)
    assert enc.ids == ref["input_ids"] and enc.type_ids == ref["token_type_ids"]


@pytest.mark.slow
def test_batch_padding_matches_transformers(ours, hf):
    texts = ["Hello world", "A much longer sentence, with commas."]
    encs = ours.encode_batch(texts, padding=True)
    ref = hf(texts, padding=True)
    assert [e.ids for e in encs] == ref["input_ids"]
    assert [e.attention_mask for e in encs] == ref["attention_mask"]


def test_trainer_uses_the_wordpiece_score_not_frequency():
    # Symbols a ##b (pair 4 times, a and ##b 4 times each: 4/16) and x ##y (once, 1/1).
    # BPE would merge (a, ##b); WordPiece merges (x, ##y) first.
    tok = WordPieceTokenizer.train(["ab ab ab ab xy"], vocab_size=5 + 4 + 1, min_frequency=1)
    assert tok.id_to_token[-1] == "xy"
    tok = WordPieceTokenizer.train(["ab ab ab ab xy"], vocab_size=5 + 4 + 2, min_frequency=1)
    assert tok.id_to_token[-2:] == ["xy", "ab"]
    assert tok.encode("ab xy a", add_special_tokens=False).tokens == ["ab", "xy", "a"]


def naive_wordpiece(words, freqs, tokens, vocab_size):
    words = [list(w) for w in words]
    vocab = {t: i for i, t in enumerate(tokens)}
    while len(tokens) < vocab_size:
        pairs, symbols = Counter(), Counter()
        for w, f in zip(words, freqs, strict=True):
            for s in w:
                symbols[s] += f
            for p in pairwise(w):
                pairs[p] += f
        if not pairs:
            break
        (a, b), _ = min(pairs.items(), key=lambda kv: (-kv[1] / (symbols[kv[0][0]] * symbols[kv[0][1]]), kv[0]))
        text = tokens[a] + tokens[b][2:]
        if text not in vocab:
            vocab[text] = len(tokens)
            tokens.append(text)
        for w in words:
            merge_word(w, a, b, vocab[text], 1, {})
    return tokens


@settings(max_examples=50, deadline=None)
@given(st.lists(st.text(alphabet="abc", min_size=1, max_size=8), min_size=1, max_size=25))
def test_incremental_wordpiece_trainer_equals_full_recount(corpus):
    counts = Counter(corpus)
    alphabet = sorted({w[0] for w in counts} | {"##" + c for w in counts for c in w[1:]})
    ids = {t: i for i, t in enumerate(alphabet)}
    words = [[ids[w[0]], *(ids["##" + c] for c in w[1:])] for w in counts]
    freqs = list(counts.values())
    expected = naive_wordpiece(words, freqs, list(alphabet), 30)
    got = list(alphabet)
    learn_merges([list(w) for w in words], freqs, got, 30, 1, join=lambda a, b: a + b[2:], wordpiece=True)
    assert got == expected


@pytest.mark.slow
def test_trained_wordpiece_round_trips_through_huggingface(tmp_path):
    import json

    from tokenizers import Tokenizer

    from lmforge.data.sources import shakespeare_text
    from lmforge.tokenizers import to_huggingface

    text = shakespeare_text()[:200_000]
    tok = WordPieceTokenizer.train([text], vocab_size=1500)
    hf = Tokenizer.from_str(json.dumps(to_huggingface(tok)))
    sample = text[:20_000] + " ".join(TRICKY)
    assert tok.encode(sample).ids == hf.encode(sample).ids
    tok.save(tmp_path)
    assert (tmp_path / "vocab.txt").read_text().splitlines() == tok.id_to_token
    assert load_tokenizer(tmp_path).encode(sample).ids == tok.encode(sample).ids


# Scripts and symbols whose Unicode properties are the same in Python's tables and in the older
# ones Hugging Face's Rust crate uses (about 500 rarer code points differ: see docs/tokenizers.md).
STABLE_CHARS = st.one_of([st.characters(min_codepoint=lo, max_codepoint=hi) for lo, hi in [
    (0x0, 0x24F), (0x300, 0x36F), (0x370, 0x3FF), (0x400, 0x4FF), (0x2000, 0x2064), (0x3000, 0x303F),
    (0x4E00, 0x9FA5), (0xAC00, 0xD7A3), (0xFF00, 0xFFEF), (0x1F300, 0x1F64F)]])


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=STABLE_CHARS, max_size=40))
def test_ids_identical_to_transformers_on_random_text(ours, hf, s):
    assert ours.encode(s, allowed_special="all").ids == hf(s)["input_ids"]  # HF always matches them


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=st.sampled_from("aBc ÉéñÑ中文 ,.!\x00\x07\t\u0301\u200bİß🤗"), max_size=30))
def test_offsets_map_back_into_the_original_text(ours, s):
    enc = ours.encode(s, add_special_tokens=False)
    assert enc.offsets == sorted(enc.offsets)
    for token, (a, b) in zip(enc.tokens, enc.offsets, strict=True):
        assert 0 <= a < b <= len(s)
        if token != "[UNK]":
            assert token.removeprefix("##") in ours.normalizer(s[a:b])[0]
