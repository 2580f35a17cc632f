"""The torch floor in pyproject.toml is the newest torch API the code uses, proven on the source.

Only one torch is installed here (newer than the floor) and other versions are gigabytes to download, so the floor
cannot be proven by importing lmforge on it. Instead: ``SINCE`` names every torch API that ``src/`` uses, with the
release that introduced it (from torch's release notes and the pull requests that added it); a scan of ``src/``
finds every torch name used (through any import alias), every keyword given to a torch callable, and the methods
of a custom operator; the test fails when the scan finds an API the table does not cover, and when the floor is
not the newest release the used APIs need. A new torch API in the code therefore fails here until its release is
written down, and the floor follows.

Not covered: methods called on tensors and modules (``x.untyped_storage()``), which a static scan cannot type.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import re
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"
UNIVERSAL_KEYWORDS = {"dtype", "device", "dim"}  # given to tensor factories and reductions since torch 1.0

# release -> the APIs it introduced, "module: name name ..." per line. A keyword is written ``callable(keyword=)``;
# a keyword not listed is covered by its callable's line. (2, 0) holds everything torch 2.0 already had. Some rows
# name APIs the code does not use yet (torch.accelerator, flex_attention, ...): a future use is then already dated.
SINCE_TEXT = {
    (2, 0): """
        torch: Generator Size Tensor arange argsort as_tensor autocast cat compile cos device dtype einsum empty
               empty_like enable_grad from_numpy frombuffer full full_like get_num_threads get_rng_state inference_mode
               is_grad_enabled isfinite isin load log log_softmax lstm manual_seed matmul no_grad nonzero ones
               ones_like save set_num_threads set_rng_state sigmoid sin softmax sort stack tanh tanh_ tensor where
               zeros zeros_like
        torch: bfloat16 bool float16 float32 float64 int8 int16 int32 int64 long uint8
        torch: eye maximum round addmm randn
        torch.randn: (generator=)
        torch.add: (alpha=)
        torch.mul: (out=)
        torch._dynamo: mark_dynamic
        torch.backends.cuda.matmul: allow_tf32
        torch.backends.cudnn: allow_tf32
        torch.backends.mkldnn: is_available
        torch.backends.mps: is_available
        torch.cuda: device_count get_rng_state_all is_available is_bf16_supported is_initialized
                    max_memory_allocated set_device set_rng_state_all
        torch.cuda: CUDAGraph Stream current_stream graph graph_pool_handle stream Event
        torch.cuda.Event: (enable_timing=)
        torch.cuda.graph: (pool=)
        torch: allclose bmm
        torch.allclose: (atol=) (rtol=)
        torch.distributed: all_gather_object all_reduce barrier destroy_process_group init_process_group
                           is_available is_initialized
        torch.distributed.ReduceOp: SUM
        torch.distributed.fsdp: FullyShardedDataParallel
        torch.distributed.fsdp.ShardingStrategy: FULL_SHARD
        torch.distributed.fsdp.wrap: ModuleWrapPolicy
        torch.nn: Conv1d Dropout Embedding Identity LayerNorm Linear Module ModuleList Parameter
        torch.nn.functional: cosine_similarity cross_entropy dropout embedding gelu layer_norm linear log_softmax
                             normalize pad relu
                             scaled_dot_product_attention silu
        torch.nn.init: kaiming_uniform_ normal_ ones_ uniform_ xavier_uniform_ zeros_
        torch.nn.parallel: DistributedDataParallel
        torch.nn.utils: clip_grad_norm_
        torch.nn.utils.rnn: pack_padded_sequence pad_packed_sequence
        torch.ops.mkldnn: _linear_pointwise.default _linear_pointwise.binary _reorder_linear_weight
        torch.optim: AdamW Optimizer
        torch.overrides: TorchFunctionMode
        torch.utils.tensorboard: SummaryWriter
        torch.utils.checkpoint: checkpoint
        torch.utils.checkpoint.checkpoint: (use_reentrant=)
        torch.load: (weights_only=)
    """,
    (2, 1): """
        torch._dynamo: mark_static mark_static_address
        torch.nn.LayerNorm: (bias=)
        torch.nn.functional.scaled_dot_product_attention: (scale=)
        torch: export
    """,
    (2, 2): """
        torch.distributed.checkpoint.state_dict: StateDictOptions get_model_state_dict get_optimizer_state_dict
                                                 set_optimizer_state_dict set_model_state_dict
    """,
    (2, 3): """
        torch.ops.aten: _weight_int8pack_mm
        torch.amp: GradScaler
        torch.compiler: is_compiling
        torch: get_default_device
        torch.nn.attention: sdpa_kernel SDPBackend
        torch.nn.attention.SDPBackend: FLASH_ATTENTION EFFICIENT_ATTENTION MATH
    """,
    (2, 4): """
        torch.library: custom_op register_fake
        torch.library.custom_op: (mutates_args=) ().register_fake
        torch.nn: RMSNorm
        torch.nn.attention.SDPBackend: CUDNN_ATTENTION
        torch.nn.functional: rms_norm
        torch.optim.AdamW: (fused=)
        torch.serialization: add_safe_globals
    """,
    (2, 5): """
        torch.nn.functional.scaled_dot_product_attention: (enable_gqa=)
        torch.nn: Buffer
        torch.nn.attention.flex_attention: flex_attention create_block_mask
    """,
    (2, 6): """
        torch.ops.aten: _convert_weight_to_int4pack_for_cpu _weight_int4pack_mm_for_cpu
        torch: accelerator
        torch.compiler: set_stance
        torch.nn.attention.sdpa_kernel: (set_priority=)
        torch.distributed.fsdp: fully_shard
    """,
    (2, 7): """
        torch._dynamo.config: recompile_limit
    """,
}
# Notes on the non-obvious rows: fused=True on CPU (AdamW) is pytorch#123074, in 2.4 (CUDA had it since 2.0);
# torch._dynamo.config.recompile_limit is the 2.7 name of cache_size_limit (2.6 raises AttributeError on it);
# torch.ops.mkldnn's private kernels are older than 2.0 and the code checks for them with hasattr;
# aten._weight_int8pack_mm (CPU, weight-only int8) came in 2.3 (pytorch#120985); the CPU int4 pair split from
# _weight_int4pack_mm / _convert_weight_to_int4pack into *_for_cpu in 2.6 (torchao switches to them there).


def parse_table(text_by_release: dict[tuple[int, int], str]) -> dict[str, tuple[int, int]]:
    """``{"torch.library.custom_op(mutates_args=)": (2, 4), ...}`` from the "module: names" lines."""
    table: dict[str, tuple[int, int]] = {}
    for release, text in text_by_release.items():
        module = None
        for line in text.strip().splitlines():
            head, colon, names = line.strip().partition(":")
            if colon and not head.startswith("("):
                module, line = head.strip(), names
            for name in line.split():
                full = f"{module}{name}" if name.startswith("(") else f"{module}.{name}"
                assert full not in table, f"{full} is listed twice"
                table[full] = release
    return table


SINCE = parse_table(SINCE_TEXT)


def torch_uses(source: str) -> set[str]:
    """The torch APIs ``source`` uses: dotted names through any import alias (``F.rms_norm`` is
    ``torch.nn.functional.rms_norm``), keywords given to them (``torch.optim.AdamW(fused=)``), and attributes of a
    function a torch decorator returns (``@op.register_fake`` after ``@torch.library.custom_op``:
    ``torch.library.custom_op().register_fake``)."""
    tree = ast.parse(source)
    aliases: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] == "torch":
                    aliases[a.asname or "torch"] = a.name if a.asname else "torch"
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "torch" and not node.level:
            for a in node.names:
                aliases[a.asname or a.name] = f"{node.module}.{a.name}"

    def dotted(node: ast.AST) -> str | None:
        chain = []
        while isinstance(node, ast.Attribute):
            chain.append(node.attr)
            node = node.value
        if isinstance(node, ast.Name) and node.id in aliases:
            return ".".join([aliases[node.id], *reversed(chain)])
        return None

    for node in ast.walk(tree):  # a function decorated by a torch call is that call's product
        if isinstance(node, ast.FunctionDef):
            for decorator in node.decorator_list:
                maker = dotted(decorator.func) if isinstance(decorator, ast.Call) else None
                if maker:
                    aliases[node.name] = f"{maker}()"
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute | ast.Name) and (name := dotted(node)):
            found.add(name)
        if isinstance(node, ast.Call) and (name := dotted(node.func)):
            found.update(f"{name}({k.arg}=)" for k in node.keywords if k.arg and k.arg not in UNIVERSAL_KEYWORDS)
    # keep the longest names: torch.nn.functional.pad, not also torch.nn.functional, torch.nn and torch
    return {n for n in found if not any(other.startswith((n + ".", n + "(")) for other in found)}


def needed(uses: set[str]) -> dict[str, tuple[int, int]]:
    """The release each use needs: its own row, else (a keyword) its callable's row; KeyError when neither."""
    out = {}
    for use in uses:
        key = use if use in SINCE else use.partition("(")[0]
        if key not in SINCE:
            raise KeyError(use)
        out[use] = max(SINCE[key], SINCE.get(use.partition("(")[0], (2, 0)))
    return out


def source_uses() -> dict[str, set[str]]:
    """Every torch API used in src/, with the files that use it."""
    where: dict[str, set[str]] = {}
    for path in sorted(SRC.rglob("*.py")):
        for use in torch_uses(path.read_text(encoding="utf-8")):
            where.setdefault(use, set()).add(path.relative_to(SRC).as_posix())
    return where


def declared_floor() -> tuple[int, int]:
    dependencies = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    (spec,) = [d for d in dependencies if re.match(r"torch\b", d)]
    match = re.search(r">=\s*(\d+)\.(\d+)", spec)
    assert match, f"pyproject.toml: {spec!r} declares no torch floor"
    return int(match[1]), int(match[2])


def test_every_torch_api_the_code_uses_has_its_release_in_the_table():
    where = source_uses()
    unknown = sorted(use for use in where if use not in SINCE and use.partition("(")[0] not in SINCE)
    assert unknown == [], "torch APIs with no release in SINCE (add each with the torch release that introduced " \
        f"it): {[(u, sorted(where[u])) for u in unknown]}"


def test_the_declared_floor_is_the_newest_release_the_code_needs():
    releases = needed(set(source_uses()))
    newest = max(releases.values())
    why = sorted(use for use, release in releases.items() if release == newest)
    assert declared_floor() == newest, f"pyproject.toml says torch>={'.'.join(map(str, declared_floor()))}; " \
        f"the code needs {'.'.join(map(str, newest))} for {why}"


def test_the_scan_sees_through_aliases_keywords_and_custom_operators():
    """Not a tautology: a snippet with each way of reaching an API, and what the scan must report."""
    snippet = '''
import torch
import torch.nn.functional as F
from torch import nn
from torch.library import custom_op

@custom_op("demo::op", mutates_args=())
def op(x: torch.Tensor) -> torch.Tensor:
    return x

@op.register_fake
def _(x):
    return x

def attend(q, k, v):
    torch._dynamo.config.recompile_limit = 8
    return F.scaled_dot_product_attention(q, k, v, enable_gqa=True), nn.RMSNorm(4), torch.zeros(2, dtype=None)
'''
    uses = torch_uses(snippet)
    assert uses == {"torch.Tensor", "torch.library.custom_op(mutates_args=)",
                    "torch.library.custom_op().register_fake", "torch._dynamo.config.recompile_limit",
                    "torch.nn.functional.scaled_dot_product_attention(enable_gqa=)", "torch.nn.RMSNorm", "torch.zeros"}
    releases = needed(uses)
    assert releases["torch.nn.functional.scaled_dot_product_attention(enable_gqa=)"] == (2, 5)
    assert releases["torch.library.custom_op().register_fake"] == (2, 4)
    assert max(releases.values()) == (2, 7)
    with pytest.raises(KeyError, match=r"torch\.nn\.functional\.not_an_api"):
        needed(torch_uses("import torch.nn.functional as F\nF.not_an_api(1)"))


def resolve(name: str):
    """The object a dotted torch name names in the installed torch (the longest importable module, then getattr)."""
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError as err:
            if not (err.name or "torch").startswith("torch"):  # torch.utils.tensorboard needs tensorboard
                pytest.skip(f"{name}: its module needs {err.name}, which is not installed here")
            continue
        for attr in parts[cut:]:
            obj = getattr(obj, attr)
        return obj
    raise ImportError(name)


@pytest.mark.parametrize("api", sorted(SINCE))
def test_every_row_of_the_table_names_a_real_torch_api(api):
    """Each row exists in the installed torch (a misspelt row would cover nothing); a keyword row is a parameter
    of its callable where the callable has a Python signature."""
    name, _, keyword = api.partition("(")
    if keyword.startswith(")"):  # the product of a call: torch.library.custom_op().register_fake
        assert api == "torch.library.custom_op().register_fake"
        from torch._library.custom_ops import CustomOpDef

        assert callable(CustomOpDef.register_fake)
        return
    obj = resolve(name)
    if keyword:
        try:
            parameters = inspect.signature(obj).parameters
        except (TypeError, ValueError):  # a C function without a text signature: its docstring names it
            assert keyword.removesuffix("=)") in (obj.__doc__ or ""), api
            return
        assert keyword.removesuffix("=)") in parameters, api
