"""fastloop for a plain PyTorch loop: the public entry point (the adapter lives in
:mod:`fastloop.adapters.loop`).

Example:
    >>> from fastloop.loop import FastLoop
    >>> FastLoop.__name__
    'FastLoop'
"""

from __future__ import annotations

from fastloop.adapters.loop import FastLoop, LoopResult, LoopRun, resolve_device

__all__ = ["FastLoop", "LoopResult", "LoopRun", "resolve_device"]
