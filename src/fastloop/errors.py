"""Errors that mean "the user asked for something impossible" (exit status 2, one line)."""

from __future__ import annotations

__all__ = ["FastloopError"]


class FastloopError(ValueError):
    """Bad input: the message says what was wrong and what is accepted.

    The CLI prints it as one line and exits with status 2; no traceback.
    """
