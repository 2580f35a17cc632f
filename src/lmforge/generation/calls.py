"""The two model calls of the decoding engine (generation/engine.py), prefill and step, for decoders and
encoder-decoders: plain functions of (model, caches, tensors), so that ``torch.compile`` specialises each to one
bucket's shapes (one graph per bucket, CUDA graphs on a GPU) and nothing else varies between calls."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator

import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode

from lmforge.models.interfaces import is_encoder_decoder
from lmforge.nn.linear import Linear, packable, packed_attached, packed_products


def compiled(fn: Callable, device: torch.device, enabled: bool) -> Callable:
    """``fn`` compiled with ``fullgraph=True, dynamic=False`` (CUDA graphs on CUDA), or ``fn`` itself."""
    if not enabled:
        return fn
    mode = "reduce-overhead" if device.type == "cuda" else None
    return torch.compile(fn, fullgraph=True, dynamic=False, mode=mode)


def one_graph_step(fn: Callable, model: nn.Module) -> Callable:
    """A decoder step (``decoder_step``) compiled once for every row and column count (``dynamic=True``, the rows
    marked dynamic: at least 2, since a size of 1 is always specialised), its products from packed weights
    (``nn.linear.packed_linear``, the eager engine's oneDNN products, kept whole in the graph) and the rest fused
    by inductor: the engine's CPU step without the per-operation cost of eager PyTorch (SmolLM2-135M, 2 threads:
    0.70-0.79 of the eager step at 2-16 rows). A row's bits do not depend on the row count: per-row work only,
    and products that give a row the same bits beside any number of rows (tests/test_engine.py)."""
    graph = torch.compile(fn, fullgraph=True, dynamic=True)
    layers = [m for m in model.modules() if isinstance(m, Linear)]  # found once, not at every step

    def step(model: nn.Module, caches: list, tokens: torch.Tensor, lengths: torch.Tensor,
             capacity: int) -> torch.Tensor:
        torch._dynamo.mark_dynamic(tokens, 0)
        torch._dynamo.mark_dynamic(lengths, 0)
        with packed_attached(layers):  # read by the graph's Linear layers (a context variable cannot be, compiled)
            return graph(model, caches, tokens, lengths, capacity)

    return step


def fits_one_graph(model: nn.Module) -> bool:
    """Whether ``one_graph_step`` can run this model: a decoder whose every product is packed (float32 on CPU)."""
    return next(model.parameters()).device.type == "cpu" and not is_encoder_decoder(model) and packable(model)


@functools.cache
def arange(n: int, device: torch.device) -> torch.Tensor:
    """[0, n) on the device, made once per (n, device): the rows of a step bucket."""
    return torch.arange(n, device=device)


# -- the model calls, compiled once per bucket ---------------------------------------------------------------------
def decoder_prefill(model: nn.Module, caches: list, ids: torch.Tensor, last: torch.Tensor) -> torch.Tensor:
    """ids (B, P_b) right-padded, last (B,) -> the next-token logits after each row's last real token (B, V)."""
    return model(ids, caches=caches, logit_positions=last).logits[:, -1]


def decoder_step(model: nn.Module, caches: list, tokens: torch.Tensor, lengths: torch.Tensor,
                 capacity: int) -> torch.Tensor:
    """tokens (S_b,) at positions lengths (S_b,) -> next-token logits (S_b, V); row b sees its columns <= lengths[b]."""
    visible = torch.arange(capacity, device=tokens.device)[None, :] <= lengths[:, None]  # (S_b, C_b)
    out = model(tokens[:, None], attention_mask=visible, position_ids=lengths[:, None], caches=caches)
    return out.logits[:, -1]


def seq2seq_prefill(model: nn.Module, caches: list, src: torch.Tensor, src_mask: torch.Tensor,
                    start: torch.Tensor) -> torch.Tensor:
    """Encode the source (1, S_b) once, fill the cross-attention cache, decode the start token -> (1, V)."""
    memory = model.encode(src, src_mask).last_hidden_state  # (1, S_b, D)
    positions = torch.zeros_like(start)
    return model.decode(start, memory, src_mask=src_mask, caches=caches, position_ids=positions).logits[:, -1]


def seq2seq_step(model: nn.Module, caches: list, tokens: torch.Tensor, lengths: torch.Tensor, capacity: int,
                 src_mask: torch.Tensor) -> torch.Tensor:
    """One target token per row, attending to its own target columns and its own source (S_b, M_b)."""
    visible = torch.arange(capacity, device=tokens.device)[None, :] <= lengths[:, None]  # (S_b, C_b)
    out = model.decode(tokens[:, None], None, src_mask=src_mask, tgt_mask=visible, caches=caches,
                       position_ids=lengths[:, None])
    return out.logits[:, -1]


class CpuCall(TorchFunctionMode):
    """A prefill on an eager CPU engine: the fused attention (``F.scaled_dot_product_attention``) on one thread,
    since on two PyTorch's CPU kernel gives a row other bits in a batch of 16 than of 4 (measured on torch 2.13).
    A step's single queries take ``nn.attention.decode_attention`` instead, whose bits depend neither on the batch
    nor on the threads, so steps need no mode (a mode sees every torch call: 15% of a SmolLM2 step)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.scaled_dot_product_attention:
            with one_thread():
                return func(*args, **kwargs)
        return func(*args, **kwargs)


@contextlib.contextmanager
def cpu_prefill() -> Iterator[None]:
    """How an eager CPU engine runs a prefill: the fused attention on one thread (``CpuCall``), float32 products
    from packed weights (``nn.linear.packed_products``; a group's prompts share one width bucket, so each row has
    the shapes it has alone anyway)."""
    with CpuCall(), packed_products():
        yield


@contextlib.contextmanager
def cpu_step(packed: bool) -> Iterator[None]:
    """How an eager CPU engine runs a step so that a row's bits never depend on its neighbours: with
    ``packed`` (float32 weights), every product from packed weights on the engine's threads
    (``nn.linear.packed_products``: a row's bits are the same for any row count and thread count, so a step
    computes exactly its active rows); otherwise everything on one thread, where BLAS gives a row the same bits
    from MIN_ROWS rows on (slots.py). tests/test_engine.py checks every logit of a request alone and beside 15
    others, on 1 and 2 threads."""
    with packed_products() if packed else one_thread():
        yield


@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    """torch's CPU work on one thread inside the block, the thread count as it was after."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def compile_mode(model: nn.Module, compile: bool | None) -> bool | str | None:
    """What a server's ``--compile`` asks of the engine: on CPU, for a float32 decoder, the one dynamic step graph
    ("dynamic": a graph per bucket would take an hour to compile on a few cores); otherwise as given."""
    return "dynamic" if compile and fits_one_graph(model) else compile
