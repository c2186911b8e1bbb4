"""The three kinds of failure and how the command line answers each.

- :class:`FastloopError`: bad input to fastloop (exit status 2, one line saying what was wrong
  and what is accepted).
- :class:`UserCodeError`: the user's own code raised, or gave fastloop nothing to train
  (exit status 1; the user's frames of the traceback and a last line naming their function).
- ``KeyboardInterrupt``: exit status 130; finished configurations are kept.

Example:
    >>> try:
    ...     raise UserCodeError("no step was trained: the training loader yielded no batches")
    ... except UserCodeError as err:
    ...     str(err)
    'no step was trained: the training loader yielded no batches'
"""

from __future__ import annotations

import os
import sysconfig
import traceback
from types import TracebackType

__all__ = [
    "ConfigurationFailed",
    "FastloopError",
    "GraphIneligible",
    "UserCodeError",
    "format_user_error",
    "shorten",
    "user_frames",
]


def shorten(text: object, limit: int = 60) -> str:
    """``text`` as it can be shown in a one-line message: not-UTF-8 bytes escaped, newlines shown
    as ``\\n``, and the middle elided when longer than ``limit`` characters.

    Example:
        >>> shorten("a" * 100, 20)
        'aaaaaaaaa...aaaaaaaa (100 characters)'
    """
    shown = str(text).encode("utf-8", "backslashreplace").decode("utf-8").replace("\n", "\\n")
    if len(shown) <= limit:
        return shown
    head = (limit + 1) // 2 - 1
    tail = limit - head - 3
    return f"{shown[:head]}...{shown[-tail:]} ({len(shown):,} characters)"


class FastloopError(ValueError):
    """Bad input: the message says what was wrong and what is accepted.

    The CLI prints it as one line and exits with status 2; no traceback.
    """


class ConfigurationFailed(FastloopError):
    """A configuration's process ended without a result. ``returncode`` 1 means the user's code
    raised there (``detail`` holds the child's message), 2 bad input, anything else a crash."""

    def __init__(self, message: str, returncode: int | None, detail: str = "") -> None:
        super().__init__(message)
        self.returncode = returncode
        self.detail = detail


class GraphIneligible(RuntimeError):
    """The step cannot be captured as a CUDA graph; the message names the cause."""


class UserCodeError(RuntimeError):
    """The user's code raised (``__cause__`` holds the original) or left nothing to train."""


_FASTLOOP_DIR = os.path.dirname(os.path.abspath(__file__))
_LIBRARY_DIRS = tuple(
    {
        p
        for p in (
            sysconfig.get_paths().get("stdlib"),
            sysconfig.get_paths().get("platstdlib"),
            sysconfig.get_paths().get("purelib"),
            sysconfig.get_paths().get("platlib"),
        )
        if p
    }
)


def _is_library(filename: str) -> bool:
    path = os.path.abspath(filename)
    return (
        path.startswith(_FASTLOOP_DIR + os.sep)
        or path.startswith(_LIBRARY_DIRS)
        or "site-packages" in path
        or "dist-packages" in path
        or filename.startswith("<")
    )


def user_frames(tb: TracebackType | None) -> list[traceback.FrameSummary]:
    """The frames of ``tb`` that belong to the user's code (not fastloop, Lightning, torch or the stdlib)."""
    return [f for f in traceback.extract_tb(tb) if not _is_library(f.filename)]


def format_user_error(err: BaseException) -> str:
    """The user's frames of ``err``'s traceback and a last line naming their function and the error.

    With no frame of the user's (the error came from fastloop itself), the whole traceback is
    shown and the last line says it is fastloop's internal error.
    """
    original = err.__cause__ if isinstance(err, UserCodeError) and err.__cause__ is not None else err
    frames = user_frames(original.__traceback__)
    what = f"{type(original).__name__}: {original}" if str(original) else type(original).__name__
    if isinstance(err, UserCodeError) and err.__cause__ is None:
        return f"fastloop: error: {err}\n"
    if frames:
        body = "".join(traceback.format_list(frames))
        last = frames[-1]
        lead = f" {err}" if isinstance(err, UserCodeError) else ""
        return (
            f"Traceback (your code only; fastloop, Lightning and torch frames elided):\n{body}"
            f"fastloop: error in your code{lead}: {last.name}() at {os.path.basename(last.filename)}:{last.lineno} "
            f"raised {what}\n"
        )
    if isinstance(err, UserCodeError):
        return f"fastloop: error in your code {err}: {what}\n"
    body = "".join(traceback.format_exception(type(original), original, original.__traceback__))
    return f"{body}fastloop: internal error (a bug in fastloop, please report it): {what}\n"
