"""Which device to run on, checked against what this machine has, so a wrong choice is one clear line.

    'auto'      cuda when available, else cpu
    'cpu'       the CPU
    'cuda'      the current CUDA device (cuda:LOCAL_RANK under torchrun)
    'cuda:N'    CUDA device N
    'mps'       Apple's Metal device

    >>> resolve_device("cpu")
    device(type='cpu')
"""

from __future__ import annotations

import torch

from lmforge.errors import LmforgeError


def resolve_device(name: str | torch.device | None, what: str = "--device", local_rank: int = 0) -> torch.device:
    """``name`` as a torch.device that exists here; anything else is an LmforgeError naming ``what``."""
    if name is None or isinstance(name, torch.device):
        return name if name is not None else torch.device("cpu")
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        device = torch.device(name)
    except RuntimeError:
        raise LmforgeError(f"{what}: {name!r} is not a device; use cpu, cuda, cuda:N, mps or auto") from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise LmforgeError(f"{what}: {name} was asked for but this machine has no CUDA device "
                               "(or this torch build has no CUDA); use --device cpu")
        index = local_rank if device.index is None else device.index
        if index >= torch.cuda.device_count():
            raise LmforgeError(f"{what}: {name}: there are {torch.cuda.device_count()} CUDA devices")
        return torch.device("cuda", index)
    if device.type == "mps" and not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()):
        raise LmforgeError(f"{what}: mps was asked for but is not available here; use --device cpu")
    return device
