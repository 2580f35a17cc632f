"""Byte-level BPE (GPT-2): table, round trip, and parity with Hugging Face `tokenizers` on real text."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lmforge.tokenizers import ByteLevelBPETokenizer, load_tokenizer, to_huggingface
from lmforge.tokenizers.byte_bpe import BYTE_TO_CHAR, from_visible, to_visible
from lmforge.tokenizers.pretokenize import compile_pattern

HARD = "héllo wörld 中文 🤗 naïve\x00\t\r\n  x's DON'T 12345 ``quotes'' \u200b\ufeff end  "


@pytest.fixture(scope="module")
def shakespeare() -> str:
    from lmforge.data.sources import shakespeare_text

    return shakespeare_text()[:300_000]


@pytest.fixture(scope="module")
def small() -> ByteLevelBPETokenizer:
    return ByteLevelBPETokenizer.train(["the cat sat on the mat. The hat! " * 20, "éé 中中"], vocab_size=300)


def test_byte_table_is_gpt2s():
    assert len(set(BYTE_TO_CHAR.values())) == 256
    assert BYTE_TO_CHAR[ord(" ")] == "Ġ" and BYTE_TO_CHAR[ord("\n")] == "Ċ" and BYTE_TO_CHAR[ord("A")] == "A"
    assert from_visible(to_visible(HARD)) == HARD


@settings(max_examples=150, deadline=None)
@given(st.text(max_size=60))
def test_decode_encode_round_trip_on_any_string(small, s):
    assert small.decode(small.encode(s).ids) == s
    assert small.encode_ordinary(s) == small.encode(s).ids


def test_gpt2_and_gpt4_patterns():
    assert compile_pattern("gpt2").findall("I'm  here 1234!") == ["I", "'m", " ", " here", " 1234", "!"]
    assert compile_pattern("gpt4").findall("I'M  here 1234!") == ["I", "'M", " ", " here", " ", "123", "4", "!"]


def test_offsets_cover_whole_characters(small):
    enc = small.encode("a中é")
    assert all(0 <= s < e <= 3 for s, e in enc.offsets)
    assert enc.offsets[0] == (0, 1) and enc.offsets[-1][1] == 3


def test_special_tokens_never_split_and_only_when_allowed(small):
    text = "cat<|endoftext|>hat"
    eot = small.vocab["<|endoftext|>"]
    assert eot not in small.encode(text).ids
    allowed = small.encode(text, allowed_special="all")
    assert allowed.ids.count(eot) == 1 and allowed.special_tokens_mask[allowed.ids.index(eot)] == 1
    assert small.decode(allowed.ids) == text
    assert small.decode(allowed.ids, skip_special_tokens=True) == "cathat"
    assert small.bos_id == small.eos_id == eot


@pytest.mark.slow
def test_training_learns_exactly_huggingface_merges(shakespeare):
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    ours = ByteLevelBPETokenizer.train([shakespeare], vocab_size=1200)
    hf = Tokenizer(models.BPE())
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(vocab_size=1200, min_frequency=2, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=["<|endoftext|>"])
    hf.train_from_iterator([shakespeare], trainer)
    model = json.loads(hf.to_str())["model"]
    assert [tuple(m) for m in model["merges"]] == ours.merges
    assert model["vocab"] == ours.vocab


@pytest.mark.slow
@pytest.mark.parametrize("pattern", ["gpt2", "gpt4"])
def test_encoding_identical_to_huggingface(shakespeare, pattern, tmp_path):
    from tokenizers import Tokenizer

    tok = ByteLevelBPETokenizer.train([shakespeare[:150_000]], vocab_size=1000, pattern=pattern)
    hf = Tokenizer.from_str(json.dumps(to_huggingface(tok)))
    text = shakespeare[150_000:] + HARD
    ours, theirs = tok.encode(text), hf.encode(text)
    assert ours.ids == theirs.ids and ours.tokens == theirs.tokens and ours.offsets == theirs.offsets
    assert hf.decode(theirs.ids) == tok.decode(ours.ids) == text
    # A Hugging Face file loads back into the same tokenizer.
    (tmp_path / "tokenizer.json").write_text(hf.to_str())
    back = load_tokenizer(tmp_path)
    assert isinstance(back, ByteLevelBPETokenizer) and back.pattern_name == pattern
    assert back.encode(text).ids == ours.ids


@pytest.mark.slow
def test_encode_batch_in_processes_equals_serial(shakespeare):
    tok = ByteLevelBPETokenizer.train([shakespeare[:50_000]], vocab_size=500)
    lines = shakespeare.splitlines()[:400]
    assert tok.encode_batch(lines, workers=2) == tok.encode_batch(lines)
    assert tok.encode_ordinary_batch(lines, workers=2) == [tok.encode_ordinary(line) for line in lines]


@pytest.mark.slow
def test_gpt4_pattern_splits_like_tiktoken_cl100k(shakespeare):
    import regex

    # cl100k_base's pattern as tiktoken 0.14 ships it (possessive form of the same expression).
    tiktoken_cl100k = (r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+"""
                       r"""|\s++$|\s*[\r\n]|\s+(?!\S)|\s""")
    text = shakespeare[:100_000] + HARD + "\n\n  \r\n 2024-11-22 x  "
    assert compile_pattern("gpt4").findall(text) == regex.findall(tiktoken_cl100k, text)


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=40))
def test_gpt_patterns_tile_every_text_so_offsets_are_running_sums(s):
    # The encoder's fast path relies on this: every character belongs to exactly one word.
    for name in ("gpt2", "gpt4"):
        assert "".join(compile_pattern(name).findall(s)) == s


@settings(max_examples=100, deadline=None)
@given(st.text(alphabet=st.sampled_from("ab é中🤗 \n'1"), max_size=30))
def test_offsets_cover_the_text_in_order(small, s):
    enc = small.encode(s)
    assert enc.offsets == sorted(enc.offsets)
    assert all(0 <= a <= b <= len(s) for a, b in enc.offsets)
    # Tokens inside one character share its span; otherwise the spans tile the text.
    assert "".join(s[a:b] for i, (a, b) in enumerate(enc.offsets) if i == 0 or (a, b) != enc.offsets[i - 1]) == s
