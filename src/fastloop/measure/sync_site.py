"""Where a step synchronizes with the host, in the user's code: each warning CUDA's sync debug
mode raises is recorded with the Python stack it was raised from (:func:`warnings_with_stacks`),
and the stack is placed at the user's innermost frame (:func:`user_site`). The whole-step graph's
fallback and the GPU profile's host-sync count name the line this way.
"""

from __future__ import annotations

import contextlib
import os
import sys
import sysconfig
import traceback
import warnings
from collections.abc import Iterator
from typing import Any

__all__ = ["SYNC_WARNING", "sync_sites", "user_site", "warnings_with_stacks"]

SYNC_WARNING = "synchronizing CUDA operation"
"""What CUDA's sync debug mode ("warn") says of each synchronizing call."""


def _library(filename: str) -> bool:
    """A file of torch, Lightning, fastloop, an installed package or Python itself."""
    import fastloop

    path = os.path.abspath(filename)
    roots = (os.path.dirname(os.path.abspath(fastloop.__file__)), sysconfig.get_paths()["stdlib"])
    return (
        filename.startswith("<")
        or any(part in path for part in ("site-packages", "dist-packages"))
        or any(path.startswith(root + os.sep) for root in roots)
    )


def user_site(frames: list[traceback.FrameSummary]) -> str | None:
    """Where in the user's code a stack (outermost frame first) was: ``file.py:LINE in func``
    of the innermost frame outside libraries, with the library frame it led to, if any.

    Example:
        >>> from traceback import FrameSummary as Frame
        >>> user_site([Frame("/home/me/train.py", 41, "forward", lookup_line=False),
        ...            Frame("/venv/lib/python3.12/site-packages/torch/nn/modules/transformer.py", 380,
        ...                  "_detect_is_causal_mask", lookup_line=False)])
        'train.py:41 in forward (inside torch/nn/modules/transformer.py:380 _detect_is_causal_mask)'
    """
    inner = frames[-1] if frames else None
    for frame in reversed(frames):
        if not _library(frame.filename):
            where = f"{os.path.basename(frame.filename)}:{frame.lineno} in {frame.name}"
            if inner is not None and inner is not frame:
                lib = inner.filename.replace(os.sep, "/")
                short = lib[lib.rfind("site-packages/") + 14 :] if "site-packages/" in lib else os.path.basename(lib)
                where += f" (inside {short}:{inner.lineno} {inner.name})"
            return where
    return None


@contextlib.contextmanager
def warnings_with_stacks() -> Iterator[list[tuple[warnings.WarningMessage, list[traceback.FrameSummary]]]]:
    """Record every warning raised inside (none shown) with the Python stack it was raised
    from: CUDA's sync debug mode warns from C++ at the Python frame that called into it, so the
    stack names the user's line that synchronized (:func:`user_site`).

    Example:
        >>> import warnings
        >>> with warnings_with_stacks() as seen:
        ...     warnings.warn("called a synchronizing CUDA operation")
        >>> str(seen[0][0].message), seen[0][1][-1].name
        ('called a synchronizing CUDA operation', '<module>')
    """
    seen: list[tuple[warnings.WarningMessage, list[traceback.FrameSummary]]] = []

    def keep(message: Any, category: Any, filename: str, lineno: int, file: Any = None, line: Any = None) -> None:
        # from the frame that called this hook outward (explicit: walk_stack(None) skips a different
        # number of frames across Python versions); no source lines read, as a step may sync many
        # times; outermost frame first, as extract_stack gives it
        caller = sys._getframe(1)
        stack = list(reversed(traceback.StackSummary.extract(traceback.walk_stack(caller), lookup_lines=False)))
        while stack and stack[-1].filename == warnings.__file__:
            stack.pop()
        seen.append((warnings.WarningMessage(message, category, filename, lineno, file, line), stack))

    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = keep
        yield seen


def sync_sites(
    seen: list[tuple[warnings.WarningMessage, list[traceback.FrameSummary]]], steps: int, top: int = 3
) -> list[dict]:
    """The sync debug mode's warnings among ``seen``, counted by the user's line they came from,
    most frequent first: ``[{"site": ..., "per_step": ...}]`` (at most ``top``).

    Example:
        >>> import warnings
        >>> from traceback import FrameSummary as Frame
        >>> msg = warnings.WarningMessage("called a synchronizing CUDA operation", UserWarning, "x", 1)
        >>> here = [Frame("/home/me/train.py", 12, "training_step", lookup_line=False)]
        >>> sync_sites([(msg, here)] * 6, steps=3)
        [{'site': 'train.py:12 in training_step', 'per_step': 2.0}]
    """
    counts: dict[str, int] = {}
    for w, stack in seen:
        if SYNC_WARNING in str(w.message):
            site = user_site(stack) or "outside your code"
            counts[site] = counts.get(site, 0) + 1
    ranked = sorted(counts.items(), key=lambda kv: -kv[1])[:top]
    return [{"site": site, "per_step": n / max(1, steps)} for site, n in ranked]
