"""Sennrich BPE and the shared trainer: the seed's toy corpus by hand, incremental = naive, HF export."""

from __future__ import annotations

import json
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lmforge.tokenizers import BPETokenizer, load_tokenizer, to_huggingface
from lmforge.tokenizers.train import learn_merges, merge_word, pair_counts, split_points

TOY = "abbc abb abc abb"


@pytest.fixture(scope="module")
def shakespeare() -> str:
    from lmforge.data.sources import shakespeare_text

    return shakespeare_text()[:300_000]


def test_toy_corpus_reproduces_the_seed_by_hand():
    # Words: abbc x1, abb x2, abc x1, each ending with the end-of-word symbol (seed: '\w').
    # Pair counts weighted by word frequency:
    #   (a,b)=1+2+1=4  (b,b)=1+2=3  (b,c)=1+1=2  (c,\w)=1+1=2  (b,\w)=2      -> merge (a,b) = A
    #   (A,b)=1+2=3  (A,c)=1  (b,c)=1  (c,\w)=2  (b,\w)=2                    -> merge (A,b) = B
    #   (B,c)=1  (B,\w)=2  (c,\w)=2  (A,c)=1   tie at 2: smaller ids win, c (alphabet) is older
    #   than B (merged)                                                       -> merge (c,\w) = C
    #   (B,C)=1  (B,\w)=2  (A,C)=1                                            -> merge (B,\w) = D
    #   (B,C)=1  (A,C)=1: no pair occurs more than once: stop.
    tok = BPETokenizer.train([TOY], vocab_size=1000, special_tokens=[], end_of_word="\\w")
    assert tok.merges == [("a", "b"), ("ab", "b"), ("c", "\\w"), ("abb", "\\w")]
    assert tok.id_to_token == ["a", "b", "c", "\\w", "ab", "abb", "c\\w", "abb\\w"]
    # Final segmentation: abbc = B C, abb = D, abc = A C.
    assert [tok.encode(w).tokens for w in TOY.split()] == [
        ["abb", "c\\w"], ["abb\\w"], ["ab", "c\\w"], ["abb\\w"]]
    assert tok.decode(tok.encode(TOY).ids) == TOY


def test_vocab_size_and_min_frequency_stop_training():
    assert BPETokenizer.train([TOY], vocab_size=6, special_tokens=[]).merges == [("a", "b"), ("ab", "b")]
    assert BPETokenizer.train([TOY], vocab_size=99, min_frequency=3, special_tokens=[]).merges == [
        ("a", "b"), ("ab", "b")]
    assert len(BPETokenizer.train([TOY], vocab_size=99, min_frequency=1, special_tokens=[]).merges) > 4


def test_pair_counts_and_merge_word_docstring_examples():
    assert pair_counts([[1, 2, 3, 1, 2]], [2]) == {(1, 2): 4, (2, 3): 2, (3, 1): 2}
    word, delta = [7, 7, 7, 7], {}
    assert merge_word(word, 7, 7, 9, 1, delta) == 2 and word == [9, 9]
    # (7,7) occurred 3 times and now never; (9,9) once.
    assert {p: d for p, d in delta.items() if d} == {(7, 7): -3, (9, 9): 1}


def naive_learn(words, freqs, tokens, vocab_size, min_frequency):
    """Reference trainer: full recount every merge, same tie-break (max count, then smallest ids)."""
    words = [list(w) for w in words]
    vocab = {t: i for i, t in enumerate(tokens)}
    merges = []
    while len(tokens) < vocab_size:
        counts = pair_counts(words, freqs)
        if not counts:
            break
        (a, b), c = min(counts.items(), key=lambda kv: (-kv[1], kv[0]))
        if c < min_frequency:
            break
        text = tokens[a] + tokens[b]
        if text not in vocab:
            vocab[text] = len(tokens)
            tokens.append(text)
        new = vocab[text]
        merges.append((a, b, new))
        for w in words:
            merge_word(w, a, b, new, 1, {})
    return merges


@settings(max_examples=60, deadline=None)
@given(st.lists(st.text(alphabet="abcd", min_size=1, max_size=9), min_size=1, max_size=30),
       st.integers(1, 3))
def test_incremental_trainer_equals_full_recount(corpus, min_frequency):
    counts = {}
    for w in corpus:
        counts[w] = counts.get(w, 0) + 1
    alphabet = sorted(set("".join(counts)))
    ids = {c: i for i, c in enumerate(alphabet)}
    words = [[ids[c] for c in w] for w in counts]
    freqs = list(counts.values())
    expected = naive_learn(words, freqs, list(alphabet), 40, min_frequency)
    got = learn_merges([list(w) for w in words], freqs, list(alphabet), 40, min_frequency)
    assert got == expected


def test_split_points_never_change_the_word_counts():
    from lmforge.tokenizers.pretokenize import GPT2_PATTERN

    rng = random.Random(0)
    text = "".join(rng.choice(["a", "b ", "\n", "\n\n", " ", "x\ny", "'s", "1"]) for _ in range(5000))
    chunks = split_points(text, size=97)
    assert "".join(chunks) == text and len(chunks) > 5
    assert [w for c in chunks for w in GPT2_PATTERN.findall(c)] == GPT2_PATTERN.findall(text)


def test_offsets_point_into_the_text_and_word_ids_count_words():
    tok = BPETokenizer.train(["low, lower, lowest, newer, wider"] * 3, vocab_size=60)
    text = "lower,  newest"
    enc = tok.encode(text)
    glued = "".join(text[s:e] for s, e in enc.offsets)
    assert glued == "lower,newest"
    assert enc.word_ids[0] == 0 and enc.word_ids[-1] == 2
    assert tok.decode(enc.ids) == "lower , newest"


def test_unknown_characters_become_unk():
    tok = BPETokenizer.train([TOY], vocab_size=100)
    enc = tok.encode("abz")
    assert "<unk>" in enc.tokens and tok.unk_id in enc.ids


@pytest.mark.slow
def test_huggingface_export_segments_real_text_identically(shakespeare, tmp_path):
    from tokenizers import Tokenizer as HFTokenizer

    tok = BPETokenizer.train([shakespeare[:200_000]], vocab_size=1500)
    hf = HFTokenizer.from_str(json.dumps(to_huggingface(tok)))
    text = shakespeare[200_000:300_000]
    ours = tok.encode(text).tokens
    glued = []  # Hugging Face glues </w> to the last character: compare in that form
    for t in ours:
        if t == "</w>":
            glued[-1] += t
        else:
            glued.append(t)
    theirs = hf.encode(text)
    assert glued == theirs.tokens
    assert hf.decode(theirs.ids) == tok.decode(tok.encode(text).ids)
    # And back: Hugging Face's (glued) form loads as a tokenizer that reproduces it.
    path = tmp_path / "tokenizer.json"
    path.write_text(hf.to_str())
    back = load_tokenizer(path)
    assert back.glued and back.encode(text).tokens == theirs.tokens


def test_toy_example_prints_the_seed_steps():
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "examples" / "bpe_toy.py"
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, check=True).stdout
    assert "merge (a,b) = 4 -> A" in out and "merge (B,\\w) = 2 -> D" in out
    assert "no pair occurs more than once: stop" in out


@pytest.mark.slow
@pytest.mark.parametrize("pre", ["Whitespace", "WhitespaceSplit", "BertPreTokenizer"])
def test_huggingface_trained_bpe_with_suffix_imports_exactly(shakespeare, pre):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    from lmforge.tokenizers import from_huggingface

    hf = Tokenizer(models.BPE(end_of_word_suffix="</w>"))  # no unk token: unknown characters vanish
    hf.pre_tokenizer = getattr(pre_tokenizers, pre)()
    hf.decoder = decoders.BPEDecoder(suffix="</w>")
    hf.train_from_iterator([shakespeare[:150_000]], trainers.BpeTrainer(
        vocab_size=800, end_of_word_suffix="</w>", show_progress=False))
    ours = from_huggingface(json.loads(hf.to_str()))
    text = shakespeare[150_000:200_000] + " Zürich ☃ don't"
    assert ours.encode(text).tokens == hf.encode(text).tokens
    assert ours.decode(ours.encode(text).ids) == hf.decode(hf.encode(text).ids)
