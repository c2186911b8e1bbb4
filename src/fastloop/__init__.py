"""fastloop: make PyTorch training loops fast, and prove it.

Every optimization is a measured change: a :class:`~fastloop.speedups.base.Speedup` that says
whether it applies, changes one thing (model, optimizer, data pipeline or train step), and is
timed with and without it on the user's own model and hardware.

Example:
    >>> import fastloop
    >>> sorted(fastloop.speedup_names())[:3]
    ['batch_size', 'bf16', 'channels_last']
"""

from __future__ import annotations

__version__ = "0.1.0"

from typing import Any  # noqa: E402

from fastloop.errors import FastloopError  # noqa: E402

__all__ = ["FastloopError", "__version__", "speedup_names"]


def __getattr__(name: str) -> Any:
    # torch is imported on first use, not on ``import fastloop``: the command line checks its
    # arguments (and answers Ctrl-C) before paying for the torch import.
    if name == "speedup_names":
        from fastloop.speedups import speedup_names

        return speedup_names
    raise AttributeError(f"module 'fastloop' has no attribute {name!r}")
