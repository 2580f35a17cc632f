"""Models built to be loaded: no initialisation of the weights a file is about to provide, no second copy of them.

Building a model initialises every weight (N(0, 0.02), Kaiming uniform, ones, zeros): for SmolLM2-135M that is
1.2 s on 2 cores and 513 MiB written, only for a load to overwrite it, and a peak of two models in memory while
the file's tensors are copied in. Loading does two things instead (``models.registry.load_pretrained``,
``interop.gguf``, ``interop.llama``):

    with unwritten():            the initialisers' in-place writes into nn.Parameters (normal_, uniform_, zero_,
        model = build(config)    fill_, ...) do nothing: each parameter is allocated (torch.empty's pages, never
                                 touched, are not resident) and holds whatever the allocator gave; the buffers a
                                 construction computes (rotary tables, masks: never Parameters) are computed as ever
    assign_weights(model, tensors)   the file's tensors become the parameters (``load_state_dict(assign=True)``):
                                 safetensors' memory-mapped tensors stay mapped, nothing is copied; tied weights
                                 are tied again; the empty allocations are freed untouched

So every parameter must then be assigned or its layer replaced (``load_weights`` checks the names and shapes
first; its ``optional`` tensors are those the caller replaces, the int4 / quantized layers).
The mode is a ``TorchFunctionMode``: it lives on the calling thread only (torch keeps the mode stack per thread).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

# what nn.init and the modules' reset_parameters call on a parameter (the nn.init functions reach the mode
# themselves, with the tensor as a keyword; the Tensor methods with it first): skipped inside ``unwritten``
INIT_FUNCTIONS = frozenset({"normal_", "uniform_", "trunc_normal_", "kaiming_uniform_", "kaiming_normal_",
                            "xavier_uniform_", "xavier_normal_", "orthogonal_", "sparse_", "eye_", "dirac_",
                            "ones_", "zeros_", "constant_"})
INIT_METHODS = INIT_FUNCTIONS | {"zero_", "fill_", "copy_", "erfinv_", "mul_", "add_", "clamp_", "exponential_",
                                 "bernoulli_", "random_", "cauchy_", "log_normal_", "geometric_"}


class unwritten(TorchFunctionMode):  # lower case: used as ``with unwritten():``, like torch.no_grad
    """Inside: an in-place initialiser applied to an ``nn.Parameter`` returns it unwritten (see the module
    docstring); every other operation runs as usual.

    >>> with unwritten():
    ...     layer = nn.Linear(2, 2)     # its weight and bias: allocated, never initialised
    >>> torch.nn.init.ones_(layer.weight).sum().item()   # outside, initialisers work again
    4.0
    """

    def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        target = args[0] if args else (kwargs or {}).get("tensor")
        if isinstance(target, nn.Parameter) and getattr(func, "__name__", "") in INIT_METHODS:
            return target
        return func(*args, **(kwargs or {}))


def retie(model: nn.Module, aliases: Mapping[str, str]) -> None:
    """Make each ``alias`` the same tensor as its ``owner`` again (``{alias: owner}``, ``registry.tied_aliases``):
    assigning a new tensor to the owner leaves the alias on the old one."""
    for alias, owner in aliases.items():
        parent, _, attr = alias.rpartition(".")
        owner_parent, _, owner_attr = owner.rpartition(".")
        value = getattr(model.get_submodule(owner_parent), owner_attr)
        setattr(model.get_submodule(parent), attr, value)


def assign_weights(model: nn.Module, tensors: Mapping[str, torch.Tensor], aliases: Mapping[str, str],
                   expected: Mapping[str, torch.Tensor]) -> None:
    """``tensors`` become the model's own (no copy; a tensor of another dtype is cast to the parameter's, as a
    copy into it would), then the ties in ``aliases`` are restored. Names and shapes are checked by the caller."""
    cast = {name: t if t.dtype == expected[name].dtype else t.to(expected[name].dtype) for name, t in tensors.items()}
    model.load_state_dict(cast, strict=False, assign=True)
    retie(model, aliases)


def return_freed_memory() -> None:
    """Hand the heap pages a load has freed back to the system. glibc keeps the freed blocks of a load's
    temporaries (a GGUF's dequantized parts and unpacked integers, quantization buffers, the tokenizer's JSON) for
    reuse: 100-300 MiB that stay resident after SmolLM2 loads, until ``malloc_trim`` returns them (a few ms).
    Without glibc (macOS, musl) nothing happens."""
    import ctypes

    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return
    trim(0)
