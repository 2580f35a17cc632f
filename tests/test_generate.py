"""Generation: KV cache == recomputation, parity with transformers, padding, sampling filters, beam search."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from lmforge.errors import LmforgeError
from lmforge.generation import generate, next_token, pad_prompts, stream, top_k_filter, top_p_filter
from lmforge.models import Decoder, get_preset
from lmforge.models.outputs import ModelOutput
from lmforge.models.seq2seq import Seq2Seq


@pytest.fixture(autouse=True, scope="module")
def _one_thread(single_thread):
    """Every test here runs on one torch thread (the shared fixture in conftest.py)."""


def sharpen(model: nn.Module, seed: int, std: float = 0.15) -> nn.Module:
    """Random weights large enough that the next-token distribution is far from uniform (no near-ties)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() > 1:
                p.copy_(torch.randn(p.shape, generator=g) * std)
            elif "norm" not in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.02)
    return model.eval()


@pytest.fixture(scope="module")
def gpt() -> Decoder:
    return sharpen(Decoder(get_preset("gpt-tiny", dropout=0.0, attention_dropout=0.0, vocab_size=300)), 0)


@pytest.fixture(scope="module")
def s2s() -> Seq2Seq:
    return sharpen(Seq2Seq(get_preset("seq2seq-tiny", dropout=0.0, vocab_size=300)), 1, std=0.2)


# -- KV cache ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["decoder", "seq2seq"])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_cache_equals_recomputation(kind: str, temperature: float, gpt: Decoder, s2s: Seq2Seq) -> None:
    model = gpt if kind == "decoder" else s2s
    ids = torch.tensor([[5, 17, 42, 7, 99], [3, 1, 4, 1, 5]])
    options = dict(max_new_tokens=20, stop_ids=[], output_logits=True, temperature=temperature, seed=0)
    cached = generate(model, ids, **options)
    plain = generate(model, ids, use_cache=False, **options)
    assert cached.tokens.tolist() == plain.tokens.tolist()
    assert cached.tokens.shape == (2, 20)
    torch.testing.assert_close(cached.logits, plain.logits, atol=1e-5, rtol=0)
    if temperature:  # sampled: a varied prefix, so every cached position is exercised with different keys
        assert len(set(cached.tokens[0].tolist())) > 5


@pytest.mark.parametrize("kind", ["decoder", "seq2seq"])
def test_cache_equals_recomputation_left_padded(kind: str, gpt: Decoder, s2s: Seq2Seq) -> None:
    model = gpt if kind == "decoder" else s2s
    ids, mask = pad_prompts([[5, 17, 42, 7, 99], [3, 1]], pad_id=0)
    cached = generate(model, ids, mask, max_new_tokens=12, stop_ids=[], output_logits=True)
    plain = generate(model, ids, mask, max_new_tokens=12, stop_ids=[], output_logits=True, use_cache=False)
    assert cached.tokens.tolist() == plain.tokens.tolist()
    torch.testing.assert_close(cached.logits, plain.logits, atol=1e-5, rtol=0)


# -- parity with transformers ----------------------------------------------------------------------
def hf_gpt2_and_ours(seed: int = 0):
    """A random-weight transformers GPT-2 and the same weights in our Decoder (through lmforge.interop)."""
    transformers = pytest.importorskip("transformers")
    from lmforge.interop.gpt2 import config_from_hf, weights_from_hf
    from lmforge.models.registry import load_weights

    config = transformers.GPT2Config(vocab_size=300, n_positions=128, n_embd=64, n_layer=2, n_head=4, n_inner=256,
                                     activation_function="gelu_new", resid_pdrop=0.0, embd_pdrop=0.0,
                                     attn_pdrop=0.0, initializer_range=0.15, bos_token_id=299, eos_token_id=299)
    torch.manual_seed(seed)
    hf = transformers.GPT2LMHeadModel(config).eval()
    ours = Decoder(config_from_hf(config.to_dict(), "test")).eval()
    tensors, unused = weights_from_hf(hf.state_dict(), config.n_layer, True, "test")
    assert not unused
    load_weights(ours, tensors, "test")
    return hf, ours


def test_greedy_matches_transformers() -> None:
    hf, ours = hf_gpt2_and_ours()
    ids = torch.tensor([[11, 22, 33, 44, 55, 66]])
    with torch.no_grad():
        expected = hf.generate(ids, max_new_tokens=30, do_sample=False, pad_token_id=0)[:, ids.shape[1]:]
    got = generate(ours, ids, max_new_tokens=30)
    assert got.tokens.tolist() == expected.tolist()


def test_beam_search_matches_transformers() -> None:
    hf, ours = hf_gpt2_and_ours(seed=1)
    ids = torch.tensor([[7, 8, 9, 10]])
    with torch.no_grad():
        expected = hf.generate(ids, max_new_tokens=12, do_sample=False, num_beams=3, pad_token_id=0,
                               eos_token_id=None, length_penalty=1.0)[:, ids.shape[1]:]
    got = generate(ours, ids, max_new_tokens=12, beams=3, stop_ids=[])
    assert got.tokens.tolist() == expected.tolist()


# -- batches with left padding ----------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["decoder", "seq2seq"])
@pytest.mark.parametrize("beams", [1, 3])
def test_left_padded_batch_equals_each_prompt_alone(kind: str, beams: int, gpt: Decoder, s2s: Seq2Seq) -> None:
    model = gpt if kind == "decoder" else s2s
    prompts = [[5, 17, 42], [8, 1, 2, 3, 4, 9, 10], [77], [120, 121, 122, 123, 124]]
    ids, mask = pad_prompts(prompts, pad_id=0)
    batch = generate(model, ids, mask, max_new_tokens=10, beams=beams, stop_ids=[]).to_lists()
    alone = [generate(model, torch.tensor([p]), max_new_tokens=10, beams=beams, stop_ids=[]).to_lists()[0]
             for p in prompts]
    assert batch == alone
    if beams > 1:  # beam search reorders the cache every step: the uncached path must agree
        plain = generate(model, ids, mask, max_new_tokens=10, beams=beams, stop_ids=[], use_cache=False)
        assert plain.to_lists() == batch


def test_seq2seq_source_padding_side_does_not_matter(s2s: Seq2Seq) -> None:
    left, left_mask = pad_prompts([[5, 17, 42], [8, 1, 2, 3, 4]], pad_id=0)
    right = torch.tensor([[5, 17, 42, 0, 0], [8, 1, 2, 3, 4]])
    right_mask = (torch.arange(5) < torch.tensor([[3], [5]])).long()
    a = generate(s2s, left, left_mask, max_new_tokens=8, stop_ids=[]).tokens
    b = generate(s2s, right, right_mask, max_new_tokens=8, stop_ids=[]).tokens
    assert a.tolist() == b.tolist()


def test_pad_prompts() -> None:
    ids, mask = pad_prompts([[5, 6, 7], [8]], pad_id=9)
    assert ids.tolist() == [[5, 6, 7], [9, 9, 8]]
    assert mask.tolist() == [[1, 1, 1], [0, 0, 1]]
    with pytest.raises(LmforgeError, match="prompt"):
        pad_prompts([[1], []])


# -- sampling ---------------------------------------------------------------------------------------
def test_top_p_keeps_smallest_set_with_mass_at_least_p() -> None:
    probs = torch.tensor([[0.05, 0.5, 0.15, 0.3]])  # sorted: 0.5, 0.3, 0.15, 0.05
    logits = probs.log()
    kept = {p: top_p_filter(logits, p).isfinite()[0].tolist() for p in (0.3, 0.5, 0.75, 0.85, 0.97, 1.0)}
    assert kept[0.3] == [False, True, False, False]  # the top token alone already has 0.5 >= 0.3
    assert kept[0.5] == [False, True, False, False]
    assert kept[0.75] == [False, True, False, True]  # 0.5 + 0.3 = 0.8 >= 0.75
    assert kept[0.85] == [False, True, True, True]  # 0.95 >= 0.85
    assert kept[0.97] == [True, True, True, True]
    assert kept[1.0] == [True, True, True, True]
    filtered = top_p_filter(logits, 0.75).softmax(-1)[0]  # renormalised over what is left
    torch.testing.assert_close(filtered, torch.tensor([0.0, 0.5 / 0.8, 0.0, 0.3 / 0.8]))


def test_top_k_filter() -> None:
    z = torch.tensor([[1.0, 3.0, 2.0, 0.0], [0.0, -1.0, 5.0, 4.0]])
    assert top_k_filter(z, 2).isfinite().tolist() == [[False, True, True, False], [False, False, True, True]]
    assert torch.equal(top_k_filter(z, 10), z)


def test_top_k_one_equals_greedy(gpt: Decoder) -> None:
    ids = torch.tensor([[5, 17, 42], [1, 2, 3]])
    greedy = generate(gpt, ids, max_new_tokens=15, stop_ids=[])
    sampled = generate(gpt, ids, max_new_tokens=15, stop_ids=[], temperature=1.5, top_k=1, seed=3)
    assert sampled.tokens.tolist() == greedy.tokens.tolist()


def test_temperature_to_zero_is_greedy(gpt: Decoder) -> None:
    ids = torch.tensor([[5, 17, 42]])
    greedy = generate(gpt, ids, max_new_tokens=15, stop_ids=[])
    cold = generate(gpt, ids, max_new_tokens=15, stop_ids=[], temperature=1e-4, seed=0)
    assert cold.tokens.tolist() == greedy.tokens.tolist()
    z = torch.tensor([[0.0, 1.0, 0.999]])  # very close runners-up: still argmax once T is small enough
    picks = {next_token(z, 1e-5, generator=torch.Generator().manual_seed(s)).item() for s in range(20)}
    assert picks == {1}


def test_stream_leaves_no_inference_mode_behind(gpt: Decoder) -> None:
    for _ in stream(gpt, torch.tensor([[1, 2, 3]]), max_new_tokens=2):
        assert not torch.is_inference_mode_enabled()


def test_same_seed_same_sample(gpt: Decoder) -> None:
    ids = torch.tensor([[5, 17, 42]])
    runs = [generate(gpt, ids, max_new_tokens=20, temperature=1.0, top_p=0.95, seed=s).tokens.tolist()
            for s in (7, 7, 8)]
    assert runs[0] == runs[1]
    assert runs[0] != runs[2]


def test_sampling_follows_the_distribution() -> None:
    probs = torch.tensor([0.6, 0.3, 0.1])
    logits = probs.log().expand(20000, 3)
    picks = next_token(logits, 1.0, generator=torch.Generator().manual_seed(0))
    freq = torch.bincount(picks, minlength=3).float() / 20000
    torch.testing.assert_close(freq, probs, atol=0.015, rtol=0)


def test_bad_options_raise_one_line_errors(gpt: Decoder) -> None:
    ids = torch.tensor([[1, 2]])
    for kwargs, field in [({"temperature": -1.0}, "temperature"), ({"top_k": 0, "temperature": 1.0}, "top_k"),
                          ({"top_p": 1.5, "temperature": 1.0}, "top_p"), ({"beams": 0}, "beams"),
                          ({"beams": 2, "temperature": 0.7}, "beams"), ({"max_new_tokens": 500}, "max_new_tokens"),
                          ({"temperature": 1.0, "seed": 2**70}, "seed"),
                          ({"temperature": float("nan")}, "temperature")]:
        with pytest.raises(LmforgeError, match=field):
            generate(gpt, ids, **kwargs)
    with pytest.raises(LmforgeError, match="input_ids"):
        generate(gpt, torch.tensor([1, 2, 3]))


# -- a toy model with fixed transition probabilities: p(next | last token) -----------------------
class Toy(nn.Module):
    """Decoder-shaped stand-in whose next-token distribution depends only on the last token."""

    def __init__(self, table: dict[int, dict[int, float]], vocab: int = 6, eos: int = 5) -> None:
        super().__init__()
        probs = torch.full((vocab, vocab), 1e-6)
        for src, row in table.items():
            for dst, p in row.items():
                probs[src, dst] = p
        self.register_buffer("log_probs", (probs / probs.sum(-1, keepdim=True)).log())
        self.config = type("Config", (), {"eos_id": eos, "pad_id": 0, "max_positions": 64})()

    def forward(self, input_ids, attention_mask=None, position_ids=None, caches=None) -> ModelOutput:
        return ModelOutput(logits=self.log_probs[input_ids])  # (B, T, V)

    def new_caches(self, batch, max_len, dtype=None, device=None) -> list:
        return []  # nothing to cache: the last token is all the toy looks at


START, A, B, C, D, EOS = range(6)


def test_beam_finds_the_better_sequence_greedy_misses() -> None:
    # greedy: A (0.6) then the best after A, 0.35: p = 0.21.   beam: B (0.4) then C (0.9): p = 0.36.
    toy = Toy({START: {A: 0.6, B: 0.4}, A: {C: 0.35, D: 0.35, EOS: 0.3}, B: {C: 0.9, D: 0.1}})
    ids = torch.tensor([[START]])
    assert generate(toy, ids, max_new_tokens=2, stop_ids=[]).to_lists() == [[A, C]]
    best = generate(toy, ids, max_new_tokens=2, stop_ids=[], beams=2)
    assert best.to_lists() == [[B, C]]
    assert best.scores.item() == pytest.approx(math.log(0.36) / 2, abs=1e-4)
    assert generate(toy, ids, max_new_tokens=2, stop_ids=[], beams=1).to_lists() == [[A, C]]


def test_beams_one_equals_greedy(gpt: Decoder, s2s: Seq2Seq) -> None:
    for model in (gpt, s2s):
        ids = torch.tensor([[5, 17, 42, 7]])
        greedy = generate(model, ids, max_new_tokens=15, stop_ids=[])
        assert generate(model, ids, max_new_tokens=15, stop_ids=[], beams=1).tokens.tolist() == greedy.tokens.tolist()
        assert beam_one(model, ids) == greedy.tokens.tolist()


def beam_one(model: nn.Module, ids: torch.Tensor) -> list[list[int]]:
    """The beam-search code path itself with K = 1 (beams=1 is routed to the greedy loop)."""
    from lmforge.generation.beam import beam_search
    from lmforge.generation.steps import make_steps

    with torch.inference_mode():
        seqs, _ = beam_search(make_steps(model, ids, None, 15), 1, 1, 15, [], 0)
    return seqs


def test_stop_tokens_stop() -> None:
    toy = Toy({START: {A: 0.9}, A: {B: 0.9}, B: {EOS: 0.9}, C: {D: 0.9}, D: {C: 0.9}})
    ids, mask = pad_prompts([[START], [C]], pad_id=0)
    out = generate(toy, ids, mask, max_new_tokens=6)  # stop_ids default: config.eos_id
    assert out.to_lists() == [[A, B, EOS], [D, C, D, C, D, C]]
    assert out.tokens[0].tolist() == [A, B, EOS, 0, 0, 0]  # padded after the stop token
    assert out.lengths.tolist() == [3, 6]
    assert generate(toy, ids[:1], max_new_tokens=6).tokens.shape == (1, 3)  # everyone stopped: loop ends
    assert generate(toy, ids[:1], max_new_tokens=6, stop_ids=[B]).to_lists() == [[A, B]]
    assert [t.tolist() for t in stream(toy, ids[:1], max_new_tokens=6)] == [[A], [B], [EOS]]
    assert generate(toy, ids[:1], max_new_tokens=6, beams=2).to_lists() == [[A, B, EOS]]


def test_length_penalty_changes_the_choice() -> None:
    # short: [EOS] p = 0.4 (log -0.92, per token -0.92);  long: [A, B, EOS] p = 0.27 (log -1.31, per token -0.44)
    toy = Toy({START: {EOS: 0.4, A: 0.6}, A: {B: 0.5, C: 0.25, D: 0.25}, B: {EOS: 0.9}, C: {EOS: 0.9},
               D: {EOS: 0.9}})
    ids = torch.tensor([[START]])
    assert generate(toy, ids, max_new_tokens=5, beams=2, length_penalty=0.0).to_lists() == [[EOS]]
    assert generate(toy, ids, max_new_tokens=5, beams=2, length_penalty=1.0).to_lists() == [[A, B, EOS]]
    assert generate(toy, ids, max_new_tokens=5, beams=2, length_penalty=2.0).to_lists() == [[A, B, EOS]]


@pytest.mark.parametrize("compile", [False, True])
def test_repetition_penalty_matches_transformers(compile: bool) -> None:
    """transformers' repetition_penalty is the oracle: greedy tokens equal, eager and compiled, and the
    penalty changes them (it is not a no-op)."""
    hf, ours = hf_gpt2_and_ours(seed=2)
    ids = torch.tensor([[11, 22, 33, 11, 22, 33, 11, 22]])
    with torch.no_grad():
        expected = hf.generate(ids, max_new_tokens=25, do_sample=False, pad_token_id=0,
                               repetition_penalty=1.8)[:, ids.shape[1]:]
    got = generate(ours, ids, max_new_tokens=25, repetition_penalty=1.8, compile=compile)
    assert got.tokens.tolist() == expected.tolist()
    assert got.tokens.tolist() != generate(ours, ids, max_new_tokens=25).tokens.tolist()


def test_repetition_penalty_samples_the_same_eager_and_compiled(gpt: Decoder) -> None:
    ids = torch.tensor([[5, 6, 7, 5, 6, 7]])
    options = dict(max_new_tokens=12, temperature=0.9, top_k=20, seed=3, repetition_penalty=1.5)
    assert generate(gpt, ids, compile=True, **options).tokens.tolist() == generate(gpt, ids, **options).tokens.tolist()


def test_stop_strings_end_a_row_at_the_token_that_completes_them() -> None:
    """A stop string spanning two tokens ends the row at the second; other rows go on; text is cut after it."""
    from lmforge.generation.text import cut_at_stop

    class Chars:  # id i decodes to chr(97 + i % 26): every token one letter
        def decode(self, ids, skip_special_tokens=True):
            return "".join(chr(97 + i % 26) for i in ids)

    _, ours = hf_gpt2_and_ours(seed=3)
    ids = torch.tensor([[11, 22, 33], [44, 55, 66]])
    free = generate(ours, ids, max_new_tokens=20, stop_ids=[]).tokens.tolist()
    text = Chars().decode(free[0])
    target = text[6:8]  # two letters: two tokens
    first = text.find(target)
    got = generate(ours, ids, max_new_tokens=20, stop_ids=[], stop_strings=[target], tokenizer=Chars())
    rows = got.to_lists()
    assert rows[0] == free[0][: first + 2] and Chars().decode(rows[0]).endswith(target)
    other = Chars().decode(free[1])
    assert rows[1] == (free[1][: other.find(target) + 2] if target in other else free[1])
    assert cut_at_stop(text, [target]) == text[: first + 2]
    with pytest.raises(LmforgeError, match="stop_strings: pass the tokenizer"):
        generate(ours, ids, max_new_tokens=3, stop_strings=["x"])
    with pytest.raises(LmforgeError, match="repetition_penalty: works with greedy"):
        generate(ours, ids, max_new_tokens=3, beams=2, repetition_penalty=1.2)
