"""The decoding engine (generation/engine.py): compile once per bucket, continuous batching, rows independent."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch._dynamo.utils import counters

from lmforge.errors import LmforgeError
from lmforge.generation import generate
from lmforge.generation.engine import Engine, Request
from lmforge.generation.slots import MIN_ROWS, bucket, buckets
from lmforge.models import Decoder, Seq2Seq, get_preset


@pytest.fixture(autouse=True, scope="module")
def _one_thread(single_thread):
    """One torch thread (the shared fixture in conftest.py)."""


def sharpen(model: torch.nn.Module, seed: int, std: float = 0.15) -> torch.nn.Module:
    """Weights large enough that next-token distributions are far from uniform (no near-ties)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() > 1:
                p.copy_(torch.randn(p.shape, generator=g) * std)
            elif "norm" not in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.02)
    return model.eval()


@pytest.fixture(scope="module")
def llama() -> Decoder:
    """A small Llama-shaped decoder: rotary, RMSNorm, SwiGLU, grouped-query attention (4 query, 2 KV heads)."""
    config = get_preset("gpt-tiny", vocab_size=300, dropout=0.0, attention_dropout=0.0, positions="rotary",
                        norm="rmsnorm", activation="swiglu", bias=False, n_kv_heads=2, max_positions=128)
    return sharpen(Decoder(config), 0)


@pytest.fixture(scope="module")
def gpt() -> Decoder:
    return sharpen(Decoder(get_preset("gpt-tiny", vocab_size=300, dropout=0.0, attention_dropout=0.0)), 1)


@pytest.fixture(scope="module")
def s2s() -> Seq2Seq:
    return sharpen(Seq2Seq(get_preset("seq2seq-tiny", dropout=0.0, vocab_size=300)), 2, std=0.2)


def prompts(n: int, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, 300, (int(torch.randint(2, 40, (1,), generator=g)),), generator=g).tolist()
            for _ in range(n)]


def alone(model, ids: list[int], **settings) -> list[int]:
    """The request decoded by itself in a fresh engine of 16 slots (15 of them idle)."""
    engine = Engine(model, slots=16)
    g = engine.submit(Request(ids, **settings))
    engine.run()
    return g.tokens


# -- continuous batching ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["llama", "gpt", "seq2seq"])
def test_a_request_beside_others_gives_what_it_gives_alone(kind, llama, gpt, s2s):
    """Mixed prompt lengths, arrivals at different steps, other rows sampling, different stops and lengths."""
    model = {"llama": llama, "gpt": gpt, "seq2seq": s2s}[kind]
    engine = Engine(model, slots=16)
    work = [(ids, dict(max_new_tokens=8 + 3 * (i % 5), stop_ids=[] if i % 3 else [7, 11],
                       temperature=0.0 if i % 2 == 0 else 0.9, top_p=None if i % 4 else 0.8, seed=i))
            for i, ids in enumerate(prompts(20, seed=kind.__len__()))]
    handles = []
    for step in range(60):  # two new requests every third step, while the others decode
        if step % 3 == 0 and len(handles) < len(work):
            handles += [engine.submit(Request(ids, **s)) for ids, s in work[len(handles):len(handles) + 2]]
        engine.step()
    engine.run()
    for (ids, settings), g in zip(work, handles, strict=True):
        assert g.done and g.tokens == alone(model, ids, **settings), (ids, settings)  # seeded rows too


def test_greedy_answers_equal_alone_and_beside_15_others(llama):
    work = prompts(16, seed=5)
    engine = Engine(llama, slots=16)
    handles = [engine.submit(Request(ids, max_new_tokens=30, stop_ids=[])) for ids in work]
    engine.run()
    assert [g.tokens for g in handles] == [alone(llama, ids, max_new_tokens=30, stop_ids=[]) for ids in work]
    assert [g.tokens for g in handles] == generate(llama, *_padded(work), max_new_tokens=30, stop_ids=[],
                                                   use_cache=False).to_lists()  # = the plain recomputation


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_two_threads_a_request_alone_and_beside_15_others_gets_the_same_logits(llama, dtype):
    """On 2 threads an eager CPU engine steps a lone float32 request as 1 row and a full batch as 16 (packed
    products, on both threads), a bfloat16 one as 4 and 16 rows on one thread: every logit of every step is the
    same bits either way."""
    import copy

    before = torch.get_num_threads()
    torch.set_num_threads(2)
    model = llama if dtype == torch.float32 else copy.deepcopy(llama).to(dtype)
    try:
        work = prompts(16, seed=9)
        engine = Engine(model, slots=16)
        assert engine.runner.packed == (dtype == torch.float32)
        assert_batched_equals_alone(engine, model, work, 12, slots=16)
        assert torch.get_num_threads() == 2  # one-thread steps give the threads back
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("kind", ["llama", "seq2seq"])
def test_a_request_moved_into_a_freed_slot_keeps_every_logit_and_steps_stop_computing_the_holes(kind, llama, s2s):
    """Five short requests in slots 0-4 end after 2 tokens; the long one in slot 5 then moves to slot 0 with its
    keys and values (and an encoder-decoder's source), and each later step computes 1 row, not 6."""
    model = llama if kind == "llama" else s2s
    work = prompts(6, seed=11)
    engine = Engine(model, slots=8)
    rows: list[int] = []
    step = engine.runner.step
    engine.runner.step = lambda tokens, lengths, sources, rows_=None: rows.append(len(lengths)) or step(
        tokens, lengths, sources, rows_)
    for ids in work[:5]:
        engine.submit(Request(ids, max_new_tokens=2, stop_ids=[]))
    moved = engine.submit(Request(work[5], max_new_tokens=12, stop_ids=[], keep_logits=True))
    engine.step()
    assert engine.scheduler.slots[5].generation is moved
    engine.run()
    lone = Engine(model, slots=8)
    one = lone.submit(Request(work[5], max_new_tokens=12, stop_ids=[], keep_logits=True))
    lone.run()
    assert moved.tokens == one.tokens
    assert all(torch.equal(a, b) for a, b in zip(one.logits, moved.logits, strict=True))
    packed = getattr(engine.runner, "packed", False)
    rows_each = 1 if packed else MIN_ROWS  # eager rows: exact when packed, else multiples of 4
    assert rows[0] == (6 if packed else 8) and rows[-9:] == [rows_each] * 9, rows


def _padded(work):
    from lmforge.generation import pad_prompts

    return pad_prompts(work)


def test_a_finished_request_frees_its_slot_at_once(gpt):
    engine = Engine(gpt, slots=MIN_ROWS)
    short = [engine.submit(Request([5, 6, 7], max_new_tokens=2, stop_ids=[])) for _ in range(MIN_ROWS)]
    waiting = engine.submit(Request([9, 10], max_new_tokens=3, stop_ids=[]))
    engine.step()  # every slot taken: each gets its first token (prefill) and its second (the step)
    assert all(g.done for g in short) and not waiting.tokens
    engine.step()  # the freed slot takes the waiting request at the next step
    assert len(waiting.tokens) == 2 and engine.active == [0]


def test_cancel_frees_the_slot_and_stops_the_tokens(gpt):
    engine = Engine(gpt, slots=4)
    g = engine.submit(Request([5, 6, 7], max_new_tokens=50, stop_ids=[]))
    engine.step()
    g.cancel()
    engine.step()
    assert g.finish_reason == "cancelled" and len(g.tokens) == 2 and engine.idle()


def test_stop_ids_strings_and_lengths_end_each_request(gpt):
    free = alone(gpt, [5, 17, 42], max_new_tokens=12, stop_ids=[])
    engine = Engine(gpt, slots=4, tokenizer=Chars())
    by_token = engine.submit(Request([5, 17, 42], max_new_tokens=12, stop_ids=[free[4]]))
    by_string = engine.submit(Request([5, 17, 42], max_new_tokens=12, stop_ids=[],
                                      stop_strings=[chr(free[2]) + chr(free[3])]))
    by_length = engine.submit(Request([5, 17, 42], max_new_tokens=6, stop_ids=[]))
    engine.run()
    assert (by_token.tokens, by_token.finish_reason) == (free[: free.index(free[4]) + 1], "stop")
    assert (by_string.tokens, by_string.finish_reason) == (free[:4], "stop")
    assert (by_length.tokens, by_length.finish_reason) == (free[:6], "length")


class Chars:
    """A toy tokenizer: id i is chr(i)."""

    def decode(self, ids, skip_special_tokens=True):
        return "".join(map(chr, ids))


def test_logits_equal_the_models_own_forward(llama):
    ids = [5, 17, 42, 7, 99, 3]
    engine = Engine(llama, slots=4)
    g = engine.submit(Request(ids, max_new_tokens=10, stop_ids=[], keep_logits=True))
    engine.submit(Request(ids[:2], max_new_tokens=20, stop_ids=[]))  # a neighbour
    engine.run()
    full = torch.tensor([ids + g.tokens])
    with torch.no_grad():
        expected = llama(full).logits[0, len(ids) - 1: -1]  # (10, V): the logits that chose each new token
    torch.testing.assert_close(torch.stack(g.logits), expected, atol=1e-5, rtol=0)


def test_requests_that_cannot_fit_are_one_line(gpt):
    engine = Engine(gpt, slots=4, capacity=64)
    with pytest.raises(LmforgeError, match=r"max_new_tokens: the prompt's 10 tokens \+ 60 new tokens exceed the "
                       "context of 64"):
        engine.submit(Request(list(range(1, 11)), max_new_tokens=60))
    with pytest.raises(LmforgeError, match="at least one token"):
        engine.submit(Request([], max_new_tokens=5))
    with pytest.raises(LmforgeError, match="stop_strings: the engine needs the tokenizer"):
        engine.submit(Request([1, 2], stop_strings=["x"]))
    vocab = gpt.config.vocab_size
    engine.submit(Request(np.array([1, 2]), max_new_tokens=5))  # NumPy's integers are ids
    for ids in ([1, vocab], [-1, 2], [1.0, 2]):  # ids that index no embedding, or are no ids
        with pytest.raises(LmforgeError, match=rf"prompt: Request.ids must be a list of token ids; got not all token "
                                               rf"ids in \[0, {vocab}\)"):
            engine.submit(Request(ids, max_new_tokens=5))

    class Encoding(list):  # what a tokenizer's encode returns: the ids are its .ids
        ids = (1, 2)

    with pytest.raises(LmforgeError, match=r"got a tokenizer's Encoding \(its .ids are the token ids\)"):
        engine.submit(Request(Encoding([1, 2]), max_new_tokens=5))


def test_buckets():
    assert buckets(4, 16) == [4, 8, 16] and buckets(256, 2048) == [256, 512, 1024, 2048]
    assert [bucket(n, [4, 8, 16]) for n in (1, 4, 5, 16)] == [4, 4, 8, 16]


def test_eager_buckets_are_fine_compiled_ones_few(llama):
    """Eager on CPU with float32 weights steps exactly its active rows, at least 2 (packed products: cpu.py; a
    lone request beside a spare row that no request holds); other eager engines every multiple of MIN_ROWS; prompts
    to a multiple of 8, columns to a multiple of 32; compiled keeps powers of two (one graph each)."""
    eager = Engine(llama, slots=16, capacity=128, compile=False).runner
    assert eager.packed and eager.row_buckets == list(range(2, 17)) and eager.n_slots == 16
    lone = Engine(llama, slots=1, capacity=128).runner
    assert lone.row_buckets == [2] and lone.n_slots == 1 and lone.caches.slots == 2
    assert bucket(37, eager.prompt_buckets) == 40 and bucket(9, eager.row_buckets) == 9
    assert eager.capacity_buckets == [32, 64, 96, 128]
    half = Decoder(llama.config).to(torch.bfloat16).eval()  # no packed bf16 products on CPU: multiples of 4
    assert not Engine(half, slots=8, capacity=128).runner.packed
    assert Engine(half, slots=8, capacity=128).runner.row_buckets == [4, 8]
    assert Engine(half, slots=10, capacity=128).runner.row_buckets == [4, 8, 12]  # rounded up to a multiple of 4
    compiled = Engine(llama, slots=16, capacity=128, runner="compiled").runner  # compiled at a bucket's first call
    assert compiled.row_buckets == [4, 8, 16] and bucket(37, compiled.prompt_buckets) == 64
    assert bucket(5, compiled.row_buckets) == 8 and compiled.capacity_buckets == [64, 128]
    reference = Engine(llama, slots=6, capacity=128, runner="eager").runner  # the plain reference: exact rows
    assert reference.row_buckets == list(range(1, 7)) and reference.name == "eager"


def test_unmerged_lora_is_not_packed(llama):
    """LoRA's extra products are plain ones (their bits depend on the row count): such a model steps as the
    unpacked engines do, in multiples of MIN_ROWS on one thread."""
    import copy

    from lmforge.nn.lora import inject_lora

    tuned = copy.deepcopy(llama)
    inject_lora(tuned, r=2)
    runner = Engine(tuned.eval(), slots=8).runner
    assert not runner.packed and runner.row_buckets == [4, 8]


@pytest.mark.parametrize("threads", [1, 2])
def test_packed_products_give_a_row_the_same_bits_beside_any_number_of_rows(threads):
    """What batched == alone rests on: a row of a packed product (runners/cpu.py: kernels.c's float32 kernel, or
    oneDNN's for a width it does not hold, 300) has the same bits for every row count from 1 to 40 (an engine's
    steps) and 64, on 1 and 2 threads (the server's), with and without bias, on SmolLM2's shapes; and it is
    F.linear's value to float rounding."""
    from lmforge.generation.runners.cpu import PackedProducts

    before = torch.get_num_threads()
    g = torch.Generator().manual_seed(0)
    try:
        for d_in, d_out in ((576, 960), (1536, 576), (576, 3072), (64, 300)):
            x = torch.randn(64, d_in, generator=g)
            for bias in (False, True):
                layer = torch.nn.Linear(d_in, d_out, bias=bias)
                torch.nn.init.normal_(layer.weight, std=d_in ** -0.5, generator=g)
                if bias:
                    torch.nn.init.normal_(layer.bias, generator=g)
                with torch.no_grad():
                    full = torch.nn.functional.linear(x, layer.weight, layer.bias)
                    torch.set_num_threads(threads)
                    with PackedProducts(layer).attached():
                        rows = [layer(x[:n]) for n in [*range(1, 41), 64]]
                    torch.set_num_threads(before)
                for got in rows:
                    assert torch.equal(got, rows[-1][: len(got)]), (d_in, d_out, len(got), bias)
                torch.testing.assert_close(rows[-1], full, atol=1e-5, rtol=1e-5)
    finally:
        torch.set_num_threads(before)


def test_packed_products_reach_every_projection_for_the_runners_calls_only(monkeypatch):
    """Attached for a call, the packed products reach every projection of a decoder (attention, feed-forward, the
    LM head), never with autograd on; after it, the model's layers are plain ``nn.Linear`` again."""
    from lmforge.generation.runners import cpu

    calls, packed = [], []
    real, real_product = cpu.packed_weight, cpu.packed_product
    monkeypatch.setattr(cpu, "packed_weight", lambda layer, tiles=False: calls.append(tuple(layer.weight.shape))
                        or real(layer, tiles))
    monkeypatch.setattr(cpu, "packed_product", lambda x, w, b, r=None: packed.append(1) or real_product(x, w, b, r))
    model = Decoder(get_preset("gpt-tiny")).eval()
    ids = torch.tensor([[1, 2, 3]])
    products = cpu.PackedProducts(model)
    with products.attached():
        with torch.no_grad():
            inside = model(ids).logits
        model(ids)  # autograd recording: F.linear
    layers = len(model.layers)
    assert len(calls) == 4 * layers + 1 and calls[-1][0] == model.config.embedding_rows
    assert len(packed) == 4 * layers + 1  # the no-grad call only
    assert all("forward" not in m.__dict__ and "packed" not in m.__dict__ for m in model.modules())
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, inside, atol=1e-5, rtol=0)  # F.linear, to rounding
    assert len(packed) == 4 * layers + 1  # outside the block: F.linear


def test_a_changed_weight_is_packed_again():
    """An optimizer step or a load_state_dict between two engine calls: the next packed product uses the new
    weight, not the copy packed before."""
    from lmforge.generation.runners.cpu import PackedProducts

    layer = torch.nn.Linear(32, 16)
    x = torch.randn(5, 32)
    with torch.no_grad():
        with PackedProducts(layer).attached():
            first = layer(x)
        layer.weight.mul_(2.0)  # in place, as an optimizer does
        with PackedProducts(layer).attached():
            doubled = layer(x)
        expected = torch.nn.functional.linear(x, layer.weight, layer.bias)
        layer.load_state_dict({"weight": torch.zeros(16, 32), "bias": torch.ones(16)})
        with PackedProducts(layer).attached():
            loaded = layer(x)
        layer.weight = torch.nn.Parameter(torch.eye(16, 32))  # another tensor (it may reuse the old one's memory)
        with PackedProducts(layer).attached():
            assigned = layer(x)
    assert not torch.equal(doubled, first)
    torch.testing.assert_close(assigned, x[:, :16] + 1, atol=1e-6, rtol=0)
    torch.testing.assert_close(doubled, expected, atol=1e-5, rtol=1e-5)
    assert torch.equal(loaded, torch.ones(5, 16))


# -- compile once --------------------------------------------------------------------------------------------------
def test_one_graph_per_bucket_whatever_the_mix(llama):
    """Prompt lengths, max_new_tokens, batch sizes within a bucket and sampling settings all vary: the graphs are
    one prefill per prompt bucket and one step per (row bucket, capacity bucket), and nothing breaks a graph
    (fullgraph=True would raise)."""
    torch._dynamo.reset()
    before = counters["stats"]["unique_graphs"]
    engine = Engine(llama, slots=8, capacity=128, runner="compiled")
    eager = Engine(llama, slots=8, capacity=128)
    buckets_of = engine.runner
    mixes = [  # (prompt lengths, max_new_tokens, temperature, top_k, top_p, repetition_penalty)
        ([3, 5, 9], 6, 0.0, None, None, 1.0),
        ([4, 7], 9, 0.8, 20, None, 1.0),
        ([2, 12, 6, 10, 15], 5, 1.1, None, 0.9, 1.3),
        ([8], 11, 0.0, None, None, 1.2),
    ]
    used_prefill, used_step = set(), set()
    for lengths, n, temperature, top_k, top_p, penalty in mixes:
        requests = [Request(list(range(3, 3 + p)), max_new_tokens=n, temperature=temperature, top_k=top_k,
                            top_p=top_p, repetition_penalty=penalty, seed=p, stop_ids=[]) for p in lengths]
        fast = [engine.submit(r) for r in requests]
        slow = [eager.submit(r) for r in requests]
        engine.run()
        eager.run()
        assert [g.tokens for g in fast] == [g.tokens for g in slow]  # compiled == eager, sampled rows too
        used_prefill |= {bucket(p, buckets_of.prompt_buckets) for p in lengths}
        rows = bucket(len(lengths), buckets_of.row_buckets)
        used_step |= {(rows, bucket(p + t + 1, buckets_of.capacity_buckets)) for p in lengths for t in range(n - 1)}
    graphs = counters["stats"]["unique_graphs"] - before
    assert len(used_prefill) == 1 and len(used_step) == 2  # all prompts < 16 tokens; rows 4 then 8; capacity 128
    assert graphs == len(used_prefill) + len(used_step)
    assert not counters["graph_break"]


def test_warmup_compiles_every_graph_before_the_first_request(llama):
    """What a server does at start on a GPU: every graph compiled first, then requests of any mix compile none,
    get the eager tokens, and find the caches as new (the warm-up's pad tokens zeroed)."""
    torch._dynamo.reset()
    engine = Engine(llama, slots=4, capacity=32, runner="compiled")
    before = counters["stats"]["unique_graphs"]
    assert engine.warmup() == 3  # prefill at 16 and 32 columns; one step of 4 rows over 32 columns
    warmed = counters["stats"]["unique_graphs"]
    assert warmed - before == 3
    assert not any(kv.k.any() or kv.v.any() for kv in engine.runner.caches.all())
    eager = Engine(llama, slots=4, capacity=32)
    assert eager.warmup() == 0  # nothing to compile
    requests = [Request(list(range(3, 3 + p)), max_new_tokens=n, stop_ids=[]) for p, n in ((3, 5), (20, 8), (9, 12))]
    fast, slow = [engine.submit(r) for r in requests], [eager.submit(r) for r in requests]
    engine.run()
    eager.run()
    assert counters["stats"]["unique_graphs"] == warmed  # nothing compiled while serving
    assert [g.tokens for g in fast] == [g.tokens for g in slow]


def test_one_dynamic_step_graph_serves_every_batch_and_keeps_a_rows_bits(llama, s2s):
    """compile=True on CPU for a float32 decoder (``lmforge serve --compile``, ``generate --compile``): the warm-up
    compiles one step graph, which then serves 1 to 16 requests at any length; on 2 threads every logit of a
    request decoded beside 15 others equals the one it gets alone, and the tokens are the eager engine's."""
    assert Engine(llama, slots=4, compile=True).runner.dynamic and not Engine(llama, slots=4).runner.dynamic
    assert Engine(s2s, slots=4, compile=True).runner.name == "compiled"  # encoder-decoders: a graph per bucket
    with pytest.raises(LmforgeError, match="float32 decoders"):
        Engine(s2s, slots=4, compile=True, runner="cpu")
    torch._dynamo.reset()
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        engine = Engine(llama, slots=16, capacity=128, compile=True, prefix_blocks=8)
        assert engine.runner.row_buckets == list(range(2, 17)) and engine.runner.prefix is None
        graphs = counters["stats"]["unique_graphs"]
        assert engine.warmup() == 1 and counters["stats"]["unique_graphs"] - graphs == 1
        assert not any(kv.k.any() for kv in engine.runner.caches.all())
        work = prompts(16, seed=9)
        together = [engine.submit(Request(ids, max_new_tokens=12, stop_ids=[], keep_logits=True)) for ids in work]
        engine.run()
        eager = Engine(llama, slots=16, capacity=128)
        plain = [eager.submit(Request(ids, max_new_tokens=12, stop_ids=[])) for ids in work]
        eager.run()
        assert [g.tokens for g in together] == [g.tokens for g in plain]
        for ids, g in zip(work, together, strict=True):
            one = engine.submit(Request(ids, max_new_tokens=12, stop_ids=[], keep_logits=True))
            engine.run()
            assert one.tokens == g.tokens
            assert all(torch.equal(a, b) for a, b in zip(one.logits, g.logits, strict=True))
        assert counters["stats"]["unique_graphs"] - graphs == 1 and not counters["graph_break"]
    finally:
        torch.set_num_threads(before)


def test_an_lm_reuses_its_engine_and_its_graphs(gpt):
    """One ``LM`` for many calls: its engine (and a compiled runner's graphs) serves them all while they fit; beam
    search runs on the same runner and gives the eager beams."""
    from lmforge.generation.lm import LM

    torch._dynamo.reset()
    before = counters["stats"]["unique_graphs"]
    lm = LM(gpt, runner="compiled")
    first = lm.generate([[5, 17, 42, 7]], max_new_tokens=10, stop_ids=[])[0].tokens
    engine = lm.engine
    for n in (4, 7, 10):  # other output lengths, another prompt length in the same bucket: no new graph
        assert lm.generate([[5, 17, 42, 7]], max_new_tokens=n, stop_ids=[])[0].tokens == first[:n]
    lm.generate([[5, 17, 42, 7, 8, 9]], max_new_tokens=10, stop_ids=[])
    assert lm.engine is engine and counters["stats"]["unique_graphs"] - before == 2  # one prefill, one step
    ids = torch.tensor([[5, 17, 42, 7]])
    beams = generate(gpt, ids, max_new_tokens=10, beams=3, compile=True, stop_ids=[])
    assert beams.tokens.tolist() == generate(gpt, ids, max_new_tokens=10, beams=3, stop_ids=[]).tokens.tolist()


def test_a_padded_vocabulary_changes_no_logit_and_exports_unpadded(tmp_path):
    """vocab_multiple=64 pads the embedding rows (nanoGPT's 50257 -> 50304); logits keep vocab_size columns."""
    from lmforge.interop.huggingface import convert_to_hf

    plain = Decoder(get_preset("gpt-tiny", vocab_size=300, dropout=0.0, attention_dropout=0.0)).eval()
    padded = Decoder(get_preset("gpt-tiny", vocab_size=300, dropout=0.0, attention_dropout=0.0,
                                vocab_multiple=64)).eval()
    assert padded.tok_emb.weight.shape[0] == 320
    state = {k: v[:300] if k in ("tok_emb.weight", "lm_head.proj.weight") and v.shape[0] == 320 else v
             for k, v in padded.state_dict().items()}
    plain.load_state_dict(state)
    ids = torch.tensor([[5, 17, 299, 7]])
    with torch.no_grad():
        assert padded(ids).logits.shape == (1, 4, 300)
        torch.testing.assert_close(padded(ids).logits, plain(ids).logits, atol=0, rtol=0)
    transformers = pytest.importorskip("transformers")
    hf = transformers.GPT2LMHeadModel.from_pretrained(convert_to_hf(padded, tmp_path / "hf")).eval()
    with torch.no_grad():
        torch.testing.assert_close(hf(ids).logits, plain(ids).logits, atol=1e-5, rtol=0)


@pytest.mark.parametrize("kind", ["llama", "gpt"])
def test_one_steps_arrivals_are_prefilled_together_and_each_gets_what_it_gets_alone(kind, llama, gpt):
    """Twelve prompts submitted at once: one prefill call per prompt-width bucket (not one per request), and
    every answer, greedy or seeded, bit-identical to the request alone."""
    model = llama if kind == "llama" else gpt
    work = [[(7 * k + j) % 90 + 5 for j in range(3 + (k % 4) * 5)] for k in range(12)]  # 3 to 18 tokens
    settings = [dict(max_new_tokens=8, stop_ids=[]) if k % 2 else
                dict(max_new_tokens=8, stop_ids=[], temperature=0.9, top_k=20, seed=k) for k in range(12)]
    engine = Engine(model, slots=16)
    calls = []
    prefill = engine.runner.prefill
    engine.runner.prefill = lambda slots, ids, start=0: calls.append(len(slots)) or prefill(slots, ids, start)
    handles = [engine.submit(Request(ids, **s)) for ids, s in zip(work, settings, strict=True)]
    engine.run()
    widths = {bucket(len(ids), engine.runner.prompt_buckets) for ids in work}
    assert sorted(calls) == sorted(sum(bucket(len(ids), engine.runner.prompt_buckets) == w for ids in work)
                                   for w in widths) and len(calls) == len(widths) < len(work)
    assert [g.tokens for g in handles] == [alone(model, ids, **s) for ids, s in zip(work, settings, strict=True)]


def test_a_failing_prefill_in_a_group_ends_only_its_own_request(gpt):
    """The group is retried one by one: the request whose prefill fails ends with "error", the others answer."""
    engine = Engine(gpt, slots=8)
    prefill = engine.runner.prefill

    def failing(slots, ids, start=0):
        if any(row[0] == 66 for row in ids):
            raise RuntimeError("bad prompt")
        return prefill(slots, ids, start)

    engine.runner.prefill = failing
    work = [[5, 6, 7], [66, 6, 7], [9, 6, 7]]
    handles = [engine.submit(Request(ids, max_new_tokens=4, stop_ids=[])) for ids in work]
    engine.run()
    assert [g.finish_reason for g in handles] == ["length", "error", "length"]
    assert "bad prompt" in handles[1].error and handles[0].tokens == alone(gpt, work[0], max_new_tokens=4, stop_ids=[])


def test_a_failing_step_or_callback_ends_only_its_own_request(gpt):
    """A step that fails for one request (injected: whenever its row is in the step, from its third token on) is
    retried one request at a time: that request ends with "error", the others go on with the tokens they get
    alone. A request whose own callback raises ends with "error" too, alone."""
    engine = Engine(gpt, slots=8)
    work = [[5, 6, 7], [8, 9, 10], [11, 12, 13]]
    late = []
    handles = [engine.submit(Request(work[0], max_new_tokens=10, stop_ids=[])),
               engine.submit(Request(work[1], max_new_tokens=10, stop_ids=[])),
               engine.submit(Request(work[2], max_new_tokens=10, stop_ids=[],
                                     on_token=lambda t: late.append(t) or (len(late) == 2 and 1 / 0)))]
    poisoned = handles[1]
    step = engine.runner.step

    def failing(tokens, lengths, sources, rows=None):
        held = [engine.scheduler.slots[i] for i in (rows if rows is not None else range(len(lengths)))]
        if len(poisoned.tokens) >= 3 and any(s is not None and s.generation is poisoned for s in held):
            raise RuntimeError("a bad row")
        return step(tokens, lengths, sources, rows)

    engine.runner.step = failing
    engine.run()
    assert [g.finish_reason for g in handles] == ["length", "error", "error"]
    assert "a bad row" in poisoned.error and len(poisoned.tokens) == 3
    assert "ZeroDivisionError" in handles[2].error and handles[2].ended.is_set()
    assert handles[0].tokens == alone(gpt, work[0], max_new_tokens=10, stop_ids=[])
    assert engine.idle()


def assert_batched_equals_alone(engine: Engine, model, work: list[list[int]], new: int, slots: int) -> None:
    """Every prompt of ``work`` decoded together on ``engine`` (made with ``slots``) gets the tokens and the
    logits, bit for bit, that it gets alone on an engine made the same way."""
    handles = [engine.submit(Request(ids, max_new_tokens=new, stop_ids=[], keep_logits=True)) for ids in work]
    engine.run()
    for ids, g in zip(work, handles, strict=True):
        lone = Engine(model, slots=slots)
        one = lone.submit(Request(ids, max_new_tokens=new, stop_ids=[], keep_logits=True))
        lone.run()
        assert one.tokens == g.tokens
        assert all(torch.equal(a, b) for a, b in zip(one.logits, g.logits, strict=True))


@pytest.mark.parametrize("kind", ["llama", "seq2seq", "graphs"])
def test_n_choices_of_one_prompt_are_prefilled_once_and_each_gets_what_it_gets_alone(kind, llama, s2s):
    """Five requests with one prompt (OpenAI's n: sampled with their own seeds, one greedy) and one other
    prompt, arriving together: two prefill calls, not six; the others get the first one's keys and values
    and logits, and every answer equals the same request alone, bit for bit."""
    model = s2s if kind == "seq2seq" else llama
    runner = "graphs" if kind == "graphs" else None
    shared, other = prompts(2, seed=21)
    work = [(shared, dict(max_new_tokens=10, stop_ids=[], temperature=0.9 if k else 0.0, seed=k))
            for k in range(5)] + [(other, dict(max_new_tokens=10, stop_ids=[]))]
    engine = Engine(model, slots=8, runner=runner)
    calls = []
    prefill = engine.runner.prefill
    engine.runner.prefill = lambda slots, ids, start=0: calls.append(len(slots)) or prefill(slots, ids, start)
    handles = [engine.submit(Request(ids, **s)) for ids, s in work]
    engine.run()
    assert sum(calls) == 2
    for (ids, settings), g in zip(work, handles, strict=True):
        lone = Engine(model, slots=8, runner=runner)
        expected = lone.submit(Request(ids, **settings))
        lone.run()
        assert g.tokens == expected.tokens, settings
    assert len({tuple(g.tokens) for g in handles[1:5]}) > 1  # the samples differ: each its own seed
