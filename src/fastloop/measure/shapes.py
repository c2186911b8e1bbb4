"""How often a run's batches change shape.

A CUDA graph replays the one set of shapes it captured: a step whose batch has another shape runs
eagerly, and compile's CUDA graphs capture one graph per shape. Text padded to the longest
sequence of each batch changes shape nearly every step, so graphing it buys nothing and costs a
capture per shape. A run counts the shapes its batches had (:class:`ShapeTally`, kept by the
measurement callback); :func:`graph_shape_check` turns a count that rules graphs out into the
reason the ladder and the doctor give instead of measuring ``cuda_graph``.

Example:
    >>> import torch
    >>> tally = ShapeTally()
    >>> for n in [8, 9, 10, 11, 12, 13, 14, 15, 16, 17]:
    ...     tally.add((torch.zeros(4, n, dtype=torch.long), torch.zeros(4)))
    >>> s = tally.summary()
    >>> s["distinct"], s["varying"]
    (10, 'input 0 dim 1: 8-17')
    >>> graph_shape_check(s).startswith("the batches change shape")
    True
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Mapping
from typing import Any

import torch

__all__ = ["GRAPH_MAX_SHAPES", "GRAPH_MIN_SHARE", "ShapeTally", "graph_shape_check", "shape_key"]

GRAPH_MIN_SHARE = 0.5
"""``cuda_graph`` is ruled out when the commonest batch shape was under this share of the steps..."""
GRAPH_MAX_SHAPES = 8
"""... and there were more distinct shapes than this (a few buckets can still be graphed, one
graph each: that is left to the measurement)."""


def shape_key(batch: Any) -> tuple[tuple[int, ...], ...]:
    """The shapes of a batch's tensors, in order (nested tuples, lists, mappings, dataclasses),
    read without rebuilding any container (a batch of the user's own type is only looked at)."""
    out: list[tuple[int, ...]] = []

    def walk(x: Any, depth: int) -> None:
        if torch.is_tensor(x):
            out.append(tuple(x.shape))
        elif depth > 8:
            return
        elif isinstance(x, Mapping):
            for v in x.values():
                walk(v, depth + 1)
        elif isinstance(x, (list, tuple)):
            for v in x:
                walk(v, depth + 1)
        elif dataclasses.is_dataclass(x) and not isinstance(x, type):
            for f in dataclasses.fields(x):
                walk(getattr(x, f.name, None), depth + 1)

    walk(batch, 0)
    return tuple(out)


class ShapeTally:
    """Counts the batch shapes a run saw (every step, warm-up included)."""

    def __init__(self) -> None:
        self.counts: Counter = Counter()

    def add(self, batch: Any) -> None:
        try:
            self.counts[shape_key(batch)] += 1
        except Exception:  # noqa: BLE001 - counting shapes must never stop a run (an odd batch type)
            self.counts[()] += 1

    def summary(self) -> dict | None:
        """``steps``, ``distinct`` shapes, ``most_common_share`` of the steps, and ``varying``: which
        tensor's dimensions changed, with their range (None before any batch)."""
        steps = sum(self.counts.values())
        if not steps:
            return None
        _, top = self.counts.most_common(1)[0]
        return {
            "steps": steps,
            "distinct": len(self.counts),
            "most_common_share": top / steps,
            "varying": _varying(list(self.counts)),
        }


def _varying(keys: list[tuple[tuple[int, ...], ...]]) -> str:
    """``input I dim D: LO-HI`` for each dimension that changed among batches of the same layout."""
    layout = Counter(tuple(len(s) for s in k) for k in keys).most_common(1)[0][0]
    same = [k for k in keys if tuple(len(s) for s in k) == layout]
    parts = []
    for i, ndim in enumerate(layout):
        for d in range(ndim):
            sizes = {k[i][d] for k in same}
            if len(sizes) > 1:
                parts.append(f"input {i} dim {d}: {min(sizes)}-{max(sizes)}")
    if len(same) < len(keys):
        parts.append("the number or rank of the tensors changes too")
    return ", ".join(parts) or "-"


def graph_shape_check(summary: dict | None) -> str | None:
    """Why ``cuda_graph`` cannot help a step whose batches change shape this often, or None.

    Example:
        >>> graph_shape_check({"steps": 40, "distinct": 2, "most_common_share": 0.97, "varying": "input 0 dim 0: 7-64"})
        >>> varying = {"steps": 40, "distinct": 30, "most_common_share": 0.1, "varying": "input 0 dim 1: 8-63"}
        >>> graph_shape_check(varying)[:48]
        'the batches change shape (30 shapes in 40 steps:'
    """
    if not summary or summary["distinct"] <= GRAPH_MAX_SHAPES or summary["most_common_share"] >= GRAPH_MIN_SHARE:
        return None
    return (
        f"the batches change shape ({summary['distinct']} shapes in {summary['steps']} steps: "
        f"{summary['varying']}; the commonest in {100 * summary['most_common_share']:.0f}% of them): a CUDA "
        f"graph replays one fixed shape, so most steps would run eagerly and each new shape costs a capture; "
        f"pad to one fixed length (or to a few bucket lengths) to graph the step"
    )
