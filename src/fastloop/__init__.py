"""fastloop: make PyTorch training loops fast, and prove it.

Every optimization is a measured change: a :class:`~fastloop.speedups.base.Speedup` that says
whether it applies, changes one thing (model, optimizer, data pipeline or train step), and is
timed with and without it on the user's own model and hardware.

Example:
    >>> import fastloop
    >>> sorted(fastloop.speedup_names())[:3]
    ['async_checkpoint', 'batch_size', 'bf16']
"""

from __future__ import annotations

__version__ = "0.1.0"

import time as _time  # noqa: E402

STARTED = _time.perf_counter()
"""When this process imported fastloop (a command: before torch); a ladder's budget counts from here."""

from pathlib import Path as _Path  # noqa: E402
from typing import Any  # noqa: E402

# A source checkout used without installing (``PYTHONPATH=src:.``, as on the GPU machine): the
# recipes folder beside src/ answers to ``fastloop.recipes``, as it does once installed.
_checkout = _Path(__file__).resolve().parents[2]
if (_checkout / "recipes" / "__init__.py").is_file() and (_checkout / "src" / "fastloop").is_dir():
    __path__.append(str(_checkout))  # type: ignore[name-defined]  # noqa: F821

from fastloop.errors import FastloopError  # noqa: E402

__all__ = ["FastloopError", "__version__", "speedup_names"]


def __getattr__(attr: str) -> Any:
    # torch is imported on first use, not on ``import fastloop``: the command line checks its
    # arguments (and answers Ctrl-C) before paying for the torch import.
    if attr in ("speedup_names",):
        from fastloop.speedups import speedup_names

        return speedup_names
    raise AttributeError(f"module 'fastloop' has no attribute {attr!r}")
