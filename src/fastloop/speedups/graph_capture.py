"""The capture primitive of ``cuda_graph``: a whole training step captured as one CUDA graph per
batch shape, every graph in one memory pool, replayed with each batch copied into the graph's
static buffers.

:class:`StepGraphs` holds the graphs: which batch shape replays, is captured or runs eagerly (a
shape seen after the first capture is captured at its second step, up to :data:`MAX_GRAPHS`: its
first runs eagerly, which is where compile builds its code for the shape), the checked eager step
on a side stream (PyTorch's warm-up before a capture, watched for a host sync or a host random
draw), ``torch.cuda.graph`` in the shared pool, and the record of what was captured; with the
capturable optimizer (:func:`make_capturable`, :func:`sync_lr`). The one engine that uses it,
for both adapters, is :class:`fastloop.speedups.captured_step.CapturedStep` (the warm-up, the
optimizer, the guards, the fallback).

Example:
    >>> graphs = StepGraphs()
    >>> key = graphs.key(torch.zeros(4, 16))
    >>> graphs.route(key)  # no graph yet: the adapter captures its first shape when it chooses
    'eager'
"""

from __future__ import annotations

import traceback
import warnings
from collections.abc import Callable
from typing import Any

import torch

from fastloop.data import map_tensors
from fastloop.errors import GraphIneligible
from fastloop.feed import host_rng_changed, host_rng_snapshot
from fastloop.measure.sync_site import user_site, warnings_with_stacks
from fastloop.measure.timer import one_off_step

__all__ = [
    "StepGraphs",
    "copy_into",
    "host_rng_changed",
    "host_rng_snapshot",
    "make_capturable",
    "shapes_of",
    "sync_lr",
]

MAX_GRAPHS = 8
"""The most batch shapes captured (one whole-step graph each, all in one memory pool): the buckets
of ``pad_buckets``; a shape past them runs eagerly."""


def shapes_of(batch: Any) -> list:
    """Every tensor's shape, dtype and device, in the batch's order: a graph's key."""
    out: list = []
    map_tensors(lambda t: (out.append((tuple(t.shape), t.dtype, t.device)), t)[1], batch)
    return out


def copy_into(static: Any, batch: Any) -> None:
    """Copy ``batch``'s tensors into the graph's static buffers (same structure), without a sync."""
    dst: list[torch.Tensor] = []
    map_tensors(lambda t: (dst.append(t), t)[1], static)
    src: list[torch.Tensor] = []
    map_tensors(lambda t: (src.append(t), t)[1], batch)
    for d, s in zip(dst, src):
        d.copy_(s, non_blocking=True)


def make_capturable(opt: torch.optim.Optimizer) -> list[tuple[dict, torch.Tensor]]:
    """Prepare ``opt`` for capture in place: ``capturable=True`` where the optimizer has it, its
    step counters on the parameters' device, and its lr a device tensor where the implementation
    reads one (capturable or fused), so that a scheduler's new lr reaches the graph. Returns the
    (param group, lr tensor) pairs for :func:`sync_lr`. Raises GraphIneligible for an optimizer
    with no capturable implementation."""
    if "capturable" not in opt.defaults and not isinstance(opt, torch.optim.SGD):
        raise GraphIneligible(f"{type(opt).__name__} has no capturable implementation")
    device = next(p.device for g in opt.param_groups for p in g["params"])
    pairs = []
    for g in opt.param_groups:
        if "capturable" in g:
            g["capturable"] = True
        # a float lr would be baked into the graph; a tensor lr can follow a scheduler
        if ("capturable" in g or g.get("fused")) and not torch.is_tensor(g["lr"]):
            g["lr"] = torch.tensor(float(g["lr"]), device=device)
        if torch.is_tensor(g["lr"]):
            pairs.append((g, g["lr"]))
    for p, st in opt.state.items():
        if "step" in st and torch.is_tensor(st["step"]) and st["step"].device != p.device:
            st["step"] = st["step"].to(p.device)
    return pairs


def sync_lr(pairs: list[tuple[dict, torch.Tensor]]) -> None:
    """Where a scheduler put a float lr back into a param group, copy it into the group's lr
    tensor (no host sync) and put the tensor back."""
    for g, t in pairs:
        if g["lr"] is not t:
            t.fill_(float(g["lr"]))
            g["lr"] = t


def _is_sync(message: str) -> bool:
    """A warning of CUDA's sync debug mode about a synchronizing call (not its one-time notice
    that the mode "is a prototype feature and does not yet detect all synchronizing operations")."""
    return "synchroniz" in message and "prototype" not in message


def _sync_reason(message: str, stack: list) -> str:
    site = user_site(stack)
    where = f" at {site}" if site else ""
    return f"the step synchronizes with the host{where} (e.g. .item(), .cpu(), printing a tensor): {message}"


class StepGraphs:
    """The whole-step graphs of one training run, one per batch shape, in one memory pool.

    Args:
        max_graphs: the most shapes captured; a shape past them runs eagerly.
    """

    def __init__(self, max_graphs: int = MAX_GRAPHS) -> None:
        self.max_graphs = max_graphs
        self.entries: dict[tuple, Any] = {}
        """Each captured batch shape: what the adapter keeps to replay it (graph, static batch, ...)."""
        self.seen_once: set[tuple] = set()
        self.no_graph: set[tuple] = set()  # shapes whose capture failed: eager, never retried
        self.pool: Any = None
        self.capture_s: float | None = None  # the first capture (in the warm-up)
        self.late_captures: list[float] = []  # seconds of each capture after the first (a shape seen later)
        self.late_failed: str | None = None  # why a shape seen after the first capture stays eager

    @staticmethod
    def key(batch: Any) -> tuple:
        """The batch's shape key (every tensor's shape, dtype and device)."""
        return tuple(shapes_of(batch))

    def route(self, key: tuple) -> str:
        """``"replay"`` a captured shape; ``"capture"`` a shape at its second step after the first
        capture (while fewer than ``max_graphs`` are held); else ``"eager"`` (the first capture is
        the adapter's to start: it knows when warm-up ends)."""
        if key in self.entries:
            return "replay"
        if not self.entries or key in self.no_graph or len(self.entries) >= self.max_graphs:
            return "eager"
        if key in self.seen_once:
            self.seen_once.discard(key)
            return "capture"
        self.seen_once.add(key)
        return "eager"

    @staticmethod
    def checked(step: Callable[[], Any]) -> tuple[Any, str | None]:
        """Run ``step`` once eagerly on a side stream (PyTorch's warm-up before a capture) and say
        why a graph of it would train wrong: a host sync (with the user's line) or a host random
        draw (a graph would replay the first draw). Other warnings are shown as usual."""
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        prev = torch.cuda.get_sync_debug_mode()
        rng = host_rng_snapshot()
        with warnings_with_stacks() as seen:
            torch.cuda.set_sync_debug_mode("warn")
            try:
                with torch.cuda.stream(side):
                    out = step()
            finally:
                torch.cuda.set_sync_debug_mode(prev)
        torch.cuda.current_stream().wait_stream(side)
        for w, _ in seen:
            if not _is_sync(str(w.message)):
                warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
        drew = host_rng_changed(rng)
        if drew:
            return out, f"the step draws random numbers on the host ({drew}): a graph would replay the first draw"
        syncs = [(w, stack) for w, stack in seen if _is_sync(str(w.message))]
        if syncs:
            return out, _sync_reason(str(syncs[0][0].message).splitlines()[0], syncs[0][1])
        return out, None

    def capture(self, step: Callable[[], Any]) -> tuple[torch.cuda.CUDAGraph, Any]:
        """Capture ``step()`` into a new graph in the shared pool; returns (graph, what step
        returned). Raises GraphIneligible with the reason when the capture fails."""
        graph = torch.cuda.CUDAGraph()
        if self.pool is None:
            self.pool = torch.cuda.graph_pool_handle()  # one pool for the graphs of every shape
        try:  # torch.cuda.graph synchronizes before it captures
            with torch.cuda.graph(graph, pool=self.pool, capture_error_mode="thread_local"):
                out = step()
        except RuntimeError as err:
            torch.cuda.synchronize()
            msg = str(err).splitlines()[0] if str(err) else type(err).__name__
            if "synchroniz" in msg or "capturing" in msg or "not permitted" in msg:
                raise GraphIneligible(_sync_reason(msg, traceback.extract_tb(err.__traceback__))) from None
            raise GraphIneligible(f"capture failed: {msg}") from None
        return graph, out

    @staticmethod
    def synchronize() -> None:
        """Wait for the device (after a capture that failed)."""
        torch.cuda.synchronize()

    def add(self, key: tuple, entry: Any, seconds: float) -> None:
        """Keep ``entry`` as the graph of shape ``key``, captured in ``seconds``. A capture that
        falls in a measured step (any after the first, and the first in a run with a short
        warm-up) is left out of the step statistics by the step timers, and counted."""
        if self.entries:
            self.late_captures.append(seconds)
            one_off_step(f"a CUDA graph captured for a batch shape first seen after warm-up ({seconds:.2f} s)")
        else:
            self.capture_s = seconds
            one_off_step(f"the whole step captured as a CUDA graph ({seconds:.2f} s)")
        self.entries[key] = entry

    def refuse(self, key: tuple, reason: str) -> None:
        """Shape ``key`` stays eager (its capture failed after the first shape's), for ``reason``."""
        self.seen_once.discard(key)
        self.no_graph.add(key)
        self.late_failed = reason

    def summary(self) -> dict:
        """The graphs per batch shape: how many, the late captures' seconds (after warm-up: in the
        measured steps, whose statistics leave them out) and why a shape stayed eager."""
        return {
            "graphs": len(self.entries),
            "late_captures": len(self.late_captures),
            "late_capture_s": round(sum(self.late_captures), 3),
            "late_failed": self.late_failed,
        }

    def describe(self) -> str:
        """The shapes' part of the record's detail."""
        if not self.late_captures:
            return ""
        return (
            f"; {len(self.entries)} batch shapes captured (one graph each, one memory pool), "
            f"{len(self.late_captures)} after the first in {sum(self.late_captures):.2f} s"
        )
