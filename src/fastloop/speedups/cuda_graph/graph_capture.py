"""The capture primitive of ``cuda_graph``: a whole training step captured as one CUDA graph per
key (the batch's :func:`batch_key`: its structure, dict keys by name, tensor shapes and non-tensor
leaves; the engine adds the step's state), every graph in one memory pool, replayed with each
batch copied into the graph's static buffers (a mapping's by name: :func:`copy_into`).

:class:`StepGraphs` holds the graphs: which key replays, is captured or runs eagerly (a key seen
after the first capture is captured at its second step, up to :data:`MAX_GRAPHS`: its first runs
eagerly, which is where compile builds its code for the shape), the checked eager step
on a side stream (PyTorch's warm-up before a capture, watched for a host sync or a host random
draw), ``torch.cuda.graph`` in the shared pool, and the record of what was captured; with the
capturable optimizer (:func:`make_capturable`, :func:`sync_lr`). The one engine that uses it,
for both adapters, is :class:`fastloop.speedups.cuda_graph.captured_step.CapturedStep` (the warm-up, the
optimizer, the guards, the fallback).

Example:
    >>> graphs = StepGraphs()
    >>> key = graphs.key(torch.zeros(4, 16))
    >>> graphs.route(key)  # no graph yet: the adapter captures its first shape when it chooses
    'eager'
"""

from __future__ import annotations

import dataclasses
import traceback
import warnings
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from fastloop.data import map_tensors
from fastloop.errors import GraphIneligible
from fastloop.feed import host_rng_changed, host_rng_snapshot
from fastloop.measure.sync_site import user_site, warnings_with_stacks
from fastloop.measure.timer import one_off_step
from fastloop.speedups.cuda_graph.graph_guard import HostDraws

__all__ = [
    "LrTensor",
    "StepGraphs",
    "batch_key",
    "copy_into",
    "draw_reason",
    "host_rng_changed",
    "host_rng_snapshot",
    "make_capturable",
    "shapes_of",
    "sync_lr",
]

MAX_GRAPHS = 8
"""The most keys captured (one whole-step graph each, all in one memory pool: a batch shape, such
as a bucket of ``pad_buckets``, or a new state of the step); a key past them runs eagerly."""
SEEN_ONCE_KEPT = 256
"""Keys remembered as seen once (to be captured when they come back) before the memory is cleared."""


def shapes_of(batch: Any) -> list:
    """Every tensor's shape, dtype and device, in the batch's order."""
    out: list = []
    map_tensors(lambda t: (out.append((tuple(t.shape), t.dtype, t.device)), t)[1], batch)
    return out


class _Same:
    """A leaf compared by identity (an object that is not hashable): the key holds it, so its id
    is not reused while the key lives."""

    __slots__ = ("obj",)

    def __init__(self, obj: Any) -> None:
        self.obj = obj

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Same) and other.obj is self.obj

    def __hash__(self) -> int:
        return id(self.obj)


def batch_key(batch: Any) -> Any:
    """A graph's key for ``batch``: its structure (the container types, a mapping's keys by name
    and in their order, a dataclass's fields), every tensor's shape, dtype and device, and every
    other leaf (a task name, a flag, a number) by type and value, or by identity where it cannot
    be hashed. Two batches with one key take the same path through a step's Python.

    Example:
        >>> x = torch.zeros(2, 3)
        >>> batch_key({"task": "cls", "x": x}) == batch_key({"task": "reg", "x": x})
        False
        >>> batch_key({"a": x, "b": x}) == batch_key({"b": x, "a": x})
        False
    """
    if torch.is_tensor(batch):
        return (batch.shape, batch.dtype, batch.device)
    if isinstance(batch, Mapping):
        return (type(batch), tuple((k, batch_key(v)) for k, v in batch.items()))
    if isinstance(batch, (list, tuple)):
        return (type(batch), tuple(batch_key(v) for v in batch))
    if dataclasses.is_dataclass(batch) and not isinstance(batch, type):
        return (type(batch), tuple((f.name, batch_key(getattr(batch, f.name))) for f in dataclasses.fields(batch)))
    try:
        hash(batch)
    except TypeError:
        return (type(batch), _Same(batch))
    return (type(batch), batch)


def copy_into(static: Any, batch: Any) -> None:
    """Copy ``batch``'s tensors into the graph's static buffers, a mapping's by key name (the two
    share a :func:`batch_key`), without a sync."""
    if torch.is_tensor(static):
        static.copy_(batch, non_blocking=True)
    elif isinstance(static, Mapping):
        for k, v in static.items():
            copy_into(v, batch[k])
    elif isinstance(static, (list, tuple)):
        for d, s in zip(static, batch):
            copy_into(d, s)
    elif dataclasses.is_dataclass(static) and not isinstance(static, type):
        for f in dataclasses.fields(static):
            copy_into(getattr(static, f.name), getattr(batch, f.name))


@dataclass(eq=False)
class LrTensor:
    """One param group's lr as the graph reads it: a tensor on the parameters' device that each
    replay reads from memory (a scheduler fills it in place; :func:`sync_lr` copies a float put
    back into the group, or an in-place change of the user's own CPU tensor ``source``)."""

    group: dict
    tensor: torch.Tensor
    original: Any
    """What the group held before (a float, the user's tensor), put back after the run."""
    source: torch.Tensor | None = None
    """The user's lr tensor where it was not on the device (a CPU tensor): followed by its version."""
    version: int = 0


def make_capturable(opt: torch.optim.Optimizer, keep: Iterable[LrTensor] = ()) -> list[LrTensor]:
    """Prepare ``opt`` for capture in place: ``capturable=True`` where the optimizer has it, its
    step counters on the parameters' device, and its lr a tensor on that device where the
    implementation reads one (capturable or fused): a float becomes one, and a tensor elsewhere
    (a CPU tensor, which a fused CUDA kernel reads once on the host) is copied there and
    followed. Returns the groups' :class:`LrTensor` for :func:`sync_lr`; ``keep``, those of a
    preparation before, stay as they are for the groups they hold. Raises GraphIneligible for an
    optimizer with no capturable implementation."""
    if "capturable" not in opt.defaults and not isinstance(opt, torch.optim.SGD):
        raise GraphIneligible(f"{type(opt).__name__} has no capturable implementation")
    device = next(p.device for g in opt.param_groups for p in g["params"])
    kept = {id(lr.group): lr for lr in keep}
    pairs = []
    for g in opt.param_groups:
        if "capturable" in g:
            g["capturable"] = True
        if id(g) in kept:
            pairs.append(kept[id(g)])
            continue
        lr = g["lr"]
        reads_tensor = "capturable" in g or bool(g.get("fused"))
        if torch.is_tensor(lr) and lr.device == device:
            pairs.append(LrTensor(g, lr, lr))  # read from memory by every replay already
        elif reads_tensor and torch.is_tensor(lr):
            g["lr"] = lr.detach().to(device, copy=True)
            pairs.append(LrTensor(g, g["lr"], lr, source=lr, version=lr._version))
        elif reads_tensor:  # a float would be baked into the graph; a tensor can follow a scheduler
            g["lr"] = torch.tensor(float(lr), device=device)
            pairs.append(LrTensor(g, g["lr"], lr))
    for p, st in opt.state.items():
        if "step" in st and torch.is_tensor(st["step"]) and st["step"].device != p.device:
            st["step"] = st["step"].to(p.device)
    return pairs


def sync_lr(pairs: list[LrTensor]) -> None:
    """Before a replay: where a scheduler put a float lr back into a param group, or the user's
    own CPU lr tensor changed in place (its version moved), copy the new value into the group's
    lr tensor (a fill: no host sync) and put the tensor back."""
    for lr in pairs:
        src = lr.source
        if src is not None and src._version != lr.version:
            lr.tensor.fill_(float(src))
            lr.version = src._version
        if lr.group["lr"] is not lr.tensor:
            lr.tensor.fill_(float(lr.group["lr"]))
            lr.group["lr"] = lr.tensor


def draw_reason(drew: str) -> str:
    """Why a step that drew from the host generators ``drew`` is not replayed."""
    return f"the step draws random numbers on the host ({drew}): a graph would replay the first draw"


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
    def key(batch: Any) -> Any:
        """The batch's key (:func:`batch_key`: its structure, tensor shapes and other leaves)."""
        return batch_key(batch)

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
        if len(self.seen_once) >= SEEN_ONCE_KEPT:  # keys that never come back (a leaf new every step)
            self.seen_once.clear()
        self.seen_once.add(key)
        return "eager"

    @staticmethod
    def checked(step: Callable[[], Any], draws: HostDraws | None = None) -> tuple[Any, str | None]:
        """Run ``step`` once eagerly on a side stream (PyTorch's warm-up before a capture) and say
        why a graph of it would train wrong: a host sync (with the user's line) or a host random
        draw from any generator ``draws`` watches (a graph would replay the first draw). Other
        warnings are shown as usual."""
        draws = draws or HostDraws()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        prev = torch.cuda.get_sync_debug_mode()
        rng = draws.snapshot()
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
        drew = draws.changed(rng)
        if drew:
            return out, draw_reason(drew)
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
