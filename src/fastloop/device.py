"""Which device a run uses (no speedup, no adapter: every part may import this).

Example:
    >>> resolve_device("cpu")
    device(type='cpu')
"""

from __future__ import annotations

import torch

from fastloop.errors import FastloopError

__all__ = ["resolve_device"]


def resolve_device(device: str | torch.device = "auto") -> torch.device:
    """``auto`` -> cuda if available else cpu; ``cuda`` without CUDA is a FastloopError."""
    if str(device) == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        dev = torch.device(device)
    except RuntimeError:
        raise FastloopError(f"unknown device {device!r}; use auto, cpu or cuda") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise FastloopError("--device cuda was asked for, but this machine has no CUDA device (use auto or cpu)")
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    if dev.type not in ("cpu", "cuda"):
        raise FastloopError(f"unsupported device {device!r}; use auto, cpu or cuda")
    return dev
