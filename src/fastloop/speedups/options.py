"""Checking a speedup's option as typed after the colon (``workers:8``): one function the
speedups share, with the error policy's message (what was wrong, what is accepted)."""

from __future__ import annotations

from typing import Any

from fastloop.errors import FastloopError

__all__ = ["parse_number"]


def parse_number(text: str, convert: type, low: float, high: float, *, message: str, low_open: bool = False) -> Any:
    """``convert(text)`` if it lies in ``[low, high]`` (``(low, high]`` with ``low_open``), else a
    FastloopError with ``message`` (which says what is accepted)."""
    try:
        value = convert(text)
    except ValueError:
        raise FastloopError(message) from None
    if not (low < value if low_open else low <= value) or value > high:
        raise FastloopError(message)
    return value
