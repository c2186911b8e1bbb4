"""Torch facts a speedup's fallback and decisions need: whether an error came from the compiler
(compile and cuda_graph claim those errors and fall back), and one value for every rank."""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["raised_by_compiler", "rank_zero_value"]


def rank_zero_value(fn: Any) -> Any:
    """``fn()`` computed on rank 0 only and handed to every rank under torch.distributed (a
    decision made by measuring, such as the worker count, must be the same on all ranks);
    ``fn()`` otherwise. Every rank must call it at the same point."""
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return fn()
    box = [fn() if torch.distributed.get_rank() == 0 else None]
    torch.distributed.broadcast_object_list(box, src=0)
    return box[0]


def raised_by_compiler(err: BaseException) -> bool:
    """Did ``err`` come from torch.compile (Dynamo/Inductor) or a CUDA-graph replay?"""
    import traceback

    seen: set[int] = set()
    e: BaseException | None = err
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        text = f"{type(e).__module__}.{type(e).__name__}: {e}"
        if "torch._dynamo" in text or "torch._inductor" in text or "CUDAGraph" in text or "cudagraph" in text:
            return True
        files = [f.filename.replace("\\", "/") for f in traceback.extract_tb(e.__traceback__)]
        if any("/torch/_dynamo/" in f or "/torch/_inductor/" in f for f in files):
            return True
        e = e.__cause__ or e.__context__
    return False
