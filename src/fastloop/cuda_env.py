"""CUDA's hardware work queues: why fastloop asks for 32, and when it is too late to.

CUDA feeds each GPU through a fixed number of hardware work queues per process,
``CUDA_DEVICE_MAX_CONNECTIONS`` (default 8, at most 32). Streams beyond that share queues, and
work on a stream that shares a queue with the training stream waits behind whatever was queued
there first: a false dependency. DALI decodes on about 16 streams (nvJPEG's per-thread streams and
its executor's), so with 8 queues some of its small kernels land behind the training stream. With
the whole training step captured as one CUDA graph, "behind" is the whole 37 ms step: on our H200
(benchmarks/RESULTS.md, "imagenet-feed") a DALI-fed ResNet-50 ran at 0.81 of its synthetic-data
throughput with 8 queues and 0.99 with 32, data wait 20% -> 0.6%.

The variable is read when CUDA starts in the process, so it must be set before: fastloop's
command line and runner set it (unless you did), and :func:`cuda_queues_note` says when a run
cannot have it. This module does not import torch.

Example:
    >>> cuda_queues_note({"CUDA_DEVICE_MAX_CONNECTIONS": "32"}) is None
    True
    >>> cuda_queues_note({}).partition(":")[0]
    "CUDA_DEVICE_MAX_CONNECTIONS is not set (CUDA's default"
    >>> ensure_cuda_queues({"CUDA_DEVICE_MAX_CONNECTIONS": "8"})   # the user's own choice stays
    'kept'
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping

__all__ = ["CUDA_QUEUES", "CUDA_QUEUES_VAR", "cuda_queues_note", "ensure_cuda_queues"]

CUDA_QUEUES_VAR = "CUDA_DEVICE_MAX_CONNECTIONS"
CUDA_QUEUES = 32
_ENOUGH = 16
"""Below this many queues, DALI's streams (about 16) share queues with the training stream."""


def _cuda_started() -> bool:
    torch = sys.modules.get("torch")  # not imported yet: CUDA cannot have started through it
    return bool(torch is not None and torch.cuda.is_initialized())


def ensure_cuda_queues(env: dict | None = None) -> str:
    """Ask CUDA for :data:`CUDA_QUEUES` hardware queues per device unless the user chose a number
    or CUDA already started in this process. Returns ``"set"``, ``"kept"`` (the user's value) or
    ``"late"`` (CUDA started first; nothing changed)."""
    env = os.environ if env is None else env
    if env.get(CUDA_QUEUES_VAR):
        return "kept"
    if _cuda_started():
        return "late"
    env[CUDA_QUEUES_VAR] = str(CUDA_QUEUES)
    return "set"


def cuda_queues_note(env: Mapping[str, str] | None = None) -> str | None:
    """None when CUDA has enough hardware queues for a DALI pipeline beside the training stream,
    else what is wrong and what to do."""
    env = os.environ if env is None else env
    value = env.get(CUDA_QUEUES_VAR)
    try:
        n = int(value) if value else None
    except ValueError:
        n = None
    if n is not None and n >= _ENOUGH:
        return None
    now = f"is {value!r}" if value else "is not set (CUDA's default: 8 queues)"
    return (
        f"{CUDA_QUEUES_VAR} {now}: DALI's decoder streams can share a hardware queue with the training "
        f"stream and wait behind it (on our H200 with the step captured: 0.81 of synthetic-data throughput "
        f"at 8 queues, 0.99 at 32). Set {CUDA_QUEUES_VAR}={CUDA_QUEUES} before CUDA starts (fastloop's command "
        f"line does unless you set it)"
    )
