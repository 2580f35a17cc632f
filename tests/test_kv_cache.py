"""A cache of half floats (``kv_cache="fp16"``, generation/slots.py): each key and value rounded once when it is
written, every attention reading them rounded; the engine's rules hold as with the model's own type."""

from __future__ import annotations

import pytest
import torch

from lmforge.errors import LmforgeError
from lmforge.generation.engine import Engine, Request
from lmforge.generation.lm import LM
from lmforge.nn import kernels
from test_gguf import tiny_llama

PROMPTS = [[1, 5, 9, 30, 7], [1, 44, 2, 9, 9, 9, 17, 3], [1, 8]]
needs_build = pytest.mark.skipif(kernels.library() is None, reason="no C compiler here: the CPU runner reads a "
                                 "half cache through step_kernels.c only")


@pytest.fixture(autouse=True)
def _two_threads():
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def model():
    return tiny_llama()


def run(model, prompts, slots, kv_cache=None, runner=None, prefix=0):
    engine = Engine(model, slots=slots, capacity=64, kv_cache=kv_cache, runner=runner, prefix_blocks=prefix)
    gens = [engine.submit(Request(p, max_new_tokens=12, stop_ids=[], keep_logits=True)) for p in prompts]
    engine.run()
    return [torch.stack(g.logits) for g in gens], [g.tokens for g in gens], engine


@needs_build
def test_a_half_cache_halves_the_memory_and_stays_close_to_the_float32_one(model):
    """The CPU runner's lean step over a float16 buffer (half the bytes of the float32 one): the same greedy tokens
    as the float32 cache on this model, every logit within 5e-3; the log line says so."""
    logits16, tokens16, engine = run(model, PROMPTS, 4, "fp16")
    logits32, tokens32, plain = run(model, PROMPTS, 4)
    buffer = engine.runner.caches.buffer
    assert buffer.dtype == torch.float16 and engine.runner.lean is not None and engine.runner.lean.native
    assert buffer.nbytes * 2 == plain.runner.caches.buffer.nbytes
    assert tokens16 == tokens32
    assert max((a - b).abs().max().item() for a, b in zip(logits16, logits32, strict=True)) < 5e-3
    assert not all(torch.equal(a, b) for a, b in zip(logits16, logits32, strict=True))  # it did round
    assert "keys and values in float16" in engine.runner.describe()


@needs_build
def test_with_a_half_cache_a_batched_request_equals_itself_alone(model):
    together, _, _ = run(model, PROMPTS, 4, "fp16")
    for prompt, logits in zip(PROMPTS, together, strict=True):
        alone, _, _ = run(model, [prompt], 1, "fp16")
        assert torch.equal(alone[0], logits)


@needs_build
def test_with_a_half_cache_a_cached_prefix_gives_the_bits_of_a_whole_prefill(model):
    """The prefill attends to its own keys as the cache holds them (rounded), so a prompt continued after cached
    blocks of a beginning computes what the whole prompt's prefill computes."""
    first = [1, *range(10, 40)]
    later = [*first[:20], 77, 78]
    engine = Engine(model, slots=2, capacity=64, kv_cache="fp16", prefix_blocks=16)
    engine.submit(Request(first, max_new_tokens=4, stop_ids=[]))
    engine.run()
    hit = engine.submit(Request(later, max_new_tokens=6, stop_ids=[], keep_logits=True))
    engine.run()
    assert engine.runner.prefix.hits == 16
    fresh, _, _ = run(model, [later], 2, "fp16")
    assert torch.equal(torch.stack(hit.logits)[:6], fresh[0][:6])


def test_the_eager_runner_rounds_the_same_numbers(model):
    """The readable runner (torch's attention over the cache read back as float32) against the CPU runner's
    kernels: the same rounded keys and values, so logits within float32's summation differences."""
    eager, _, engine = run(model, PROMPTS, 4, "fp16", runner="eager")
    assert engine.runner.caches.buffer.dtype == torch.float16
    if kernels.library() is not None:
        cpu, _, _ = run(model, PROMPTS, 4, "fp16")
        assert max((a - b).abs().max().item() for a, b in zip(eager, cpu, strict=True)) < 1e-4
    plain, _, _ = run(model, PROMPTS, 4, runner="eager")
    assert max((a - b).abs().max().item() for a, b in zip(eager, plain, strict=True)) < 5e-3


def test_a_half_cache_is_refused_where_no_runner_reads_one(model):
    with pytest.raises(LmforgeError, match="kv_cache: 'fp8' is not one of fp16"):
        Engine(model, slots=2, capacity=64, kv_cache="fp8")
    with pytest.raises(LmforgeError, match="kv_cache fp16: for the CPU and eager runners"):
        Engine(model, slots=2, capacity=64, kv_cache="fp16", runner="compiled")


@needs_build
def test_lm_and_serve_take_the_setting(model):
    from lmforge.workflows.options import ServeOptions

    lm = LM(model, slots=2, capacity=64, kv_cache="fp16")
    assert lm.engine.runner.caches.buffer.dtype == torch.float16
    assert len(lm.generate([PROMPTS[0]], max_new_tokens=5)[0].tokens) == 5
    assert ServeOptions().kv_cache == "model" and ServeOptions(kv_cache="fp16").kv_cache == "fp16"
