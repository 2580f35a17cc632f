"""Several LoRA adapters over one base (generation/adapters.py, ``lmforge serve --adapter NAME=DIR``).

What the tests hold, on a tiny Llama-shaped base and two adapter directories written as ``finetune --task chat
--strategy lora`` writes them (``save_finetuned``), with random nonzero A and B, other ranks and other targets:

- one batch mixing base, adapter 1 and adapter 2 requests, on the eager, cpu and graphs runners: each request's
  greedy tokens equal that adapter merged into the base (``load_finetuned``: ``merge_lora``) and decoded alone, its
  logits close to the merged model's (the merged product rounds differently), and a base row's logits bit-equal to
  the same engine's with the request alone (index 0 adds exact zeros; cpu and graphs runners, whose products keep a
  row's bits whatever its neighbours); the CPU's one compiled step gives the cpu runner's tokens; a row's adapter
  follows it when compaction moves it;
- a bad adapter is one line at start: another base (sha256), another strategy, a trained head, a NAME=DIR typo,
  a name twice, a quantized base;
- through the HTTP API: /v1/models lists the base and each adapter, a request's model picks one, two adapters
  answer differently in one server, each as its merged model served alone; an unknown name is 404; the same in
  the two-process server (the request crosses the pipe).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from lmforge.errors import LmforgeError
from lmforge.generation.engine import Engine, Request
from lmforge.interop.directories import load, load_finetuned, save_finetuned, weights_sha256
from lmforge.models import save_pretrained
from lmforge.models.strategies import StrategySpec, apply_decoder_strategy
from lmforge.nn.lora import LoRALinear
from lmforge.workflows.options import ServeOptions
from lmforge.workflows.serving import add_adapters
from serve_helpers import chat_model

ADAPTERS = {  # name: (rank, alpha, targets)
    "poems": (4, 8.0, ["*.in_proj", "*.out_proj"]),
    "sums": (2, 6.0, ["*.ffn.fc1", "*.in_proj"]),
}
PROMPTS = [[5, 9, 14, 30, 2], [7, 7, 21], [40, 3, 3, 18, 9, 11, 60], [12, 50], [33, 8, 1, 90], [70, 71, 72]]
USES = [0, 1, 2, 1, 0, 2]  # the adapter of each prompt: 0 the base


@pytest.fixture(autouse=True, scope="module")
def _one_thread(single_thread):
    """One torch thread (conftest.py)."""


def write_adapter(base: Path, out: Path, rank: int, alpha: float, targets: list[str], seed: int,
                  strategy: str = "lora", train_head: bool = False) -> Path:
    """A LoRA directory as ``finetune --task chat`` saves one, its A and B random and nonzero."""
    model, tok = load(base)
    spec = StrategySpec(strategy="lora", lora_r=rank, lora_alpha=alpha, lora_targets=targets)
    model = apply_decoder_strategy(model, spec)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, LoRALinear):
                m.lora_A.copy_(torch.randn(m.lora_A.shape, generator=g) * 0.3)
                m.lora_B.copy_(torch.randn(m.lora_B.shape, generator=g) * 0.3)
    if train_head:
        model.lm_head.proj.weight.requires_grad_(True)
    info = {"task": "chat", "strategy": strategy, "labels": [], "base_model": str(base),
            "base_model_sha256": weights_sha256(base), "max_len": 256, "mix": False,
            "lora": {"r": rank, "alpha": alpha, "dropout": 0.0, "targets": targets}, "adapter": {"size": 64}}
    save_finetuned(model, tok, out, info)
    return out


@pytest.fixture(scope="module")
def dirs(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("adapters")
    base = chat_model(root / "base")
    out = {"base": base}
    for k, (name, (rank, alpha, targets)) in enumerate(ADAPTERS.items()):
        out[name] = write_adapter(base, root / name, rank, alpha, targets, seed=k + 1)
    return out


def served_base(dirs: dict[str, Path]) -> torch.nn.Module:
    """The base with both adapters over it, as ``serve --adapter`` loads it."""
    model, _ = load(dirs["base"])
    add_adapters(model, dirs["base"], ServeOptions(adapter=[f"{name}={dirs[name]}" for name in ADAPTERS]))
    return model


def decode(model: torch.nn.Module, prompts: list[list[int]], adapters: list[int], runner: str,
           slots: int = 8) -> list:
    engine = Engine(model, slots=slots, capacity=64, runner=runner)
    engine.warmup()
    gens = [engine.submit(Request(p, max_new_tokens=10, keep_logits=True, stop_ids=[], adapter=a))
            for p, a in zip(prompts, adapters, strict=True)]
    engine.run()
    return gens


@pytest.mark.parametrize("runner", ["eager", "cpu", "graphs"])
def test_mixed_batch_rows_equal_each_adapter_merged_and_decoded_alone(dirs, runner):
    model = served_base(dirs)
    mixed = decode(model, PROMPTS, USES, runner)
    merged = {0: load(dirs["base"])[0], **{k: load_finetuned(dirs[name])[0]
                                           for k, name in enumerate(ADAPTERS, start=1)}}
    changed = 0
    for prompt, k, got in zip(PROMPTS, USES, mixed, strict=True):
        (alone,) = decode(merged[k], [prompt], [0], runner, slots=1)
        assert got.tokens == alone.tokens, (runner, k)
        for a, b in zip(got.logits, alone.logits, strict=True):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
        changed += k and got.tokens != decode(merged[0], [prompt], [0], runner, slots=1)[0].tokens
        if k == 0 and runner != "eager":  # the base's row: bit-equal to the same engine with the request alone
            # (the eager runner's plain BLAS products give a row other bits beside others, adapters or not)
            (lone,) = decode(model, [prompt], [0], runner)
            assert all(torch.equal(a, b) for a, b in zip(got.logits, lone.logits, strict=True))
    assert changed >= 3  # the adapters do change the replies (the test would pass with no update at all)


def test_the_cpus_one_compiled_step_reads_the_rows_adapters(dirs):
    """``--compile`` on a CPU: the step compiled once for every row count reads the selector's rows as an input."""
    model = served_base(dirs)
    engine = Engine(model, slots=8, capacity=64, compile=True)
    assert engine.runner.name == "cpu, one compiled step" and engine.warmup() == 1
    gens = [engine.submit(Request(p, max_new_tokens=10, stop_ids=[], adapter=a)) for p, a in zip(PROMPTS, USES,
                                                                                                  strict=True)]
    engine.run()
    assert [g.tokens for g in gens] == [g.tokens for g in decode(model, PROMPTS, USES, "cpu")]


def test_a_rows_adapter_follows_it_through_compaction(dirs):
    """A request that ends early frees its slot; the rows above move down (``runner.move``) with their adapters."""
    model = served_base(dirs)
    engine = Engine(model, slots=4, capacity=64, runner="cpu")
    short = engine.submit(Request(PROMPTS[0], max_new_tokens=2, stop_ids=[], keep_logits=True))
    rest = [engine.submit(Request(p, max_new_tokens=10, stop_ids=[], keep_logits=True, adapter=a))
            for p, a in zip(PROMPTS[1:4], USES[1:4], strict=True)]
    engine.run()
    assert short.done
    for gen, prompt, k in zip(rest, PROMPTS[1:4], USES[1:4], strict=True):
        (alone,) = decode(model, [prompt], [k], "cpu")
        assert gen.tokens == alone.tokens


def test_one_prompt_under_two_adapters_shares_neither_a_prefill_nor_a_cached_prefix(dirs):
    """The same tokens have other keys and values under another adapter: arrivals with one prompt share a prefill
    only under one adapter, and the prefix cache files each block under its adapter too."""
    model = served_base(dirs)
    prompt = list(range(5, 45))  # 40 tokens: 4 blocks of 8 cached
    alone = {k: decode(model, [prompt], [k], "cpu")[0].tokens for k in (0, 1)}
    engine = Engine(model, slots=4, capacity=64, runner="cpu", prefix_blocks=32)
    for k in (1, 0, 1):  # one after another: the second finds the first's blocks only if they ignore the adapter
        g = engine.submit(Request(prompt, max_new_tokens=10, stop_ids=[], adapter=k))
        engine.run()
        assert g.tokens == alone[k]
    assert engine.runner.prefix.hits == 32  # the third, from the first's blocks
    together = [engine.submit(Request(prompt, max_new_tokens=10, stop_ids=[], adapter=k)) for k in (0, 1, 1)]
    engine.run()
    assert [g.tokens for g in together] == [alone[0], alone[1], alone[1]]


def test_an_unknown_adapter_index_is_one_line(dirs):
    engine = Engine(served_base(dirs), slots=2, capacity=64, runner="eager")
    with pytest.raises(LmforgeError, match=r"^adapter: 3 is not one of this model's adapters \(0: none, 1: poems"):
        engine.submit(Request([1, 2], adapter=3))


def one_line(dirs: dict[str, Path], *adapters: str) -> str:
    model, _ = load(dirs["base"])
    with pytest.raises(LmforgeError) as err:
        add_adapters(model, dirs["base"], ServeOptions(adapter=list(adapters)))
    assert "\n" not in str(err.value)
    return str(err.value)


def test_bad_adapters_are_one_line_at_start(dirs, tmp_path):
    other, tok = load(chat_model(tmp_path / "other-base"))  # same shapes, other weights
    with torch.no_grad():
        other.tok_emb.weight.add_(0.01)
    save_pretrained(other, tmp_path / "other-base", tok)
    other = tmp_path / "other-base"
    foreign = write_adapter(other, tmp_path / "foreign", 2, 4.0, ["*.in_proj"], seed=5)
    assert "trained on another base model" in one_line(dirs, f"f={foreign}")
    wrong = write_adapter(dirs["base"], tmp_path / "wrong", 2, 4.0, ["*.in_proj"], seed=6)
    config = json.loads((wrong / "adapter_config.json").read_text())
    (wrong / "adapter_config.json").write_text(json.dumps({**config, "strategy": "adapter"}))
    from lmforge.manifest import write_manifest  # rewritten as finetune would have written it

    write_manifest(wrong, ["adapter.safetensors", "adapter_config.json", "tokenizer.json"])
    assert "strategy 'adapter'" in one_line(dirs, f"w={wrong}")
    head = write_adapter(dirs["base"], tmp_path / "head", 2, 4.0, ["*.in_proj"], seed=7, train_head=True)
    assert "is not a LoRA factor" in one_line(dirs, f"h={head}")  # the head (tied: tok_emb.weight)
    assert "is not NAME=DIR" in one_line(dirs, str(dirs["poems"]))
    quantized, _ = load(dirs["base"], dtype="int8")
    with pytest.raises(LmforgeError, match=r"is a QuantizedLinear in the base, not a float nn\.Linear"):
        add_adapters(quantized, dirs["base"], ServeOptions(adapter=[f"p={dirs['poems']}"]))
    assert "a name given twice" in one_line(dirs, f"a={dirs['poems']}", f"a={dirs['sums']}")


QUESTION = [{"role": "user", "content": "what is the capital of france?"}]
NAMES = ["base", "poems", "sums", "poems", "base", "sums"]  # one question asked of each model, all at once: one
# prompt under three adapters (never one prefill shared, never one prefix-cache entry)


def ask_all(url: str, names: list[str]) -> list[str | None]:
    """The greedy chat replies to QUESTION under each model of ``names``, all sent at once."""
    import threading

    import openai

    replies: list[str | None] = [None] * len(names)

    def ask(i: int) -> None:
        c = openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0)
        answer = c.chat.completions.create(model=names[i], messages=QUESTION, temperature=0, max_tokens=12)
        assert answer.model == names[i]
        replies[i] = answer.choices[0].message.content

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(len(names))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    return replies


def flags(dirs: dict[str, Path]) -> list[str]:
    return [f"{name}={dirs[name]}" for name in ADAPTERS]


def test_two_adapters_answer_in_one_server_each_as_its_merged_model_alone(dirs):
    openai = pytest.importorskip("openai", reason="the openai client (dev extra) is the real client")
    pytest.importorskip("fastapi", reason="the server needs the serve extra (pip install 'lmforge[serve]')")
    from serve_helpers import live_server

    with live_server(dirs["base"], slots=4, adapter=flags(dirs)) as (url, _):
        c = openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0)
        listed = c.models.list().data
        assert [m.id for m in listed] == ["base", "poems", "sums"]
        assert [getattr(m, "parent", None) for m in listed] == [None, "base", "base"]
        together = ask_all(url, NAMES)
        with pytest.raises(openai.NotFoundError) as missing:
            c.chat.completions.create(model="poetry", messages=QUESTION, max_tokens=2)
        assert missing.value.code == "model_not_found"
        echoed = c.completions.create(model="sums", prompt="the cat sat", echo=True, logprobs=1, max_tokens=0)
    assert together[1] == together[3] is not None and together[1] != together[0] != together[2] != together[1]
    for name in ["base", *ADAPTERS]:  # each merged into the base (load_finetuned) and served alone
        with live_server(dirs[name], slots=1) as (url, _):
            alone = ask_all(url, [name])[0]
            assert [r for r, n in zip(together, NAMES, strict=True) if n == name] == [alone, alone]
            if name == "sums":
                c = openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0)
                merged = c.completions.create(model=name, prompt="the cat sat", echo=True, logprobs=1, max_tokens=0)
                assert echoed.choices[0].logprobs.token_logprobs[1:] == pytest.approx(
                    merged.choices[0].logprobs.token_logprobs[1:], abs=1e-4)


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="reads the process tree from Linux's /proc")
def test_adapters_in_the_two_process_server(dirs):
    """``lmforge serve --adapter`` as a user starts it, the HTTP server in a process of its own: the request's
    adapter crosses the pipe."""
    pytest.importorskip("openai", reason="the openai client (dev extra) is the real client")
    pytest.importorskip("requests", reason="requests (dev extra) polls /health")
    from serve_helpers import live_server
    from test_serve_split import start, stop

    with live_server(dirs["base"], slots=4, adapter=flags(dirs)) as (url, _):
        in_one = ask_all(url, NAMES)
    proc, url = start(dirs["base"], "--slots", "4", *(f for a in flags(dirs) for f in ("--adapter", a)))
    try:
        assert ask_all(url, NAMES) == in_one
    finally:
        stop(proc)
