"""The graph runner (generation/runners/graphs.py): the lean step recorded once per column width, replayed every step,
with nothing read back to the host but the chosen tokens.

On a CPU the runner replays its step by calling it again on the same static buffers (no CUDA graphs there), so its
plumbing — inputs copied into fixed buffers, one graph per column width made at warm-up, outputs read from fixed
tensors — is tested here; the tests marked ``cuda`` record real graphs and run with torch's sync checker on.
"""

from __future__ import annotations

import collections
import re
from pathlib import Path

import pytest
import torch

from lmforge.generation.engine import Engine, Request
from lmforge.generation.runners import make_runner
from lmforge.generation.runners.graphs import Replay
from lmforge.models import Decoder, get_preset

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (run on a lent GPU machine)")


@pytest.fixture(autouse=True, scope="module")
def _one_thread(single_thread):
    """One torch thread (the shared fixture in conftest.py)."""


def llama(max_positions: int = 1024, **overrides) -> Decoder:
    """SmolLM2's layout at small widths: rotary, RMSNorm, SwiGLU, 6 query heads over 2 key/value heads."""
    settings = dict(vocab_size=300, d_model=48, n_layers=3, n_heads=6, n_kv_heads=2, d_ff=96,
                    max_positions=max_positions, positions="rotary", norm="rmsnorm", activation="swiglu",
                    bias=False, dropout=0.0, attention_dropout=0.0)
    torch.manual_seed(0)
    model = Decoder(get_preset("gpt-tiny", **{**settings, **overrides})).eval()
    with torch.no_grad():  # weights large enough that greedy choices are far from ties
        for p in model.parameters():
            if p.dim() > 1:
                p.mul_(6.0)
    return model


def gpt2() -> Decoder:
    """GPT-2's layout: learned positions, LayerNorm with biases, GELU."""
    torch.manual_seed(1)
    return Decoder(get_preset("gpt-tiny", vocab_size=300, n_layers=2, max_positions=600, dropout=0.0,
                              attention_dropout=0.0)).eval()


def prompt(n: int, seed: int) -> list[int]:
    return [(seed * 31 + 7 * j) % 290 + 5 for j in range(n)]


def decoded(model: Decoder, runner: str, work: list[tuple[list[int], dict]], slots: int = 8,
            arrive_every: int = 0, compile: bool | None = None) -> list:
    """Each request's generation, all decoded in one engine (``arrive_every``: one more request every so many
    steps, while the others decode)."""
    engine = Engine(model, slots=slots, runner=runner, compile=compile)
    engine.warmup()
    handles, steps = [], 0
    while len(handles) < len(work) or not engine.idle():
        if len(handles) < len(work) and (not arrive_every or steps % arrive_every == 0 or engine.idle()):
            ids, settings = work[len(handles)]
            handles.append(engine.submit(Request(ids, keep_logits=True, **settings)))
        engine.step()
        steps += 1
    return handles


@pytest.mark.parametrize("shape", ["llama", "gpt2"])
def test_the_graph_runner_gives_the_eager_runners_logits(shape):
    """Every logit of requests whose texts span three column widths (256, 512, 1024): the replayed lean step and
    the model's own forward agree to float rounding."""
    model = llama() if shape == "llama" else gpt2()
    work = [(prompt(n, n), dict(max_new_tokens=5 + k, stop_ids=[])) for k, n in enumerate((1, 9, 250, 300, 520))]
    work = [(ids, s) for ids, s in work if len(ids) + s["max_new_tokens"] <= model.config.max_positions]
    graphs, eager = decoded(model, "graphs", work), decoded(model, "eager", work)
    for a, b in zip(graphs, eager, strict=True):
        assert a.tokens == b.tokens
        torch.testing.assert_close(torch.stack(a.logits), torch.stack(b.logits), atol=2e-5, rtol=0)


def test_the_compiled_step_gives_the_eager_runners_tokens_and_logits():
    """``compile=True``: the lean step through torch.compile before it is recorded (here replayed: a CPU) gives
    the eager runner's tokens and logits to float rounding, over steps that read what earlier steps wrote into the
    caches (the compiled step writes them too), for SmolLM2's layout and GPT-2's; after the plain recorded step
    ran on the same model (its views of the weights held)."""
    for model in (llama(max_positions=256), gpt2()):
        work = [(prompt(n, n), dict(max_new_tokens=6, stop_ids=[])) for n in (2, 11, 40)]
        engine = Engine(model, slots=4, runner="graphs", compile=True)
        assert engine.runner.step_fn is not engine.runner.lean and "compiled by torch.compile" in \
            engine.runner.describe()
        eager, plain = decoded(model, "eager", work), decoded(model, "graphs", work, slots=4)
        compiled = decoded(model, "graphs", work, slots=4, compile=True)
        for a, b, c in zip(compiled, eager, plain, strict=True):
            assert a.tokens == b.tokens == c.tokens
            torch.testing.assert_close(torch.stack(a.logits), torch.stack(b.logits), atol=1e-4, rtol=0)
    plain = Engine(gpt2(), slots=4, runner="graphs").runner  # compile=None (the default): the plain step recorded
    assert plain.step_fn is plain.lean and "torch.compile" not in plain.describe()


def test_a_request_beside_others_gets_the_bits_it_gets_alone():
    """Greedy and seeded requests arriving while others decode (one column width): each request's every logit and
    token equal to the same request alone: every step computes all the slots, whatever is held."""
    model = llama()
    work = [(prompt(3 + 5 * k, k), dict(max_new_tokens=6 + k % 4, stop_ids=[] if k % 3 else [7],
                                        temperature=0.0 if k % 2 == 0 else 0.8, top_k=None if k % 4 else 20,
                                        seed=k)) for k in range(10)]
    together = decoded(model, "graphs", work, slots=8, arrive_every=2)
    for (ids, settings), g in zip(work, together, strict=True):
        (lone,) = decoded(model, "graphs", [(ids, settings)], slots=8)
        assert g.tokens == lone.tokens
        assert all(torch.equal(a, b) for a, b in zip(g.logits, lone.logits, strict=True))


def test_warmup_records_one_graph_per_width_and_serving_records_none(monkeypatch):
    """A capacity of 1,000 tokens: step graphs for 256, 512 and 1,000 columns and prefill graphs for 16, 32, ...,
    512, 1,000 prompt tokens at warm-up, the caches zeroed after; then requests of every length record nothing
    more (no request waits for a recording), and every prefill went through its graph."""
    engine = Engine(llama(max_positions=1000), slots=4, runner="graphs")
    runner = engine.runner
    assert runner.capacity_buckets == [256, 512, 1000] and runner.row_buckets == [4]
    assert runner.prompt_buckets == [16, 32, 64, 128, 256, 512, 1000]
    assert engine.warmup() == 10 and runner.recorded == 10 and runner.prefill_graphs
    assert not runner.caches.buffer.any()
    replays: collections.Counter[str] = collections.Counter()
    monkeypatch.setattr(Replay, "replay", lambda graph: replays.update([graph.fn.func.__name__]) or
                        setattr(graph, "output", graph.fn()))
    for n in (1, 200, 300, 700, 990):
        engine.submit(Request(prompt(n, n), max_new_tokens=8, stop_ids=[]))
    engine.run()
    assert runner.recorded == 10 and len(runner.graphs) == 10
    assert replays["prefill_call"] == 5 and replays["lean_step"] >= 7  # 7 steps after each first token
    assert "3 step and 7 prefill replayed calls" in runner.describe()


def test_without_warmup_a_step_records_its_graph_and_computes_the_step():
    """An engine used without warm-up (``generate``) records a graph at the first step that needs it: the step's
    results are those of the warmed-up engine."""
    model = llama()
    work = [(prompt(20, 1), dict(max_new_tokens=12, stop_ids=[])), (prompt(270, 2), dict(max_new_tokens=4,
                                                                                          stop_ids=[]))]
    engine = Engine(model, slots=4, runner="graphs")
    cold = [engine.submit(Request(ids, keep_logits=True, **s)) for ids, s in work]
    engine.run()
    assert engine.runner.recorded == 4  # steps of 256 and 512 columns, prefills of 32 and 512, when first needed
    warm = decoded(model, "graphs", work, slots=4)
    for a, b in zip(cold, warm, strict=True):
        assert a.tokens == b.tokens and all(torch.equal(x, y) for x, y in zip(a.logits, b.logits, strict=True))


def test_a_recorded_prefill_that_disagrees_with_its_eager_call_leaves_prefills_eager(monkeypatch, capsys):
    """Warm-up checks each recorded prefill against the eager call: graphs whose replays give other logits (here
    shifted by 1) leave prefills eager, said on stderr, and the answers stay right."""
    monkeypatch.setattr(Replay, "replay", lambda graph: setattr(graph, "output", graph.fn() + 1.0))
    engine = Engine(llama(), slots=2, runner="graphs")
    engine.warmup()
    assert not engine.runner.prefill_graphs and "prefills stay eager" in capsys.readouterr().err
    work = [(prompt(12, 4), dict(max_new_tokens=6, stop_ids=[]))]
    g = engine.submit(Request(work[0][0], **work[0][1]))
    engine.run()
    assert g.tokens == decoded(llama(), "eager", work)[0].tokens  # the step's +1 moves no argmax


# -- nothing read back to the host ---------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["graphs", "eager"])
def test_admission_prefill_and_step_read_nothing_back_on_the_meta_device(kind):
    """On the meta device a tensor has no values, so any read of one on the host (``item``, ``tolist``, ``bool``, a
    data-dependent shape) raises: the runner's admission (penalties, bias), prefill and step run there whole."""
    with torch.device("meta"):
        model = llama()
    runner = make_runner(model, slots=4, capacity=512, kind=kind)
    request = Request(prompt(9, 3), max_new_tokens=4, temperature=0.7, top_k=5, repetition_penalty=1.2,
                      presence_penalty=0.5, frequency_penalty=0.3, logit_bias={5: 2.0})  # no seed: no generator on meta
    with torch.inference_mode():
        runner.begin(1, request)
        runner.prefill([1], [request.ids])
        runner.note(1, 17)
        logits = runner.step([3, 17], [0, 9], [1, 1])
    assert logits.device.type == "meta" and logits.shape == (2, 300)


def test_an_engine_step_reads_one_thing_back_the_chosen_tokens(monkeypatch):
    """Every conversion of a tensor to a Python value during engine steps (admission, prefill, decode, sampling) is
    counted: one ``tolist`` a choice (the tokens), nothing else."""
    engine = Engine(llama(), slots=4, runner="graphs")
    engine.warmup()
    reads: list[str] = []
    for name in ("item", "tolist", "numpy", "__bool__", "__float__", "__int__", "__index__"):
        original = getattr(torch.Tensor, name)

        def counting(self, *args, _name=name, _original=original, **kwargs):
            reads.append(_name)
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, counting)
    for k in range(3):
        engine.submit(Request(prompt(5 + k, k), max_new_tokens=6, stop_ids=[], temperature=0.0 if k else 0.9,
                              seed=k, repetition_penalty=1.1 if k == 2 else 1.0))
    engine.step()  # three admissions (a first token each) and one decode step
    assert reads == ["tolist"] * 4, reads
    reads.clear()
    engine.step()
    assert reads == ["tolist"], reads


def test_no_pageable_host_to_device_copy_in_the_decoding_code():
    """``torch.tensor(..., device=...)`` copies from pageable memory, a host sync on CUDA: the engine, its runners
    and the lean step move host values with ``slots.upload`` instead."""
    root = Path(__file__).resolve().parents[1] / "src" / "lmforge" / "generation"
    files = [root / name for name in ("engine.py", "lean.py", "slots.py", "constraints.py")]
    files += sorted((root / "runners").glob("*.py"))
    pattern = re.compile(r"torch\.(tensor|as_tensor)\([^)]*device=")
    found = [f"{f.name}: {line.strip()}" for f in files for line in f.read_text().splitlines()
             if pattern.search(line)]
    assert not found, found


# -- on a GPU ------------------------------------------------------------------------------------------------------
@cuda
def test_cuda_graphs_give_the_eager_logits_and_the_step_never_syncs():
    """Recorded CUDA graphs: every logit close to the eager runner's (float32), and the runner's admission, prefill
    and step under ``torch.cuda.set_sync_debug_mode("error")`` (any host sync raises)."""
    model = llama().cuda()
    work = [(prompt(n, n), dict(max_new_tokens=6, stop_ids=[])) for n in (3, 40, 300)]
    graphs, eager = decoded(model, "graphs", work), decoded(model, "eager", work)
    for a, b in zip(graphs, eager, strict=True):
        assert a.tokens == b.tokens
        torch.testing.assert_close(torch.stack(a.logits), torch.stack(b.logits), atol=1e-4, rtol=1e-4)
    runner = make_runner(model, slots=4, capacity=512, kind="graphs")
    assert runner.warmup() == 2 + 6 and runner.describe().endswith("2 step and 6 prefill CUDA graphs, one per width")
    assert runner.prefill_graphs  # every recorded prefill agreed with its eager call
    request = Request(prompt(9, 3), max_new_tokens=4, temperature=0.7, repetition_penalty=1.2, logit_bias={5: 2.0})
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        with torch.inference_mode():
            runner.begin(0, request)
            runner.prefill([0], [request.ids])
            for length in range(9, 13):
                runner.step([17], [length], [1])
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert runner.recorded == 8


@cuda
def test_cuda_graphs_of_the_compiled_step_give_the_eager_logits():
    """``compile=True`` on CUDA: Inductor's kernels recorded as CUDA graphs, logits close to the eager runner's
    (SmolLM2's layout; one column width, so one compile)."""
    model = llama(max_positions=256).cuda()
    work = [(prompt(n, n), dict(max_new_tokens=6, stop_ids=[])) for n in (3, 40)]
    compiled, eager = decoded(model, "graphs", work, slots=4, compile=True), decoded(model, "eager", work, slots=4)
    for a, b in zip(compiled, eager, strict=True):
        assert a.tokens == b.tokens
        torch.testing.assert_close(torch.stack(a.logits), torch.stack(b.logits), atol=1e-3, rtol=1e-3)


@cuda
def test_on_cuda_the_default_runner_is_the_graph_runner():
    model = llama().cuda()
    assert Engine(model, slots=4).runner.name == "graphs"
    assert Engine(model, slots=4, compile=False).runner.name == "eager"
