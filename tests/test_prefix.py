"""Prefix caching (generation/prefix.py): reused blocks give the bits a full prefill gives, and stay bounded."""

from __future__ import annotations

import pytest
import torch

from lmforge.generation.engine import Engine, Request
from lmforge.generation.prefix import BLOCK
from lmforge.models import Decoder, get_preset

SYSTEM = list(range(10, 10 + 2 * BLOCK + 5))  # a shared beginning: two whole blocks and 5 tokens more


@pytest.fixture(scope="module")
def llama() -> Decoder:
    torch.manual_seed(0)
    config = get_preset("gpt-tiny", vocab_size=300, dropout=0.0, attention_dropout=0.0, positions="rotary",
                        norm="rmsnorm", activation="swiglu", bias=False, n_kv_heads=2, max_positions=256)
    model = Decoder(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.mul_(4.0)  # sharper distributions than the initialisation's
    return model


def questions(n: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(1)
    return [SYSTEM + torch.randint(50, 300, (int(torch.randint(3, 30, (1,), generator=g)),), generator=g).tolist()
            for _ in range(n)]


def run(engine: Engine, prompts: list[list[int]], new: int = 12) -> list:
    handles = [engine.submit(Request(ids, max_new_tokens=new, stop_ids=[], keep_logits=True)) for ids in prompts]
    engine.run()
    return handles


@pytest.mark.parametrize("threads", [1, 2])
def test_a_continued_prefill_gives_the_bits_of_the_whole_prompt(llama, threads):
    """The second question reuses the first one's blocks (2 x BLOCK tokens) and computes only its own end: every
    logit of every step equals the one the engine without a prefix cache computes, bit for bit."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        first, second = questions(2)
        cached = Engine(llama, slots=4, prefix_blocks=8)
        run(cached, [first])
        assert cached.runner.prefix.longest(second) == 2 * BLOCK and cached.runner.prefix.hits == 0
        reused = run(cached, [second])[0]
        assert cached.runner.prefix.hits == 2 * BLOCK  # the second prompt's first 2 x BLOCK tokens were not computed
        plain = run(Engine(llama, slots=4), [second])[0]
        assert reused.tokens == plain.tokens
        assert all(torch.equal(a, b) for a, b in zip(reused.logits, plain.logits, strict=True))
    finally:
        torch.set_num_threads(before)


def test_sixteen_questions_with_one_system_turn_answer_as_they_do_alone(llama):
    """Arrivals in two waves (the second finds the first's blocks) give each question the tokens it gets
    alone in an engine without a prefix cache."""
    work = questions(16)
    engine = Engine(llama, slots=16, prefix_blocks=64)
    first = [engine.submit(Request(ids, max_new_tokens=10, stop_ids=[])) for ids in work[:4]]
    engine.step()  # the first wave is prefilled (and its blocks kept) before the rest arrives
    rest = [engine.submit(Request(ids, max_new_tokens=10, stop_ids=[])) for ids in work[4:]]
    engine.run()
    assert engine.runner.prefix.hits >= 12 * 2 * BLOCK
    for ids, g in zip(work, first + rest, strict=True):
        assert g.tokens == run(Engine(llama, slots=16), [ids], 10)[0].tokens


def test_blocks_are_kept_up_to_the_capacity_least_recently_used_first(llama):
    engine = Engine(llama, slots=4, prefix_blocks=2)
    long = list(range(20, 20 + 3 * BLOCK + 1))  # three whole blocks
    run(engine, [long], 1)
    assert len(engine.runner.prefix.blocks) == 2  # block 0 was dropped first: the chain from the start is broken
    assert engine.runner.prefix.longest(long) == 0
    run(engine, [long[: BLOCK + 3]], 1)  # block 0 again (evicts the least recently used)
    assert engine.runner.prefix.longest(long[: BLOCK + 5]) == BLOCK
    assert engine.runner.prefix.longest(long[:BLOCK]) == 0  # never the whole prompt: its last token is computed


def test_compiled_engines_and_engines_without_blocks_keep_no_prefix(llama):
    assert Engine(llama, slots=4, prefix_blocks=8, runner="compiled").runner.prefix is None
    assert Engine(llama, slots=4).runner.prefix is None


def test_a_block_dropped_between_grouping_and_prefill_costs_time_not_answers(llama):
    """One block of room: each prompt's blocks push out the others' (kept after every group of the step is
    prefilled, so none a group counted on is gone); every request still answers, with the tokens it gets alone."""
    work = questions(6)
    engine = Engine(llama, slots=8, prefix_blocks=1)
    run(engine, work[:1], 1)  # block 0 of the shared beginning is kept
    handles = run(engine, work[1:], 6)
    assert all(g.finish_reason == "length" for g in handles)
    for ids, g in zip(work[1:], handles, strict=True):
        assert g.tokens == run(Engine(llama, slots=8), [ids], 6)[0].tokens
