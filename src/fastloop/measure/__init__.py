"""Honest measurement: step timing with data wait, statistics, FLOPs/MFU, environment stamp.

The timer and the environment stamp import torch; they load on first use, so that the
statistics (and the reports built on them) import without torch.
"""

from __future__ import annotations

from typing import Any

from fastloop.measure.stats import RatioCI, bootstrap_ratio_ci, summarize

__all__ = ["RatioCI", "StepStats", "StepTimer", "bootstrap_ratio_ci", "env_stamp", "summarize"]

_LAZY = {
    "env_stamp": "fastloop.measure.env",
    "StepStats": "fastloop.measure.timer",
    "StepTimer": "fastloop.measure.timer",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'fastloop.measure' has no attribute {name!r}")
