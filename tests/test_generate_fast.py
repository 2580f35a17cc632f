"""Fast decoding gives what the plain loop gives: compiled fixed-shape steps == eager, vectorised beams == the
list-based beam search, and no (B, P, V) logits for the prompt.

``torch.compile`` runs on CPU too (inductor writes C++), so the compiled path is checked here against the
eager one token for token; on CUDA the same code adds CUDA graphs (bench/gpu.py measures them).
"""

from __future__ import annotations

import pytest
import torch

from beam_reference import reference_beam_search
from lmforge.generation import generate, pad_prompts, stream
from lmforge.generation.beam import beam_search
from lmforge.generation.steps import make_steps
from lmforge.models import Decoder, get_preset
from lmforge.models.seq2seq import Seq2Seq
from test_generate import Toy, sharpen

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


@pytest.fixture(autouse=True, scope="module")
def _one_thread(single_thread):
    """Every test here runs on one torch thread (the shared fixture in conftest.py)."""


@pytest.fixture(scope="module")
def gpt() -> Decoder:
    cfg = get_preset("gpt-tiny", dropout=0.0, attention_dropout=0.0, vocab_size=300, n_layers=2)
    return sharpen(Decoder(cfg), 0)


@pytest.fixture(scope="module")
def s2s() -> Seq2Seq:
    cfg = get_preset("seq2seq-tiny", dropout=0.0, vocab_size=300, n_encoder_layers=1, n_decoder_layers=2)
    return sharpen(Seq2Seq(cfg), 1, std=0.2)


PROMPTS = [[5, 17, 42], [8, 1, 2, 3, 4, 9, 10], [77]]


@pytest.mark.parametrize("kind", ["decoder", "seq2seq"])
def test_compiled_greedy_equals_eager(kind: str, gpt: Decoder, s2s: Seq2Seq) -> None:
    """Left-padded batch, stop tokens that end some rows early, logits included."""
    model = gpt if kind == "decoder" else s2s
    ids, mask = pad_prompts(PROMPTS, pad_id=0)
    eager = generate(model, ids, mask, max_new_tokens=12, output_logits=True, compile=False)
    stop = [eager.tokens[0, 3].item(), eager.tokens[2, 5].item()]  # rows 0 and 2 stop early, maybe row 1
    options = dict(max_new_tokens=12, output_logits=True, stop_ids=stop)
    eager = generate(model, ids, mask, compile=False, **options)
    fast = generate(model, ids, mask, compile=True, **options)
    assert fast.tokens.tolist() == eager.tokens.tolist()
    assert fast.lengths.tolist() == eager.lengths.tolist() and min(eager.lengths.tolist()) < 12
    torch.testing.assert_close(fast.logits, eager.logits, atol=1e-4, rtol=1e-4)
    again = generate(model, ids, mask, compile=True, **options)  # the same caches, reused: same answer
    assert again.tokens.tolist() == eager.tokens.tolist()


@pytest.mark.parametrize("kind", ["decoder", "seq2seq"])
def test_compiled_sampling_equals_eager_for_the_same_seed(kind: str, gpt: Decoder, s2s: Seq2Seq) -> None:
    model = gpt if kind == "decoder" else s2s
    ids, mask = pad_prompts(PROMPTS, pad_id=0)
    options = dict(max_new_tokens=16, stop_ids=[], temperature=0.9, top_k=50, top_p=0.9)
    eager = [generate(model, ids, mask, seed=s, compile=False, **options).tokens.tolist() for s in (0, 1)]
    fast = [generate(model, ids, mask, seed=s, compile=True, **options).tokens.tolist() for s in (0, 1)]
    assert fast == eager and eager[0] != eager[1]


def test_stream_compiled_equals_eager(gpt: Decoder) -> None:
    ids = torch.tensor([PROMPTS[1]])
    eager = [t.tolist() for t in stream(gpt, ids, max_new_tokens=10, stop_ids=[], compile=False)]
    fast = [t.tolist() for t in stream(gpt, ids, max_new_tokens=10, stop_ids=[], compile=True)]
    assert fast == eager and len(fast) == 10


@pytest.mark.parametrize("kind", ["decoder", "seq2seq"])
def test_compiled_beams_equal_eager_beams(kind: str, gpt: Decoder, s2s: Seq2Seq) -> None:
    model = gpt if kind == "decoder" else s2s
    ids, mask = pad_prompts(PROMPTS, pad_id=0)
    eager = generate(model, ids, mask, max_new_tokens=10, beams=3, stop_ids=[7, 11], compile=False)
    fast = generate(model, ids, mask, max_new_tokens=10, beams=3, stop_ids=[7, 11], compile=True)
    assert fast.to_lists() == eager.to_lists()
    torch.testing.assert_close(fast.scores, eager.scores)


def old_and_new(model, ids, mask, beams, n, stop, pad, penalty):
    with torch.inference_mode():
        old = reference_beam_search(make_steps(model, ids, mask, n), ids.shape[0], beams, n, stop, pad, penalty)
        new = beam_search(make_steps(model, ids, mask, n), ids.shape[0], beams, n, stop, pad, penalty)
    return old, new


@pytest.mark.parametrize("kind", ["decoder", "seq2seq"])
@pytest.mark.parametrize("beams, penalty", [(2, 1.0), (4, 0.0), (3, 2.0)])
def test_vectorised_beams_equal_the_list_based_search(kind, beams, penalty, gpt: Decoder, s2s: Seq2Seq) -> None:
    """Frequent stop tokens (a tenth of the vocabulary) so that hypotheses finish at many lengths."""
    model = gpt if kind == "decoder" else s2s
    ids, mask = pad_prompts([*PROMPTS, [120, 121, 122, 123]], pad_id=0)
    stop = list(range(0, 300, 10))
    (old_seqs, old_scores), (new_seqs, new_scores) = old_and_new(model, ids, mask, beams, 14, stop, 0, penalty)
    assert new_seqs == old_seqs
    assert new_scores == old_scores  # the same float64 arithmetic, to the bit


def test_vectorised_beams_on_a_toy_with_exact_probabilities() -> None:
    table = {0: {1: 0.5, 2: 0.3, 5: 0.2}, 1: {3: 0.6, 5: 0.4}, 2: {4: 0.9, 5: 0.1}, 3: {5: 0.7, 1: 0.3},
             4: {5: 0.5, 2: 0.5}}
    ids, mask = pad_prompts([[0], [3, 4], [2]], pad_id=0)
    for beams, penalty in [(2, 1.0), (3, 0.5), (2, 0.0)]:
        old, new = old_and_new(Toy(table), ids, mask, beams, 6, [5], 0, penalty)
        assert new == old


def test_prompt_logits_of_the_last_position_only(gpt: Decoder) -> None:
    ids = torch.tensor([PROMPTS[1]])
    full = gpt(ids).logits  # (1, P, V)
    last = gpt(ids, logits_to_keep=1).logits  # (1, 1, V)
    assert last.shape == (1, 1, full.shape[-1])
    torch.testing.assert_close(last[:, 0], full[:, -1])


def test_generate_reads_stop_every_few_tokens_yet_trims_like_the_per_token_loop() -> None:
    """All rows stop at token 3; generate runs until its next read (token 16) but returns 3 columns."""
    toy = Toy({0: {1: 0.9}, 1: {2: 0.9}, 2: {5: 0.9}})
    out = generate(toy, torch.tensor([[0], [0]]), max_new_tokens=40)
    assert out.tokens.tolist() == [[1, 2, 5]] * 2 and out.lengths.tolist() == [3, 3]
