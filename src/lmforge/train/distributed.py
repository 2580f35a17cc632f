"""Data parallelism on PyTorch's own engine: DDP or FSDP under ``torchrun``.

``torchrun`` starts one process per device and tells each who it is through the environment::

    RANK        0 .. WORLD_SIZE-1, this process among all processes of all nodes
    LOCAL_RANK  0 .. nproc_per_node-1, this process on its node (= its GPU index)
    WORLD_SIZE  the number of processes

Every process builds the same model and runs the same loop on its own rows of each batch (the
``BatchSource`` sharding contract). DDP keeps a full copy of the model per process and averages the
gradients during ``backward``; FSDP shards parameters, gradients and optimizer state across processes
and gathers each layer only while it computes. Only rank 0 writes checkpoints and logs.
"""

from __future__ import annotations

import datetime
import os
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from lmforge.devices import resolve_device
from lmforge.errors import LmforgeError


@dataclass(frozen=True)
class DistEnv:
    """Who this process is. A plain ``python`` run is rank 0 of a world of 1."""

    rank: int = 0
    local_rank: int = 0
    world_size: int = 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1


def detect() -> DistEnv:
    """Read RANK, LOCAL_RANK and WORLD_SIZE as torchrun sets them (defaults: a single process)."""
    try:
        return DistEnv(
            rank=int(os.environ.get("RANK", 0)),
            local_rank=int(os.environ.get("LOCAL_RANK", 0)),
            world_size=int(os.environ.get("WORLD_SIZE", 1)),
        )
    except ValueError as err:
        raise LmforgeError(f"bad torchrun environment (RANK / LOCAL_RANK / WORLD_SIZE): {err}") from None


def pick_device(name: str, env: DistEnv) -> torch.device:
    """'auto' -> cuda:LOCAL_RANK when CUDA is available, else cpu; 'cuda' -> cuda:LOCAL_RANK."""
    return resolve_device(name, "train.device", env.local_rank)


def resolve_auto(precision: str, compile_: bool | str, fsdp: bool, device: torch.device) -> tuple[str, bool]:
    """``train.precision`` and ``train.compile`` with "auto" resolved for the device: bf16 autocast and
    torch.compile on CUDA (bf16 where the GPU has it: Ampere or later; FSDP stays eager unless asked),
    fp32 and eager elsewhere.

    >>> resolve_auto("auto", "auto", False, torch.device("cpu"))
    ('fp32', False)
    """
    cuda = device.type == "cuda"
    if precision == "auto":
        precision = "bf16" if cuda and torch.cuda.is_bf16_supported() else "fp32"
    if compile_ == "auto":
        compile_ = cuda and not fsdp
    return precision, bool(compile_)


def init(env: DistEnv, device: torch.device, timeout_s: float = 600.0) -> bool:
    """Join the process group (nccl on CUDA, gloo on CPU) if launched with WORLD_SIZE > 1.

    timeout_s (``train.dist_timeout``): how long a collective waits for a process that does not answer
    (frozen, not dead) before it fails; a dead process fails the others at once.

    Returns True when this call created the group (and so ``shutdown`` should destroy it).
    """
    if not env.enabled or (dist.is_available() and dist.is_initialized()):
        return False
    if not dist.is_available():
        raise LmforgeError("this torch build has no torch.distributed; run with a single process")
    backend = "nccl" if device.type == "cuda" else "gloo"
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(backend=backend, rank=env.rank, world_size=env.world_size,
                            timeout=datetime.timedelta(seconds=timeout_s))
    return True


def raise_peer_failure(err: BaseException, env: DistEnv, timeout_s: float,
                       last_checkpoint: Callable[[], str]) -> None:
    """Turn a collective's error that means another process died or timed out into one clear line."""
    text = str(err).lower()
    if not env.enabled or not (isinstance(err, getattr(dist, "DistError", ())) or any(
            w in text for w in ("connection", "timed out", "timeout", "gloo", "nccl", "peer"))):
        return
    raise LmforgeError(f"process {env.rank}: another process of the run failed or did not answer within "
                       f"train.dist_timeout={timeout_s:g} s ({str(err).splitlines()[0][:160]}); the last "
                       f"checkpoint is {last_checkpoint()}") from None


def shutdown(created: bool) -> None:
    if created and dist.is_initialized():
        dist.destroy_process_group()


def all_reduce_sum(t: torch.Tensor, env: DistEnv) -> torch.Tensor:
    """Sum a tensor over all processes (in place, and returned); a no-op for one process."""
    if env.enabled:
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t


def barrier(env: DistEnv) -> None:
    if env.enabled:
        dist.barrier()


def gather_objects(obj: object, env: DistEnv) -> list[object]:
    """Every process's ``obj`` (JSON-like), in rank order, on every process."""
    if not env.enabled:
        return [obj]
    out: list[object] = [None] * env.world_size
    dist.all_gather_object(out, obj)
    return out


def wrap(model: nn.Module, env: DistEnv, device: torch.device, fsdp: bool, use_ddp: bool = True) -> nn.Module:
    """DDP or FSDP around ``model`` (already on ``device``), or the model itself for one process."""
    if not env.enabled:
        return model
    device_ids = [device.index] if device.type == "cuda" else None
    if fsdp:
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        from torch.distributed.fsdp import ShardingStrategy
        from torch.distributed.fsdp.wrap import ModuleWrapPolicy

        from lmforge.nn import TransformerLayer

        # Each Transformer layer is its own FSDP unit: only one layer's full weights exist at a time.
        # use_orig_params keeps the model's own parameters visible, so the AdamW groups (decay or not)
        # can be built after wrapping exactly as for one process.
        has_layers = any(isinstance(m, TransformerLayer) for m in model.modules())
        policy = ModuleWrapPolicy({TransformerLayer}) if has_layers else None
        return FSDP(model, sharding_strategy=ShardingStrategy.FULL_SHARD, use_orig_params=True,
                    auto_wrap_policy=policy, device_id=device)  # CPU works too (gloo), for tests
    if not use_ddp:
        raise LmforgeError("train.ddp is false but WORLD_SIZE > 1: set train.ddp=true or train.fsdp=true")
    return nn.parallel.DistributedDataParallel(model, device_ids=device_ids)


def is_fsdp(model: nn.Module) -> bool:
    try:
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    except ImportError:
        return False
    return isinstance(model, FSDP)


def no_sync(model: nn.Module, skip: bool):
    """Skip the gradient all-reduce on accumulation micro-steps (DDP and FSDP); sync on the last one."""
    if skip and hasattr(model, "no_sync"):
        return model.no_sync()
    return nullcontext()


def unwrap(model: nn.Module) -> nn.Module:
    """The user's module inside DDP / FSDP / torch.compile wrappers."""
    while True:
        for attr in ("module", "_orig_mod"):  # DDP / FSDP keep .module, torch.compile keeps ._orig_mod
            inner = getattr(model, attr, None)
            if isinstance(inner, nn.Module):
                model = inner
                break
        else:
            return model


def _on_gpu(model: nn.Module) -> bool:
    """Gather to CPU memory when the model is on a GPU (CPU offload of CPU tensors crashes FSDP1)."""
    return any(p.is_cuda for p in model.parameters())


def _full_options(offload: bool):
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(full_state_dict=True, cpu_offload=offload)


def full_state_dict(model: nn.Module, env: DistEnv) -> dict[str, torch.Tensor]:
    """The whole model's weights on CPU (FSDP: gathered to rank 0; other ranks get an empty dict)."""
    if is_fsdp(model):
        from torch.distributed.checkpoint.state_dict import get_model_state_dict

        state = get_model_state_dict(model, options=_full_options(_on_gpu(model)))  # collective
        return state if env.is_main else {}
    return {k: v.detach().cpu() for k, v in unwrap(model).state_dict().items()}


def full_optimizer_state(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict:
    """The optimizer's whole state keyed by parameter name (collective under FSDP: every rank calls it).

    Names rather than positions make a checkpoint loadable with or without DDP / FSDP wrappers.
    """
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    return get_optimizer_state_dict(model, optimizer, options=_full_options(is_fsdp(model) and _on_gpu(model)))


def load_optimizer_state(model: nn.Module, optimizer: torch.optim.Optimizer, state: dict) -> None:
    """Inverse of ``full_optimizer_state``: under FSDP each rank keeps its own shard of the full state."""
    from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict

    set_optimizer_state_dict(model, optimizer, state, options=_full_options(offload=False))
