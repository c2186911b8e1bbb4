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
3. the next step whose key (the batch's :func:`~fastloop.speedups.cuda_graph.graph_capture.batch_key` and
   the step's state) was checked clean is captured (nothing runs while a graph records) and
   replayed at once, for real; every later step of that key replays; a key first seen later (a
   batch shape, a task string, a new state) runs eagerly once, watched for host draws (a branch
   the first graph did not take), and is captured at its second step (:meth:`StepGraphs.route`).

The optimizer (:func:`prepare_for_capture`): fused where it can be (its lr then a device tensor
that the scheduler fills in place; an lr given as a CPU tensor is copied there and followed),
else its capturable form; a scheduler that cycles a hyperparameter the graph bakes in (momentum,
betas) or an lr that would stay a Python number while a scheduler changes it refuses the whole
step before the first step, with a reason that names the optimizer or the scheduler.

The guard, before every step (:meth:`CapturedStep._guard`, :mod:`fastloop.speedups.cuda_graph.graph_guard`;
docs/speedups/cuda_graph.md says what it covers and what it does not): the driver's own check
(Lightning's ``accumulate_grad_batches``) and a changed hyperparameter (:class:`Baked`: every
one of every group, whatever its type) end the replays, and the driver drops one tier; param
groups added or replaced (``add_param_group``, ``load_state_dict`` in a resumed fit) are prepared
again; a new state of the step (:class:`~fastloop.speedups.cuda_graph.graph_guard.StepState`: the groups,
``requires_grad``, module modes and Python attributes) is a new key, captured as its own graph
(up to :data:`~fastloop.speedups.cuda_graph.graph_capture.MAX_GRAPHS` states), each change named in the
record with its step.

Example (no GPU: a stand-in for the graphs, as the CPU tests use):
    >>> import torch
    >>> p = torch.nn.Parameter(torch.ones(2))
    >>> sgd = torch.optim.SGD([p], lr=0.1, momentum=0.9)
    >>> cycle = torch.optim.lr_scheduler.OneCycleLR(sgd, max_lr=1.0, total_steps=10)
    >>> prepare_for_capture(sgd, [cycle])  # doctest: +NORMALIZE_WHITESPACE
    Traceback (most recent call last):
    ...
    fastloop.errors.GraphIneligible: OneCycleLR cycles SGD's momentum every step (cycle_momentum=True), which a
    graph would bake in
"""

from __future__ import annotations

import operator
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import torch

from fastloop.data import map_tensors
from fastloop.errors import GraphIneligible
from fastloop.speedups.cuda_graph.graph_capture import (
    MAX_GRAPHS,
    LrTensor,
    StepGraphs,
    batch_key,
    copy_into,
    draw_reason,
    make_capturable,
    sync_lr,
)
from fastloop.speedups.cuda_graph.graph_guard import Baked, HostDraws, StepState
from fastloop.speedups.fused_optimizer import apply_fused_optimizer, why_not_fused

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


@dataclass
class PreparedOptimizer:
    """An optimizer made ready for a whole-step graph (:func:`prepare_for_capture`)."""

    optimizer: torch.optim.Optimizer
    lr_pairs: list[LrTensor]
    """Each group's lr as the graph reads it (a float a scheduler puts back is copied into it)."""
    fused: bool
    """It was switched to its fused implementation for the graph."""
    groups: list[dict] = field(default_factory=list)
    """The param groups as prepared: another list (a group added, the groups replaced by
    ``load_state_dict``) is prepared again (:meth:`stale`)."""

    def sync(self) -> None:
        """Before a replay: a float lr put back into a group, or the user's CPU lr tensor changed
        in place, reaches the graph's lr tensor."""
        sync_lr(self.lr_pairs)

    def stale(self) -> bool:
        """The optimizer's param groups are not the ones prepared (O(groups): identities)."""
        groups = self.optimizer.param_groups
        return len(groups) != len(self.groups) or not all(map(operator.is_, groups, self.groups))

    def restore(self) -> None:
        """The lrs as they were given, with their current values (after the fit: the user's
        optimizer as it was, but fused): a float back where there was one, the user's own lr
        tensor back where it was not on the device."""
        self.sync()
        current = {id(g) for g in self.optimizer.param_groups}
        for lr in self.lr_pairs:
            if id(lr.group) not in current:
                continue
            if lr.source is not None:
                with torch.no_grad():
                    lr.source.copy_(lr.tensor)
                lr.group["lr"] = lr.source
            elif not torch.is_tensor(lr.original):
                lr.group["lr"] = float(lr.group["lr"])


def prepare_for_capture(
    optimizer: torch.optim.Optimizer, schedulers: Iterable[Any] = (), before: PreparedOptimizer | None = None
) -> PreparedOptimizer:
    """Make ``optimizer`` ready for a graph that follows ``schedulers`` (the schedulers of the run),
    in place: fused where it can be, its lr a device tensor the schedulers fill (a CPU tensor lr
    copied to the device and followed), else its capturable form. ``before``: a preparation of
    the same optimizer whose groups changed since (a group added, the groups replaced); its lr
    tensors stay for the groups it holds. Raises GraphIneligible, naming the optimizer or the
    scheduler, where the graph could not follow them: a scheduler cycles momentum or betas; the
    lr would stay a Python number (no fused or capturable implementation reads a tensor) while a
    scheduler changes it; the optimizer has no capturable implementation.

    Example:
        >>> p = torch.nn.Parameter(torch.ones(2))
        >>> sgd = torch.optim.SGD([p], lr=0.1, momentum=0.9, differentiable=True)
        >>> step_lr = torch.optim.lr_scheduler.StepLR(sgd, step_size=1)
        >>> prepare_for_capture(sgd, [step_lr])  # doctest: +NORMALIZE_WHITESPACE
        Traceback (most recent call last):
        ...
        fastloop.errors.GraphIneligible: SGD reads its lr as a Python number (differentiable optimizers cannot be
        fused), which a graph would bake in while StepLR changes it
    """
    scheds = _schedulers(schedulers)
    why = cycled_hyperparameters(scheds)
    if why:
        raise GraphIneligible(why)
    not_fused = why_not_fused(optimizer)
    if not_fused is None and not all(g.get("fused") for g in optimizer.param_groups):
        apply_fused_optimizer(optimizer)
    pairs = make_capturable(optimizer, keep=before.lr_pairs if before is not None else ())
    if scheds and len(pairs) < len(optimizer.param_groups):
        names = ", ".join(dict.fromkeys(type(s).__name__ for s in scheds))
        because = not_fused or "no fused or capturable form of it reads a tensor lr"
        raise GraphIneligible(
            f"{type(optimizer).__name__} reads its lr as a Python number ({because}), which a graph "
            f"would bake in while {names} changes it"
        )
    return PreparedOptimizer(optimizer, pairs, fused=not_fused is None, groups=list(optimizer.param_groups))


@dataclass
class Entry:
    """One captured key (batch and state): its graph, static batch, what the step returned while
    it was captured, what the driver keeps for its replays, and what the graph baked in."""

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
        blocker: the driver's check before every step (None: nothing to check); a reason ends
            the replays (Lightning: ``accumulate_grad_batches`` changed by a callback).
    """

    on_fallback: Callable[[str], None] | None = None
    graphs: StepGraphs = field(default_factory=lambda: GRAPH_CORE())
    blocker: Callable[[], str | None] | None = None
    prepared: PreparedOptimizer | None = None
    """The optimizer as :func:`prepare_for_capture` left it (None: not prepared, nothing baked is guarded)."""
    failed: str | None = None
    steps: int = 0
    replays: int = 0
    eager_after_capture: int = 0
    route: str = "eager"
    """What :meth:`step` does with this step: eager, check, watch (eager, watched for host draws),
    capture or replay."""
    changes: list[str] = field(default_factory=list)
    """Each change of the step's state seen while the run trained (``step N: what``)."""
    _checks_left: int = CHECKED_STEPS
    _clean_keys: set = field(default_factory=set)
    """Keys whose checked step was clean: the first capture takes the next step of one of them."""
    _warm_key: Any = None
    _key: Any = None
    _static: Any = None
    _entry: Entry | None = None
    _schedulers: list = field(default_factory=list)
    _model: torch.nn.Module | None = None
    _state: StepState | None = None
    _draws: HostDraws = field(default_factory=HostDraws)
    _fingerprint: tuple | None = None
    _states: dict = field(default_factory=dict)
    _state_id: int = 0

    def prepare(
        self,
        optimizer: torch.optim.Optimizer,
        schedulers: Iterable[Any] = (),
        *,
        model: torch.nn.Module | None = None,
        roots: Iterable[Any] = (),
    ) -> bool:
        """:func:`prepare_for_capture`; a refusal fails the whole step (False). ``model``: the
        module the step runs (its state is guarded: :class:`StepState`); ``roots``: what else the
        step's Python reads (the step function), searched with the model for host generators."""
        self._schedulers, self._model = list(schedulers), model
        self._state = StepState(optimizer, model)
        self._draws = HostDraws([model, *roots])
        try:
            self.prepared = prepare_for_capture(optimizer, schedulers)
        except GraphIneligible as err:
            self.fail(str(err))
            return False
        return True

    def restore(self) -> None:
        """After the run: the optimizer's lrs as they were given (:meth:`PreparedOptimizer.restore`)."""
        if self.prepared is not None:
            self.prepared.restore()

    @property
    def captured(self) -> bool:
        return bool(self.graphs.entries) and self.failed is None

    def batch(self, batch: Any) -> Any:
        """Decide this step's route from ``batch``'s key (:func:`batch_key` and the step's state)
        and return the batch the step is to see: the graph's static buffers (this batch copied
        in) where it is captured or replayed."""
        self._entry = None
        if self.failed is not None or self.steps < EAGER_STEPS:
            self.route = "eager"
            return batch
        key = (batch_key(batch), self._state_id)
        if not self.graphs.entries:
            if key not in self._clean_keys:  # each key checked before its capture (a short batch, a new state)
                self.route, self._warm_key = "check", key
                return batch
            return self._to_capture(key, batch)
        route = self.graphs.route(key)
        if route == "replay":
            self.route, self._entry = "replay", self.graphs.entries[key]
            copy_into(self._entry.static, batch)
            return self._entry.static
        if route == "capture":
            return self._to_capture(key, batch)
        self.route = "watch" if key in self.graphs.seen_once else "eager"  # its first step: watched for draws
        self.eager_after_capture += 1
        return batch

    def _to_capture(self, key: Any, batch: Any) -> Any:
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
        batch :meth:`batch` returned), checked, captured then replayed, or replayed. The guard
        runs first (:meth:`_guard`). ``replayed(entry)`` gives the step's result after a replay;
        ``recorded()``: the step as the capture records it (default ``eager``; Lightning's notes
        what it logs); ``kept(out)``, after a capture, what the driver keeps for the replays and
        why they could not be right (None: they can)."""
        try:
            if self.failed is None and self.prepared is not None:
                self._guard()
            if self.route == "check":
                return self._check(eager)
            if self.route == "watch":
                return self._watch(eager)
            if self.route == "capture":
                return self._capture(eager, recorded or eager, replayed, kept)
            if self.route == "replay":
                return self._replay(eager, replayed)
            return eager()
        finally:
            self.steps += 1
            self.route = "eager"  # a step not announced by batch() runs eagerly

    def _guard(self) -> None:
        """Before every step (what the step's Python reads may have changed since :meth:`batch`, in
        a hook that ran in between): the driver's blocker (ends the replays); param groups that
        are not the prepared ones (prepared again); the step's state (:class:`StepState`): a new
        state is a new key, this step runs eagerly and the next ones capture a graph for it."""
        assert self.prepared is not None and self._state is not None
        why = self.blocker() if self.blocker is not None else None
        if why:
            self.fail(f"{why} (from step {self.steps})")
            self.route = "eager"
            return
        if self.prepared.stale():
            try:
                self.prepared = prepare_for_capture(self.prepared.optimizer, self._schedulers, before=self.prepared)
            except GraphIneligible as err:
                self.fail(f"{err} (the param groups changed at step {self.steps})")
                self.route = "eager"
                return
        try:
            now = self._state.now()
            same = self._fingerprint is None or now == self._fingerprint
        except Exception as err:  # an attribute deleted, or no longer a Python scalar (a tensor compared)
            self.fail(f"a module attribute the captured step read changed kind at step {self.steps} ({err})")
            self.route = "eager"
            return
        if self._fingerprint is None:
            self._fingerprint, self._states[now] = now, 0
        elif not same:
            self._new_state(now)

    def _new_state(self, now: tuple) -> None:
        assert self._state is not None and self._fingerprint is not None
        what = self._state.describe(self._fingerprint, now)
        self._fingerprint = now
        self._state_id = self._states.setdefault(now, len(self._states))
        if len(self._states) > MAX_GRAPHS:
            self.fail(
                f"the step's state changed at step {self.steps} ({what}), its state number {len(self._states)}: "
                f"more than the {MAX_GRAPHS} graphs kept (a Python value that changes every step?)"
            )
        else:
            self.changes.append(f"step {self.steps}: {what}")
        if self.route in ("capture", "replay"):  # its key was the old state's: this step runs eagerly
            self.route = "eager"

    def _check(self, eager: Callable[[], Any]) -> Any:
        out, why = self.graphs.checked(eager, self._draws)
        if why is None:
            self._clean_keys.add(self._warm_key)
        else:
            self._checks_left -= 1
            if "random numbers" in why or self._checks_left <= 0:  # a draw: at once; a sync: the second time
                self.fail(why)
        return out

    def _watch(self, eager: Callable[[], Any]) -> Any:
        """A new key's first step, eager: a host draw there (a branch the first graph did not take)
        fails the whole step, as in a checked step."""
        before = self._draws.snapshot()
        out = eager()
        drew = self._draws.changed(before)
        if drew:
            self.fail(f"{draw_reason(drew)} (step {self.steps}, a new batch key or state)")
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
            if late:  # this key stays eager; the keys captured before replay on
                self.graphs.refuse(self._key, err)
            else:
                self.fail(err)
            return eager()  # nothing of the captured step ran: run it for real
        baked = None
        if self.prepared is not None:
            baked = Baked(self.prepared.optimizer, followed=[lr.tensor for lr in self.prepared.lr_pairs])
        entry = Entry(graph, self._static, out, extra, baked)
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
                f"{changed} at step {self.steps}: a scheduler or your code changed a hyperparameter the graph "
                f"baked in; the steps from here on do not replay it"
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
            out += f", {self.eager_after_capture} steps of another batch shape or state eager"
        if self.changes:
            shown = self.changes[:4] + ([f"{len(self.changes) - 4} more"] if len(self.changes) > 4 else [])
            out += "; the step's state changed (a graph per state): " + "; ".join(shown)
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
