"""lmforge's own CPU kernels: int8 / int4 products (kernels.c), a decoding step's RMSNorm, attention and whole
layer stack (step_kernels.c) and a float32 model's products (float_kernels.c); compiled on this machine at first
use into one library, loaded with ctypes.

Why: at batch 1 torch's weight-only kernels (``_weight_int4pack_mm_for_cpu``, ``_weight_int8pack_mm``) take
bfloat16 activations and ran at about half of llama.cpp's pace on the same bytes (docs/benchmarks.md, issue 40).
kernels.c rounds x a block of 32 inputs at a time (int4: to 8 bits, llama.cpp's scheme; int8: to 16, which moves
SmolLM2's perplexity by nothing measurable) and sums each block in integer dot-product instructions (AVX-512
VNNI: 64 or 32 multiply-adds an instruction, exact), adding the residual in the same pass; a quantized model's
layers run in one call a step.

How: ``cc -O3 -march=native -fopenmp -shared`` of the three files into ``$LMFORGE_CACHE/kernels/<key>.so``, the key
a hash of the sources, the compiler's version and this CPU's flags (a home folder shared by two machines never runs
the other's build), written atomically. ``-march=native`` picks the AVX-512 (VNNI) code where the CPU has it,
plain C loops elsewhere: the same sums in the same order, so the same bits (tests build both). Its OpenMP threads are
torch's own: torch's wheel loads its libgomp.so.1 first, and the build's need of that name is met by the loaded
copy (one thread pool, not two).

A compiler without OpenMP (Apple's clang) gets a build without it, one thread a call. Without a C compiler, or
with ``LMFORGE_KERNELS=torch`` in the environment, torch's kernels run instead, said once on stderr (the first
case only). ``library()`` is the loaded build or None.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

from lmforge.files import cache_dir, move

SOURCES = tuple(Path(__file__).with_name(name) for name in ("kernels.c", "step_kernels.c", "float_kernels.c"))
# fused only where written; loops at the start of a cache line: the float32 product's one-row loop (a few
# instructions over a stream of weights) ran 12% slower on SmolLM2 where a build happened to place it across one
FLAGS = ("-O3", "-fopenmp", "-shared", "-fPIC", "-std=gnu11", "-ffp-contract=off", "-falign-loops=64")
BLOCK = 32  # int8 / int4: a scale (and a zero) each block of 32 inputs
SETTING = "LMFORGE_KERNELS"  # "torch": torch's quantized kernels instead of kernels.c
P, I64, INT = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
SIGNATURES = {
    # x, m, k, w, scale-zero pairs, n, bias, residual, y, threads
    "lmforge_int4_mm": (P, I64, I64, P, P, I64, P, P, P, INT),
    # x, m, k, w, scales, n, bias, residual, y, threads
    "lmforge_int8_mm": (P, I64, I64, P, P, I64, P, P, P, INT),
    "lmforge_int8_q8_mm": (P, I64, I64, P, P, I64, P, P, P, INT),  # the same, 8-bit activations
    # x, m, d, w, eps, y
    "lmforge_rms_norm": (P, I64, I64, P, ctypes.c_float, P),
    # x, n, y
    "lmforge_exp": (P, I64, P),
    # x, m, k, w, n, bias, residual, y, threads
    "lmforge_f32_mm": (P, I64, I64, P, I64, P, P, P, INT),
    # qkv, rows, h, hkv, dh, cos, sin, lengths, kv, slots, capacity, first, scale, out, half, threads
    "lmforge_decode_attention": (P, I64, I64, I64, I64, P, P, P, P, I64, I64, I64, ctypes.c_float, P, INT, INT),
    # x, rows, layers, n_layers, eps, h, hkv, dh, cos, sin, lengths, kv, slots, capacity, first, scale, scratch,
    # half, threads
    "lmforge_decode_layers": (P, I64, P, I64, ctypes.c_float, I64, I64, I64, P, P, P, P, I64, I64, I64,
                              ctypes.c_float, P, INT, INT),
}


class Product(ctypes.Structure):
    """kernels.c's ``product_t``: a quantized layer's tensors, shapes and kind, for ``decode_layers``."""

    _fields_ = [("weight", P), ("scales", P), ("bias", P), ("n", I64), ("k", I64), ("kind", I64)]


class Layer(ctypes.Structure):
    """kernels.c's ``layer_t``: one pre-LN decoder layer's RMSNorm gains and four quantized products."""

    _fields_ = [("norm1", P), ("norm2", P), ("qkv", Product), ("out", Product), ("up", Product), ("down", Product)]


def cpu_flags() -> str:
    """What this CPU can run (the flags line of /proc/cpuinfo, or the platform's name)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return line
    except OSError:
        pass
    return platform.machine() + platform.processor()


def compiler() -> str | None:
    return os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")


def build_key(cc: str, flags: tuple[str, ...]) -> str:
    """A hash of what the build depends on: the sources, the flags, the compiler and the CPU."""
    version = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=60).stdout
    parts = (*(s.read_bytes() for s in SOURCES), " ".join(flags).encode(), version.encode(), cpu_flags().encode())
    return hashlib.sha256(b"\0".join(parts)).hexdigest()[:20]


def build(cc: str, arch: str = "native", openmp: bool = True) -> Path:
    """The compiled library for this machine (``-march=arch``), built now unless it is in the cache."""
    flags = (*(f for f in FLAGS if openmp or f != "-fopenmp"), f"-march={arch}")
    target = cache_dir() / "kernels" / f"{build_key(cc, flags)}.so"
    if not target.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
            out = Path(tmp) / target.name
            done = subprocess.run([cc, *flags, *map(str, SOURCES), "-o", str(out)], capture_output=True, text=True,
                                  timeout=300)
            if done.returncode:
                errors = [line for line in done.stderr.splitlines() if "error" in line] or ["failed"]
                raise OSError(f"{cc}: {errors[0].strip()}")
            move(out, target)
    return target


def build_here(cc: str) -> Path:
    """``build``, and where the compiler has no OpenMP (Apple's clang) the build without it: one thread a call,
    said on stderr."""
    try:
        return build(cc)
    except OSError as err:
        try:
            path = build(cc, openmp=False)
        except OSError:
            raise err from None
        print(f"lmforge: kernels.c built without OpenMP (one thread a product): {err}", file=sys.stderr)
        return path


@functools.cache
def library() -> ctypes.CDLL | None:
    """kernels.c built for this machine and loaded, or None (torch's kernels then: no compiler, or the setting)."""
    if os.environ.get(SETTING, "").lower() == "torch":
        return None
    cc = compiler()
    try:
        if cc is None:
            raise OSError("no C compiler (cc) on the PATH")
        return load(build_here(cc))
    except (OSError, subprocess.SubprocessError) as err:
        print(f"lmforge: quantized products use torch's kernels (kernels.c not built: {err})", file=sys.stderr)
        return None


def load(path: Path) -> ctypes.CDLL:
    """A build of kernels.c, its functions' argument types declared."""
    lib = ctypes.CDLL(str(path))
    for name, args in SIGNATURES.items():
        getattr(lib, name).argtypes, getattr(lib, name).restype = args, None
    return lib


def pointer(t: torch.Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()


def product(kind: str, x: torch.Tensor, w: torch.Tensor, scales: torch.Tensor, bias: torch.Tensor | None,
            residual: torch.Tensor | None, activations: int = 16) -> torch.Tensor:
    """residual + x Ŵᵀ + bias for x (M, K) float32 contiguous, w and scales in kernels.c's ``kind`` layout ("int4":
    ``pack_int4``'s weight and scale-zero pairs; "int8": ``pack_int8``'s); residual (M, N) or None. -> (M, N)
    float32. int8's ``activations``: x rounded to 16 bits a block, or to 8 (int4's are always 8)."""
    m, k = x.shape
    y = x.new_empty(m, w.shape[0] * 16)  # w's first axis: the tiles of 16 rows
    lib = library()
    call = lib.lmforge_int4_mm if kind == "int4" else lib.lmforge_int8_q8_mm if activations == 8 else \
        lib.lmforge_int8_mm
    call(x.data_ptr(), m, k, w.data_ptr(), scales.data_ptr(), y.shape[1], pointer(bias), pointer(residual),
         y.data_ptr(), torch.get_num_threads())
    return y


def float_product(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None,
                  residual: torch.Tensor | None = None) -> torch.Tensor:
    """residual + x Wᵀ + bias for x (..., K) float32 and w ``pack_float``'s (N / 16, K, 16); residual (..., N) or
    None. -> (..., N) float32: each output summed over k in order, the same bits alone or among any rows."""
    rows = x.reshape(-1, x.shape[-1]).contiguous()
    n = w.shape[0] * 16
    y = rows.new_empty(rows.shape[0], n)
    if residual is not None:
        residual = residual.reshape(-1, n).contiguous()
    library().lmforge_f32_mm(rows.data_ptr(), rows.shape[0], rows.shape[1], w.data_ptr(), n, pointer(bias),
                             pointer(residual), y.data_ptr(), torch.get_num_threads())
    return y.reshape(*x.shape[:-1], n)


def pack_float(w: torch.Tensor) -> torch.Tensor:
    """W (N, K) float32, N a multiple of 16 -> (N / 16, K, 16): w[t, i, r] = W[16t + r, i] (float_kernels.c's
    layout)."""
    n, k = w.shape
    return w.detach().reshape(n // 16, 16, k).transpose(1, 2).contiguous()


def exp(x: torch.Tensor) -> torch.Tensor:
    """e^x for x float32 contiguous: kernels.c's own exponential (softmax's and SwiGLU's), within ~1 ulp of the
    float64 value on [-87.3, 88] and saturating outside it (e^88 for larger x)."""
    y = torch.empty_like(x)
    library().lmforge_exp(x.data_ptr(), x.numel(), y.data_ptr())
    return y


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x / sqrt(mean(x²) + eps) * weight for x (M, D) float32 contiguous."""
    y = torch.empty_like(x)
    library().lmforge_rms_norm(x.data_ptr(), x.shape[0], x.shape[1], weight.data_ptr(), eps, y.data_ptr())
    return y


def decode_attention(qkv: torch.Tensor, heads: int, cos: torch.Tensor | None, sin: torch.Tensor | None,
                     lengths: torch.Tensor, kv: torch.Tensor, first: int, scale: float, out: torch.Tensor) -> None:
    """One decoding step's attention (kernels.c ``lmforge_decode_attention``): qkv (R, H + 2 H_kv, d) rotated
    in place, the new keys and values written into kv (2, S, H_kv, C, d) at each row's column ``lengths``
    (int64), out (R, H d) the heads' outputs; every tensor float32 (kv float32 or float16: written rounded to the
    nearest half) and contiguous."""
    rows, _, d = qkv.shape
    _, slots, hkv, capacity, _ = kv.shape
    library().lmforge_decode_attention(qkv.data_ptr(), rows, heads, hkv, d, pointer(cos), pointer(sin),
                                       lengths.data_ptr(), kv.data_ptr(), slots, capacity, first, scale,
                                       out.data_ptr(), half(kv), torch.get_num_threads())


def product_of(layer: torch.nn.Module) -> Product:
    """A ``QuantizedLinear`` in kernels.c's layout, or an ``nn.Linear`` with its ``pack_float`` copy attached as
    ``layer.packed`` (the CPU runner's), as ``decode_layers`` reads it."""
    if isinstance(layer, torch.nn.Linear):
        return Product(layer.packed.data_ptr(), None, pointer(layer.bias), layer.out_features, layer.in_features, 32)
    kind = 4 if layer.kind == "int4" else 8 if layer.activations == 16 else 9  # kernels.c's INT8_Q8: 9
    return Product(layer.weight.data_ptr(), layer.scales.data_ptr(), pointer(layer.bias), layer.out_features,
                   layer.in_features, kind)


def decode_layers(x: torch.Tensor, layers: ctypes.Array, eps: float, heads: int, cos: torch.Tensor | None,
                  sin: torch.Tensor | None, lengths: torch.Tensor, kv: torch.Tensor, first: int, scale: float) -> None:
    """Every layer of a decoding step, x (R, D) in place (kernels.c ``lmforge_decode_layers``); kv the slots'
    (L, 2, S, H_kv, C, d) buffer (float32 or float16); ``layers`` an array of ``Layer``."""
    rows, d = x.shape
    _, _, slots, hkv, capacity, dh = kv.shape
    f = layers[0].down.k
    scratch = x.new_empty(rows * (2 * d + (heads + 2 * hkv) * dh + heads * dh + 3 * f))
    library().lmforge_decode_layers(x.data_ptr(), rows, layers, len(layers), eps, heads, hkv, dh, pointer(cos),
                                    pointer(sin), lengths.data_ptr(), kv.data_ptr(), slots, capacity, first, scale,
                                    scratch.data_ptr(), half(kv), torch.get_num_threads())


def half(kv: torch.Tensor) -> int:
    """1 for a cache of IEEE half floats (float16), 0 for float32: the kernels' ``half`` flag."""
    if kv.dtype not in (torch.float32, torch.float16):
        raise ValueError(f"the step kernels read a float32 or float16 cache, not {kv.dtype}")
    return int(kv.dtype == torch.float16)


# -- the layouts (kernels.c) -------------------------------------------------------------------------------------
def pack_int4(q: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """q (N, K) in [0, 15], scales and zeros (N, K / 32) -> (w (N / 16, K / 2, 16) uint8: tile t's block b is
    w[t, 16b : 16b + 16], 4 chunks c of 64 bytes, byte 4r + e of chunk c = q[16t + r, 32b + 8c + e] |
    q[16t + r, 32b + 8c + 4 + e] << 4; pairs (N / 16, K / 32, 16, 2) bfloat16 (s, z) of row 16t + r, block b)."""
    n, k = q.shape
    parts = q.to(torch.uint8).reshape(n // 16, 16, k // 32, 4, 2, 4)  # (T, r, b, c, low/high, e)
    chunks = (parts[..., 0, :] | (parts[..., 1, :] << 4)).permute(0, 2, 3, 1, 4)  # (T, b, c, r, e)
    w = chunks.contiguous().reshape(n // 16, k // 2, 16)
    pairs = torch.stack([scales.to(torch.bfloat16), zeros.to(torch.bfloat16)], dim=-1)  # (N, K/32, 2)
    return w, pairs.reshape(n // 16, 16, k // 32, 2).transpose(1, 2).contiguous()


def unpack_int4(w: torch.Tensor, pairs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``pack_int4``'s inverse: (q (N, K) int32, scales, zeros (N, K / 32) bfloat16)."""
    tiles, half, _ = w.shape
    chunks = w.reshape(tiles, half // 16, 4, 16, 4)  # (T, b, c, r, e)
    parts = torch.stack([chunks & 0x0F, chunks >> 4], dim=-2)  # (T, b, c, r, low/high, e)
    q = parts.permute(0, 3, 1, 2, 4, 5).reshape(16 * tiles, 2 * half).to(torch.int32)
    pairs = pairs.transpose(1, 2).reshape(16 * tiles, half // 16, 2)
    return q, pairs[..., 0], pairs[..., 1]


def pack_int8(q: torch.Tensor, scales: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """q (N, K) int8, or (N, K / 32, 32) (a view of a GGUF file's Q8_0 blocks), and scales (N, K / 32) -> (w
    (N / 16, K / 2, 32) int8: w[t, j, 2r + e] = q[16t + r, 2j + e], each 32 bytes 16 rows' 2 inputs (the
    dot-product instruction's operand, widened to 16 bits); scales (N / 16, K / 32, 16) bfloat16): one copy of q."""
    n, k = q.shape[0], q[0].numel()
    w = q.reshape(n // 16, 16, k // 2, 2).permute(0, 2, 1, 3).contiguous().reshape(n // 16, k // 2, 32)
    return w, scales.to(torch.bfloat16).reshape(n // 16, 16, k // BLOCK).transpose(1, 2).contiguous()


def unpack_int8(w: torch.Tensor, scales: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``pack_int8``'s inverse: (q (N, K) int8, scales (N, K / 32) bfloat16)."""
    tiles, pairs, _ = w.shape
    q = w.reshape(tiles, pairs, 16, 2).permute(0, 2, 1, 3).reshape(16 * tiles, 2 * pairs)
    return q, scales.transpose(1, 2).reshape(16 * tiles, pairs // 16)
