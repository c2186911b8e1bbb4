"""The captured step: the one engine of ``cuda_graph``'s whole-step tier, driven by both adapters.

A CUDA graph replays the kernels it recorded with the scalars it recorded. :class:`CapturedStep`
owns everything that decides whether a whole training step (forward, backward, optimizer) may be
replayed and keeps it right while it is: the warm-up, the optimizer's preparation, the checks
for host syncs and host random draws, the check of the schedulers before the first step, the
guard before every replay and the fallback. The adapters are thin drivers: the plain loop
(:class:`fastloop.adapters.graph_step.GraphedStep`) hands it its step function and batch;
Lightning (:class:`fastloop.adapters.lightning_graph.WholeStepGraph`) hands it the batch after
``batch_to_device`` and its ``optimizer_step`` with the closure, and keeps what only it has (the
closure's result and the values ``training_step`` logged, re-logged after each replay).

The warm-up, the same in both adapters (also in docs/speedups/cuda_graph.md):

1. :data:`EAGER_STEPS` real steps as the user's code runs them (the optimizer's state exists
   afterwards, compile has built its code);
2. a checked step: a real step on a side stream, watched for host syncs and host random draws. A
   draw fails the whole step at once (a graph would replay the first draw); a sync is tolerated
   in one checked step of :data:`CHECKED_STEPS` (a first-step-only sync such as a logger's first
   call), a second one fails;
3. the next step whose batch has the checked step's shapes is captured (nothing runs while a
   graph records) and replayed at once, for real; every later step of those shapes replays; a
   batch of other shapes is captured at its second step (:meth:`StepGraphs.route`).

The optimizer (:func:`prepare_for_capture`): fused where it can be (its lr then a device tensor
that the scheduler fills in place), else its capturable form; a scheduler that cycles a
hyperparameter the graph bakes in (momentum, betas) or an lr that would stay a Python number
while a scheduler changes it refuses the whole step before the first step, with a reason that
names the optimizer or the scheduler. Before every replay the numbers the graph baked in are
compared with the optimizer's (:class:`Baked`): a change made another way (by hand, by a
callback) ends the replays, and the driver drops one tier.

Example (no GPU: a stand-in for the graphs, as the CPU tests use):
    >>> import torch
    >>> p = torch.nn.Parameter(torch.ones(2))
    >>> sgd = torch.optim.SGD([p], lr=0.1, momentum=0.9)
    >>> prepare_for_capture(sgd, [torch.optim.lr_scheduler.OneCycleLR(sgd, max_lr=1.0, total_steps=10)])
    Traceback (most recent call last):
    ...
    fastloop.errors.GraphIneligible: OneCycleLR cycles SGD's momentum every step (cycle_momentum=True), which a graph would bake in
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import torch

from fastloop.data import map_tensors
from fastloop.errors import GraphIneligible
from fastloop.speedups.fused_optimizer import apply_fused_optimizer, why_not_fused
from fastloop.speedups.graph_capture import StepGraphs, copy_into, make_capturable, sync_lr

__all__ = [
    "CHECKED_STEPS",
    "EAGER_STEPS",
    "Baked",
    "CapturedStep",
    "Entry",
    "PreparedOptimizer",
    "cycled_hyperparameters",
    "prepare_for_capture",
]

EAGER_STEPS = 2
"""Real eager steps before the first checked step (both adapters)."""
CHECKED_STEPS = 2
"""Checked steps at most: a host sync in one is tolerated, in the second it fails the whole step."""

GRAPH_CORE: Callable[[], StepGraphs] = StepGraphs
"""What makes a run's graphs (a stand-in in the CPU tests, tests/graph_standin.py)."""

CYCLING = {"OneCycleLR": "cycle_momentum", "CyclicLR": "cycle_momentum"}
"""Schedulers that change a hyperparameter besides lr every step when this flag of theirs is on."""


def _schedulers(schedulers: Iterable[Any]) -> list[Any]:
    """The schedulers, with the members of a SequentialLR or ChainedScheduler in their place."""
    out: list[Any] = []
    for s in schedulers:
        inner = getattr(s, "_schedulers", None)
        out += _schedulers(inner) if isinstance(inner, (list, tuple)) else [s]
    return out


def cycled_hyperparameters(schedulers: Iterable[Any]) -> str | None:
    """Why a whole-step graph cannot follow ``schedulers``: one of them cycles a hyperparameter
    the graph bakes in (OneCycleLR and CyclicLR cycle SGD's momentum or Adam's beta1 by default),
    known before the first step; None when none does.

    Example:
        >>> opt = torch.optim.AdamW([torch.nn.Parameter(torch.ones(1))])
        >>> cycled_hyperparameters([torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.1, total_steps=4)])
        "OneCycleLR cycles AdamW's betas every step (cycle_momentum=True), which a graph would bake in"
        >>> print(cycled_hyperparameters([torch.optim.lr_scheduler.StepLR(opt, 1)]))
        None
    """
    for sched in _schedulers(schedulers):
        flag = CYCLING.get(type(sched).__name__)
        if flag and getattr(sched, flag, False):
            opt = getattr(sched, "optimizer", None)
            what = "betas" if opt is not None and "betas" in opt.defaults else "momentum"
            owner = f"{type(opt).__name__}'s" if opt is not None else "the optimizer's"
            return f"{type(sched).__name__} cycles {owner} {what} every step ({flag}=True), which a graph would bake in"
    return None


class Baked:
    """What a graph baked in of an optimizer: every number of every param group that is not a
    tensor the graph reads (a tensor lr is followed: :func:`~fastloop.speedups.graph_capture.sync_lr`),
    and which tensor each other tensor hyperparameter was. :meth:`changed` names the first that
    differs now.

    Example:
        >>> opt = torch.optim.SGD([torch.nn.Parameter(torch.ones(1))], lr=0.1, momentum=0.9)
        >>> baked = Baked(opt)
        >>> print(baked.changed())
        None
        >>> opt.param_groups[0]["momentum"] = 0.8
        >>> baked.changed()
        "param group 0's momentum (0.9 when captured, 0.8 now)"
    """

    def __init__(self, optimizer: torch.optim.Optimizer) -> None:
        self.values = [
            (i, g, k, v)
            for i, g in enumerate(optimizer.param_groups)
            for k, v in g.items()
            if k != "params" and not (k == "lr" and torch.is_tensor(v))
        ]

    def changed(self) -> str | None:
        for i, g, k, v in self.values:
            now = g.get(k)
            if now is v or (not torch.is_tensor(v) and not torch.is_tensor(now) and now == v):
                continue
            return f"param group {i}'s {k} ({v!r} when captured, {now!r} now)"
        return None


@dataclass
class PreparedOptimizer:
    """An optimizer made ready for a whole-step graph (:func:`prepare_for_capture`)."""

    optimizer: torch.optim.Optimizer
    lr_pairs: list[tuple[dict, torch.Tensor]]
    """(param group, its lr tensor): a float a scheduler puts back is copied into the tensor."""
    floats: list[Any]
    """The lrs before (put back by :meth:`restore`)."""
    fused: bool
    """It was switched to its fused implementation for the graph."""

    def sync(self) -> None:
        """Before a replay: a float lr put back into a group reaches the graph's lr tensor."""
        sync_lr(self.lr_pairs)

    def restore(self) -> None:
        """The float lrs back (after the fit: the user's optimizer as it was, but fused)."""
        for g, old in zip(self.optimizer.param_groups, self.floats):
            if torch.is_tensor(g["lr"]) and not torch.is_tensor(old):
                g["lr"] = float(g["lr"])


def prepare_for_capture(optimizer: torch.optim.Optimizer, schedulers: Iterable[Any] = ()) -> PreparedOptimizer:
    """Make ``optimizer`` ready for a graph that follows ``schedulers`` (the schedulers of the run),
    in place: fused where it can be, its lr a device tensor the schedulers fill, else its
    capturable form. Raises GraphIneligible, naming the optimizer or the scheduler, where the
    graph could not follow them: a scheduler cycles momentum or betas; the lr would stay a Python
    number (no fused or capturable implementation reads a tensor) while a scheduler changes it;
    the optimizer has no capturable implementation.

    Example:
        >>> p = torch.nn.Parameter(torch.ones(2))
        >>> sgd = torch.optim.SGD([p], lr=0.1, momentum=0.9, differentiable=True)
        >>> prepare_for_capture(sgd, [torch.optim.lr_scheduler.StepLR(sgd, step_size=1)])
        Traceback (most recent call last):
        ...
        fastloop.errors.GraphIneligible: SGD reads its lr as a Python number (differentiable optimizers cannot be fused), which a graph would bake in while StepLR changes it
    """
    scheds = _schedulers(schedulers)
    why = cycled_hyperparameters(scheds)
    if why:
        raise GraphIneligible(why)
    floats = [g["lr"] for g in optimizer.param_groups]
    not_fused = why_not_fused(optimizer)
    if not_fused is None and not any(g.get("fused") for g in optimizer.param_groups):
        apply_fused_optimizer(optimizer)
    pairs = make_capturable(optimizer)
    if scheds and len(pairs) < len(optimizer.param_groups):
        names = ", ".join(dict.fromkeys(type(s).__name__ for s in scheds))
        because = not_fused or "no fused or capturable form of it reads a tensor lr"
        raise GraphIneligible(
            f"{type(optimizer).__name__} reads its lr as a Python number ({because}), which a graph "
            f"would bake in while {names} changes it"
        )
    return PreparedOptimizer(optimizer, pairs, floats, fused=not_fused is None)


@dataclass
class Entry:
    """One captured batch shape: its graph, static batch, what the step returned while it was
    captured, what the driver keeps for its replays, and what the graph baked in."""

    graph: Any
    static: Any
    out: Any
    kept: Any
    baked: Baked | None


@dataclass
class CapturedStep:
    """The whole-step graph of one run (see the module's docstring): drive it with :meth:`batch`
    (the batch the step is to see) then :meth:`step` (run this step the way :attr:`route` says).

    Args:
        on_fallback: called once with the reason when the whole step stops being replayed (the
            driver drops one tier).
        graphs: the capture core (a stand-in in the CPU tests).
    """

    on_fallback: Callable[[str], None] | None = None
    graphs: StepGraphs = field(default_factory=lambda: GRAPH_CORE())
    prepared: PreparedOptimizer | None = None
    """The optimizer as :func:`prepare_for_capture` left it (None: not prepared, nothing baked is guarded)."""
    failed: str | None = None
    steps: int = 0
    replays: int = 0
    eager_after_capture: int = 0
    route: str = "eager"
    """What :meth:`step` does with this step: eager, check, capture or replay."""
    _checks_left: int = CHECKED_STEPS
    _clean: bool = False
    _warm_key: tuple | None = None
    _key: tuple | None = None
    _static: Any = None
    _entry: Entry | None = None

    def prepare(self, optimizer: torch.optim.Optimizer, schedulers: Iterable[Any] = ()) -> bool:
        """:func:`prepare_for_capture`; a refusal fails the whole step (False)."""
        try:
            self.prepared = prepare_for_capture(optimizer, schedulers)
        except GraphIneligible as err:
            self.fail(str(err))
            return False
        return True

    @property
    def captured(self) -> bool:
        return bool(self.graphs.entries) and self.failed is None

    def batch(self, batch: Any) -> Any:
        """Decide this step's route from ``batch``'s shapes and return the batch the step is to
        see: the graph's static buffers (this batch copied in) where it is captured or replayed."""
        self._entry = None
        if self.failed is not None or self.steps < EAGER_STEPS:
            self.route = "eager"
            return batch
        key = StepGraphs.key(batch)
        if not self.graphs.entries:
            if not self._clean:
                self.route, self._warm_key = "check", key
                return batch
            if key != self._warm_key:  # not the checked step's shapes (a short last batch): a later one
                self.route = "eager"
                return batch
            return self._to_capture(key, batch)
        route = self.graphs.route(key)
        if route == "replay":
            self.route, self._entry = "replay", self.graphs.entries[key]
            copy_into(self._entry.static, batch)
            return self._entry.static
        if route == "capture":
            return self._to_capture(key, batch)
        self.route = "eager"
        self.eager_after_capture += 1
        return batch

    def _to_capture(self, key: tuple, batch: Any) -> Any:
        self.route, self._key = "capture", key
        self._static = map_tensors(lambda t: t.clone(), batch)
        return self._static

    def step(
        self,
        eager: Callable[[], Any],
        *,
        replayed: Callable[[Entry], Any],
        recorded: Callable[[], Any] | None = None,
        kept: Callable[[Any], tuple[Any, str | None]] | None = None,
    ) -> Any:
        """Run this step by :attr:`route`: ``eager()`` (the step as the user's code runs it, on the
        batch :meth:`batch` returned), checked, captured then replayed, or replayed.
        ``replayed(entry)`` gives the step's result after a replay; ``recorded()``: the step as
        the capture records it (default ``eager``; Lightning's notes what it logs); ``kept(out)``,
        after a capture, what the driver keeps for the replays and why they could not be right
        (None: they can)."""
        try:
            if self.route == "check":
                return self._check(eager)
            if self.route == "capture":
                return self._capture(eager, recorded or eager, replayed, kept)
            if self.route == "replay":
                return self._replay(eager, replayed)
            return eager()
        finally:
            self.steps += 1
            self.route = "eager"  # a step not announced by batch() runs eagerly

    def _check(self, eager: Callable[[], Any]) -> Any:
        out, why = self.graphs.checked(eager)
        self._clean = why is None
        if why is not None:
            self._checks_left -= 1
            if "random numbers" in why or self._checks_left <= 0:  # a draw: at once; a sync: the second time
                self.fail(why)
        return out

    def _capture(
        self,
        eager: Callable[[], Any],
        recorded: Callable[[], Any],
        replayed: Callable[[Entry], Any],
        kept: Callable[[Any], tuple[Any, str | None]] | None,
    ) -> Any:
        t0 = time.perf_counter()
        late = bool(self.graphs.entries)
        err: str | None = None
        extra: Any = None
        try:
            graph, out = self.graphs.capture(recorded)
        except GraphIneligible as e:
            err = str(e)
        if err is None and kept is not None:
            extra, err = kept(out)
        if err is not None:
            self.graphs.synchronize()
            if late:  # this shape stays eager; the shapes captured before replay on
                self.graphs.refuse(self._key, err)
            else:
                self.fail(err)
            return eager()  # nothing of the captured step ran: run it for real
        entry = Entry(graph, self._static, out, extra, Baked(self.prepared.optimizer) if self.prepared else None)
        self.graphs.add(self._key, entry, time.perf_counter() - t0)
        graph.replay()  # this step, for real
        return replayed(entry)

    def _replay(self, eager: Callable[[], Any], replayed: Callable[[Entry], Any]) -> Any:
        entry = self._entry
        assert entry is not None
        if self.prepared is not None:
            self.prepared.sync()
        changed = entry.baked.changed() if entry.baked is not None else None
        if changed:
            self.fail(
                f"{changed}: a scheduler or your code changed a hyperparameter the graph baked in; "
                f"the steps from here on do not replay it"
            )
            return eager()
        entry.graph.replay()
        self.replays += 1
        return replayed(entry)

    def fail(self, reason: str) -> None:
        """Replay no more, for ``reason`` (the first reason wins); the driver is told once."""
        if self.failed is None:
            self.failed = reason
            if self.on_fallback is not None:
                self.on_fallback(reason)

    def detail(self) -> str:
        """What happened, for the run's record."""
        if self.failed is not None:
            return f"whole step not captured: {self.failed}"
        if not self.graphs.entries:
            return "whole step: not captured yet"
        fused = ", the optimizer fused for it" if self.prepared is not None and self.prepared.fused else ""
        out = (
            f"whole step (forward, backward, optimizer) captured in {self.graphs.capture_s:.2f} s{fused}, "
            f"{self.replays} replays" + self.graphs.describe()
        )
        if self.eager_after_capture:
            out += f", {self.eager_after_capture} steps of another batch shape eager"
        return out

    def finish(self, ctx: Any, owner: str) -> None:
        """After the run, in both adapters at the same moment: the record's detail and the
        statistics of a whole step that replayed (``OWNER_capture_s``, ``OWNER_shapes``), or
        ``skipped`` where the run ended before the capture. A whole step that failed said so at
        the time (its driver dropped one tier)."""
        if self.failed is not None or not ctx.applied(owner):
            return
        if not self.graphs.entries:
            ctx.record(
                owner,
                "skipped",
                f"the run ended after {self.steps} steps, before the whole step was captured "
                f"({EAGER_STEPS} eager and up to {CHECKED_STEPS} checked steps come first)",
            )
            return
        ctx.describe(owner, self.detail())
        ctx.stats[f"{owner}_tier"] = "whole step"
        if self.graphs.capture_s is not None:
            ctx.stats[f"{owner}_capture_s"] = round(self.graphs.capture_s, 3)
        ctx.stats[f"{owner}_shapes"] = self.graphs.summary()
