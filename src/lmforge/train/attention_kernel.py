"""Which fused attention kernel a training run uses on a GPU, chosen by measurement at its start.

``F.scaled_dot_product_attention`` runs one of several kernels for the same equation, softmax(q kᵀ · scale) v:
FlashAttention-2, the memory-efficient kernel, cuDNN's, and the plain math. Which one is chosen is a fixed
priority (torch 2.11: flash, efficient, math, cuDNN), not the fastest on the card: on Hopper GPUs cuDNN's
attention (written for that chip) can be faster than FlashAttention-2, and attention is 15-20% of a GPT-2-sized
training step at 1,024 tokens. ``fastest_attention`` times one forward and backward of the run's attention
(its heads, head width and sequence, causal or not) on each kernel that accepts it, checks that each gives the
first one's heads (to bf16 rounding), and puts them in order, fastest first, for the length of the run
(``sdpa_kernel(..., set_priority=True)``: a kernel that cannot take some call, a padded batch's mask say, falls
to the next). ``torch.compile`` reads the order when it traces the model, so the compiled step keeps the choice.

On a CPU (and for a model without multi-head attention) nothing is timed and nothing changes.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from lmforge.nn.attention import MultiHeadAttention

KERNELS = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
           "efficient": SDPBackend.EFFICIENT_ATTENTION}


def ranked(times: dict[str, float]) -> list[SDPBackend]:
    """The kernels by time, fastest first, then the others torch knows (math last): a priority order.

    >>> [k.name for k in ranked({"flash": 2.0, "cudnn": 1.0})]
    ['CUDNN_ATTENTION', 'FLASH_ATTENTION', 'EFFICIENT_ATTENTION', 'MATH']
    """
    order = [KERNELS[name] for name in sorted(times, key=times.__getitem__)]
    return order + [k for k in (*KERNELS.values(), SDPBackend.MATH) if k not in order]


def time_kernel(kernel: SDPBackend, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool,
                repeats: int = 10) -> tuple[float, torch.Tensor] | None:
    """Milliseconds of one forward and backward of the attention on ``kernel`` (median of ``repeats``, after two
    untimed), and its heads; None when the kernel does not take these inputs."""
    grad, grouped = torch.ones_like(q), k.shape[1] != q.shape[1]  # grouped heads go in as they are (the layer's call)
    try:
        with sdpa_kernel([kernel]):
            for _ in range(2):
                out = F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=grouped)
                out.backward(grad)
            times = []
            for _ in range(repeats):
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=grouped).backward(grad)
                end.record()
                end.synchronize()
                times.append(start.elapsed_time(end))
    except RuntimeError:  # "No available kernel": this kernel does not take these shapes, dtype or card
        return None
    return sorted(times)[len(times) // 2], out.detach()


def measure(model: nn.Module, batch: int, seq: int, dtype: torch.dtype, device: torch.device) -> dict[str, float]:
    """Milliseconds of each kernel that takes the model's first self-attention at (batch, seq) and agrees with the
    first that does; {} when there is nothing to choose."""
    attention = next((m for m in model.modules() if isinstance(m, MultiHeadAttention) and not m.cross), None)
    if attention is None or device.type != "cuda":
        return {}
    g = torch.Generator(device=device).manual_seed(0)

    def heads(n: int, d: int) -> torch.Tensor:  # (B, n, T, d) as a layer makes them: a view of (B, T, n, d)
        x = torch.randn(batch, seq, n, d, generator=g, device=device, dtype=dtype)
        return x.transpose(1, 2).requires_grad_()

    h, h_kv = attention.n_heads, attention.n_kv_heads
    q, k, v = heads(h, attention.d_qk), heads(h_kv, attention.d_qk), heads(h_kv, attention.d_v)
    times, first = {}, None
    for name, kernel in KERNELS.items():
        got = time_kernel(kernel, q, k, v, attention.causal)
        if got is None:
            continue
        if first is None:
            first = got[1]
        elif not torch.allclose(got[1].float(), first.float(), atol=2e-2, rtol=2e-2):
            continue  # a kernel whose heads differ beyond rounding is never chosen
        times[name] = got[0]
    return times


@contextmanager
def fastest_attention(model: nn.Module, batch: int, seq: int, dtype: torch.dtype, device: torch.device,
                      say=print) -> Iterator[dict[str, float]]:
    """For the length of the block, torch's attention kernels in the order measured for this model (module
    docstring); yields the times ({} when nothing was chosen: a CPU, or nothing to choose between)."""
    times = measure(model, batch, seq, dtype, device)
    if len(times) < 2:
        yield times
        return
    order = ranked(times)
    listed = ", ".join(f"{name} {ms:.2f} ms" for name, ms in sorted(times.items(), key=lambda item: item[1]))
    say(f"attention kernel: {listed.split()[0]} first (one forward and backward at {batch} x {seq}: {listed})")
    with sdpa_kernel(order, set_priority=True):
        yield times
