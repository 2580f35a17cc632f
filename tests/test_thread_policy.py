"""The CPU runner's thread policy (runners/threads.py ``ThreadPolicy``): a step's thread count chosen by
measurement, never changing a token."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
import torch

from lmforge.cores import OtherLoad
from lmforge.generation.engine import Engine, Request
from lmforge.generation.runners.threads import ThreadPolicy
from lmforge.models import Decoder, get_preset


@pytest.fixture
def two_threads():
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


def run_steps(policy: ThreadPolicy, cost: dict[int, float], n: int, now: list[float]) -> list[int]:
    """n steps under the policy on a fake clock, each costing cost[threads it ran on]; the counts used."""
    used = []
    for _ in range(n):
        with policy.step():
            threads = torch.get_num_threads()
            used.append(threads)
            now[0] += cost[threads]
    return used


def test_the_policy_keeps_the_faster_count_and_follows_the_machine(two_threads):
    """A second thread that only waits (a 2-thread step 3x slower than a 1-thread one: another process holds a
    core) is dropped after the first probe; when the machine frees up, the next probe takes it back. The first
    step at a new count is not timed (the threads that stopped still spin). The global count is restored after
    every step. The first probe comes early (after ``probe`` steps), the others every ``period`` steps."""
    now = [0.0]
    policy = ThreadPolicy(2, every=8, probe=2, clock=lambda: now[0])
    used = run_steps(policy, {2: 0.030, 1: 0.010}, 10, now)
    assert used == [2, 2, 1, 1, 1] + [1] * 5 and policy.current == 1 and torch.get_num_threads() == 2
    used = run_steps(policy, {2: 0.004, 1: 0.010}, 24, now)
    # 3 more steps at 1 make the period; a probe of 2 (one untimed step, two timed) switches; 8 steps later a
    # probe of 1 loses at its first timed step and ends there, and the period doubles
    assert used == [1] * 3 + [2] * 3 + [2] * 8 + [1, 1] + [2] * 8
    assert policy.current == 2 and policy.switches == 2 and policy.period == 16


def test_steps_start_at_one_thread_and_a_busy_machine_costs_one_slow_step(two_threads):
    """A one-slot engine's start: one thread, then a probe of two after ``probe`` steps. Where a second thread
    only waits (its steps 10x slower), the probe costs one step (its first, untimed, but 3x slower than the usual
    is lost already), and one thread stays, the period doubled; where it is free, two threads are kept after the
    probe. Prefills run at two threads until the first decision, then at the count the steps run at. An engine of
    more slots starts at two."""
    model = Decoder(get_preset("gpt-tiny", vocab_size=300, n_layers=2, dropout=0.0, attention_dropout=0.0)).eval()
    assert Engine(model, slots=1).runner.threads.current == 1 and Engine(model, slots=4).runner.threads.current == 2
    now = [0.0]
    busy = ThreadPolicy(2, every=8, probe=2, clock=lambda: now[0], start=1)
    with busy.follow():
        assert torch.get_num_threads() == 2
    used = run_steps(busy, {2: 0.100, 1: 0.010}, 12, now)
    # the first step, after the prefill's two threads, is not timed: the probe comes after 3 steps, and its own
    # untimed first step, 10x the usual, ends it
    assert used == [1, 1, 1, 2] + [1] * 8 and busy.current == 1 and busy.period == 16 and busy.decisions == 1
    with busy.follow():
        assert torch.get_num_threads() == 1
    free = ThreadPolicy(2, every=8, probe=2, clock=lambda: now[0], start=1)
    used = run_steps(free, {2: 0.004, 1: 0.010}, 8, now)
    assert used == [1, 1, 2, 2, 2] + [2] * 3 and free.current == 2 and free.switches == 1


class FakeLoad:
    """``OtherLoad`` as a test sets it: ``busy`` cores kept by other processes (None: too soon to tell). Like the
    real one, it answers once a window: asked again before ``renew``, it cannot tell yet."""

    available = True

    def __init__(self, busy: float | None, cpus: int = 2) -> None:
        self.busy, self.cpus, self.asked, self.fresh = busy, cpus, 0, True

    def renew(self) -> None:
        self.fresh = True

    def room(self) -> float | None:
        self.asked += 1
        fresh, self.fresh = self.fresh, False
        return None if self.busy is None or not fresh else self.cpus - self.busy


def test_while_other_processes_hold_a_core_no_step_and_no_prefill_runs_at_two_threads(two_threads):
    """A one-slot engine's start beside a process that keeps a core busy: a prefill before the first decision runs
    on one thread once the machine can tell (the first, asked too soon, on both as before), and the probe of two
    threads is put off while the machine says the core is busy (asked every ``probe`` steps), so no step pays for
    a second thread that would only wait. When the core frees, the
    next look lets the probe run, and two threads win it. A look too short to tell puts the probe off too."""
    now = [0.0]
    load = FakeLoad(busy=1.0)
    policy = ThreadPolicy(2, every=8, probe=2, clock=lambda: now[0], start=1, load=load)
    load.fresh = False  # a new engine's first prompt, too soon to tell: all the threads, as before anything is known
    with policy.follow():
        assert torch.get_num_threads() == 2
    load.renew()
    with policy.follow():
        assert torch.get_num_threads() == 1
    used = []
    for _ in range(10):  # a fresh look every 2 steps
        load.renew()
        used += run_steps(policy, {2: 0.100, 1: 0.010}, 2, now)
    assert used == [1] * 20 and policy.decisions == 0 and load.asked == 2 + 9  # the prefills', then every 2 steps
    load.busy = None  # too soon to tell: still put off
    assert run_steps(policy, {2: 0.004, 1: 0.010}, 2, now) == [1, 1]
    load.busy = 0.1  # the other process ended; the look at the probe's start answers, later ones could not
    load.renew()
    assert run_steps(policy, {2: 0.004, 1: 0.010}, 6, now) == [2, 2, 2, 2, 2, 2] and policy.current == 2
    # at two threads, a probe of one thread costs nothing on a busy core: it runs without asking
    asked, load.busy = load.asked, 1.0
    run_steps(policy, {2: 0.030, 1: 0.010}, 12, now)
    assert policy.current == 1 and load.asked == asked


def test_a_probe_due_right_after_a_prompt_on_all_the_threads_still_asks_the_machine(two_threads):
    """A prompt that ran on both threads because its look came too soon to tell, then a step whose probe is due:
    the probe of two threads asks the machine like any other (a busy core puts it off), and once under way it is
    not asked again."""
    now = [0.0]
    load = FakeLoad(busy=1.0)
    policy = ThreadPolicy(2, every=8, probe=2, clock=lambda: now[0], start=1, load=load)
    assert run_steps(policy, {2: 0.100, 1: 0.010}, 2, now) == [1, 1]  # the probe is due from here
    load.fresh = False
    with policy.follow():
        assert torch.get_num_threads() == 2
    load.renew()
    assert run_steps(policy, {2: 0.100, 1: 0.010}, 1, now) == [1] and load.asked == 2
    load.busy = 0.0
    load.renew()
    assert run_steps(policy, {2: 0.004, 1: 0.010}, 4, now) == [1, 2, 2, 2] and load.asked == 3
    assert policy.current == 2 and policy.decisions == 1


def test_the_load_the_machine_reports_counts_other_processes_not_this_one():
    """``OtherLoad`` on this machine: a child process spinning while this one sleeps 0.5 s is at least half a
    core of others' load; this process spinning for 0.5 s is its own time, not counted (well under the core it
    kept busy). A look sooner than ``least`` answers None. Where there is no /proc (not Linux), nothing can be
    told and the policy probes without asking."""
    load = OtherLoad(least=0.2)
    if not load.available:
        pytest.skip("no /proc/stat here (not Linux): the policy probes without asking")
    assert load.busy_cores() is None  # 0 s after the first look, and no window before it
    spin = "import time\nprint('spinning', flush=True)\nt = time.time()\nwhile time.time() - t < 1.0: pass"
    spinner = subprocess.Popen([sys.executable, "-c", spin], stdout=subprocess.PIPE, text=True)
    try:
        assert spinner.stdout.readline().strip() == "spinning"  # the window starts once it spins, however slow
        load = OtherLoad(least=0.2)  # its start (a slow host's) is not in the window
        time.sleep(0.5)
        assert load.busy_cores() >= 0.5
        assert load.busy_cores() == load.answer >= 0.5  # asked again at once: the last window's answer
    finally:
        spinner.wait(timeout=10)
    load.busy_cores()  # a fresh window
    began = time.monotonic()
    while time.monotonic() - began < 0.5:
        pass
    assert load.busy_cores() < 0.9


def test_probes_that_lose_cost_less_and_less(two_threads):
    """On a machine where one count always wins, each probe of the other ends at its first timed step and the
    period doubles up to 8x: 140 steps spend 12 on probes instead of 2 * 2 every 4 steps (70)."""
    now = [0.0]
    policy = ThreadPolicy(2, every=4, probe=2, clock=lambda: now[0])
    used = run_steps(policy, {2: 0.004, 1: 0.010}, 140, now)
    assert used.count(1) == 12 and policy.period == 32 and policy.switches == 0


def test_steps_that_became_slower_than_at_the_decision_bring_the_probe_forward(two_threads):
    """A decision taken in a lucky window (2 threads looked fast) or a core taken later: once the count's steps
    run 1.5x slower than when it was kept, the next probe comes at once, not after the (doubled) period."""
    now = [0.0]
    policy = ThreadPolicy(2, every=64, probe=2, clock=lambda: now[0])
    used = run_steps(policy, {2: 0.004, 1: 0.006}, 4, now)  # free: 2 threads kept, the period doubles
    assert used == [2, 2, 1, 1] and policy.current == 2 and policy.period == 128
    used = run_steps(policy, {2: 0.018, 1: 0.006}, 8, now)  # a core taken: one slow step timed, then a probe
    assert used == [2, 2] + [1] * 6 and policy.current == 1  # (the first step back at 2 is not timed)


def test_a_count_within_10_percent_is_not_worth_a_switch(two_threads):
    now = [0.0]
    policy = ThreadPolicy(2, every=4, probe=2, clock=lambda: now[0])
    run_steps(policy, {2: 0.010, 1: 0.0095}, 30, now)
    assert policy.current == 2 and policy.switches == 0


def test_switching_threads_changes_no_logit(two_threads):
    """The same requests decoded by a CPU engine whose policy probes every other step (1 and 2 threads in turn)
    and by one on 2 threads throughout: every logit the same bits (packed products)."""
    torch.manual_seed(0)
    model = Decoder(get_preset("gpt-tiny", vocab_size=300, n_layers=2, positions="rotary", norm="rmsnorm",
                               activation="swiglu", bias=False, n_kv_heads=2, dropout=0.0,
                               attention_dropout=0.0)).eval()
    work = [[(7 * k + j) % 290 + 5 for j in range(5 + 3 * k)] for k in range(4)]

    def logits(policy: ThreadPolicy | None) -> list[torch.Tensor]:
        engine = Engine(model, slots=4)
        assert engine.runner.threads is not None  # packed float32 on 2 threads: the policy is on
        engine.runner.threads = policy
        handles = [engine.submit(Request(ids, max_new_tokens=12, stop_ids=[], keep_logits=True)) for ids in work]
        engine.run()
        return [torch.stack(h.logits) for h in handles]

    flipping = ThreadPolicy(2, every=1, probe=1)
    flipping.record = lambda *_, **__: setattr(flipping, "current", flipping.other())  # every step flips
    assert all(torch.equal(a, b) for a, b in zip(logits(flipping), logits(None), strict=True))


def test_switching_threads_changes_no_sampled_token(two_threads):
    """Sampling (temperature, top-k, top-p, seeds) runs at the policy's count too: the same tokens whether the
    count flips every step or stays at 2."""
    torch.manual_seed(0)
    model = Decoder(get_preset("gpt-tiny", vocab_size=50000, n_layers=2, dropout=0.0,
                               attention_dropout=0.0)).eval()

    def tokens(policy: ThreadPolicy | None) -> list[list[int]]:
        engine = Engine(model, slots=8)
        engine.runner.threads = policy
        handles = [engine.submit(Request([5 + i, 7, 9], max_new_tokens=8, temperature=1.0, top_p=0.9, top_k=100,
                                         seed=i, stop_ids=[])) for i in range(8)]
        engine.run()
        return [h.tokens for h in handles]

    flipping = ThreadPolicy(2, every=1, probe=1)
    flipping.record = lambda *_, **__: setattr(flipping, "current", flipping.other())  # every step flips
    assert tokens(flipping) == tokens(None)


def test_an_engines_probes_end_with_a_decision(two_threads):
    """In a real engine (each step's token chosen between two steps, at the count that step ran at), a probe's
    steps are timed and end with a decision: the choice between steps once reset the count and left every probe
    step untimed, a probe at one thread that never ended."""
    torch.manual_seed(0)
    model = Decoder(get_preset("gpt-tiny", vocab_size=300, n_layers=2, dropout=0.0, attention_dropout=0.0)).eval()
    engine = Engine(model, slots=2)
    policy = engine.runner.threads = ThreadPolicy(2, every=4, probe=2)
    engine.submit(Request([5, 7, 9], max_new_tokens=40, stop_ids=[]))
    engine.run()
    assert policy.decisions >= 3


@pytest.mark.parametrize(("busy", "inside"), [(1.0, 1), (0.1, 2), (None, 2)])
def test_fitting_threads_leaves_a_busy_core_to_its_process(two_threads, busy, inside):
    """``fitting_threads``: torch's work on the threads whose cores other processes left free since the last look;
    all of them when the look came too soon to tell (None); the count restored after."""
    from lmforge.cores import fitting_threads

    with fitting_threads(FakeLoad(busy)):
        assert torch.get_num_threads() == inside
    assert torch.get_num_threads() == 2


@pytest.mark.parametrize("kind", ["gguf", "directory"])
def test_a_load_quantizes_on_one_thread_while_another_process_holds_a_core(two_threads, kind, tmp_path,
                                                                           monkeypatch):
    """Loading beside another process's busy core (int8 from SmolLM2's Q4_1 file: 3.4 s on two threads, 1.9 s on
    one): each layer is quantized on the one free core, the GGUF's layers as they are read and a directory's
    after it is read; the process's look at the machine (``machine()``), taken when the load began, is the one
    the engine's first prompt asks next. On a free machine both threads quantize."""
    import lmforge.cores
    import lmforge.nn.quant as quant
    from lmforge.interop.gguf_write import write_gguf
    from lmforge.interop.llama import llama_config_from_decoder, llama_state_from_decoder
    from lmforge.models.registry import save_pretrained
    from test_gguf import byte_tokenizer, tiny_llama

    model = tiny_llama(tie=True)
    if kind == "gguf":
        path = write_gguf(tmp_path / "m.gguf", llama_config_from_decoder(model.config),
                          llama_state_from_decoder(model.state_dict(), model.config), byte_tokenizer(), dtype="f32")
    else:
        path = tmp_path / "m"
        save_pretrained(model, path)
    seen: list[int] = []
    for name in ("quantized_layer", "quantize"):
        real = getattr(quant, name)
        monkeypatch.setattr(quant, name, lambda *a, real=real, **k: seen.append(torch.get_num_threads()) or
                            real(*a, **k))
    class Steady(FakeLoad):  # OtherLoad asked twice within moments: the last window's answer again
        def room(self) -> float | None:
            self.fresh = True
            return super().room()

    for busy, threads in ((1.0, 1), (0.0, 2)):
        monkeypatch.setattr(lmforge.cores, "SHARED", [Steady(busy)])
        seen.clear()
        loaded, _ = lmforge.load(path, dtype="int8", tokenizer=False)
        assert seen and set(seen) == {threads} and torch.get_num_threads() == 2
        assert any(isinstance(m, quant.QuantizedLinear) for m in loaded.modules())


def test_an_engine_made_beside_a_busy_core_keeps_its_policy_of_two_threads(two_threads, monkeypatch):
    """The CPU runner fills its caches on the threads whose cores are free (one, here), but its thread policy
    counts torch's threads (two): the probe of two threads stays possible once the other process ends."""
    import lmforge.cores

    monkeypatch.setattr(lmforge.cores, "SHARED", [FakeLoad(busy=1.0)])
    model = Decoder(get_preset("gpt-tiny", vocab_size=300, n_layers=2, dropout=0.0, attention_dropout=0.0)).eval()
    runner = Engine(model, slots=1).runner
    assert runner.threads is not None and runner.threads.counts == (2, 1) and runner.threads.current == 1
    assert torch.get_num_threads() == 2
