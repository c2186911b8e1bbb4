"""The fit's phase clock: every second of a fit charged to exactly one phase.

A fit is more than its training steps: start-up (imports, the model and the data built, Lightning's
set-up), compiles, validation, checkpoint saves, the epoch edges (the loader restarted, the
epoch-end hooks) and the host syncs that logging and the progress bar cause. :class:`PhaseClock`
keeps one *base* phase (what the fit is doing between events: start-up, training, an epoch edge)
and a stack of *claims* nested in it (a validation run, a save inside it, a compile inside a
step); the time between two events is charged to the innermost one, so the phases never count a
second twice and always add up to the clock's whole span. :class:`PhaseProfiler` is a Lightning
profiler that claims what Lightning wraps in its profiler's actions (a save, the checkpoint and
progress-bar callbacks' hooks, the validation loader's creation); :class:`CompileWatch` claims
each graph Dynamo compiles.

On CUDA the clock synchronizes where a phase that must not inherit queued GPU work begins or ends
(a validation run, a save, a compile, an epoch edge: a few times an epoch, never per step), so a
training step's GPU time is not charged to the validation that follows it.

Example:
    >>> ticks = iter([1.0, 1.5, 1.75, 3.0])
    >>> clock = PhaseClock(origin=0.0, now=lambda: next(ticks))
    >>> clock.set_base("train")              # 0-1 s: start-up
    >>> clock.enter("validation")            # 1-1.5 s: training
    >>> clock.leave("validation")            # 1.5-1.75 s: validation
    >>> clock.finish()                       # 1.75-3 s: training; the seconds since the origin
    3.0
    >>> {k: v for k, v in clock.totals.items() if v}
    {'startup': 1.0, 'train': 1.75, 'validation': 0.25}
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from typing import Any

from fastloop._compat import PassThroughProfiler

__all__ = ["PHASES", "CompileWatch", "PhaseClock", "PhaseProfiler"]

PHASES = ("startup", "compile", "train", "validation", "checkpoint", "epoch_edges", "host_syncs", "other")
"""The phases of a fit, in the JSON contract's order (``other``: what no phase claims)."""


class PhaseClock:
    """Charges the time between events to the phase under way (see the module's docstring).

    Args:
        origin: the clock's zero (``time.monotonic()`` when the fit's process was started: the
            outside clock's start, shared by every process on the machine).
        base: the phase the clock starts in.
        now: the clock (``time.monotonic``; the system-wide clock, so a parent's origin holds).
        sync: called where a phase boundary must not leave device work queued (CUDA's synchronize).
    """

    def __init__(
        self,
        origin: float,
        base: str = "startup",
        now: Callable[[], float] = time.monotonic,
        sync: Callable[[], None] | None = None,
    ) -> None:
        self.origin = origin
        self._now, self._sync = now, sync
        self._base = base
        self._stack: list[str] = []
        self._last = origin
        self.totals: dict[str, float] = dict.fromkeys(PHASES, 0.0)
        self.by_epoch: dict[int, dict[str, float]] = {}
        self.epoch: int | None = None
        """The epoch charged besides the totals (None before training starts: start-up)."""
        self.failed_in: tuple[str, float] | None = None
        """(the claim, the second) where an exception first left a claim: where a fit that raised was."""
        self.interruptions = 0
        """Counts the phases that stop training (a base phase other than training; a claim entered
        with ``sync``: a validation run, a save, a compile), not the per-step claims (the progress
        bar, logging, a checkpoint callback's check): two steps between which it did not change
        ran back to back (the steady steps of the step-only figure)."""

    @property
    def current(self) -> str:
        """The phase the next charge goes to."""
        return self._stack[-1] if self._stack else self._base

    def seconds(self) -> float:
        """Seconds since the origin (the outside clock's start)."""
        return self._now() - self.origin

    def _charge(self, sync: bool = False) -> float:
        if sync and self._sync is not None:
            self._sync()
        t = self._now()
        dt, self._last = t - self._last, t
        phase = self.current
        self.totals[phase] += dt
        if self.epoch is not None:
            self.by_epoch.setdefault(self.epoch, dict.fromkeys(PHASES, 0.0))[phase] += dt
        return t

    def charged(self, phase: str) -> float:
        """The seconds charged to ``phase`` so far, up to now."""
        self._charge()
        return self.totals[phase]

    def set_base(self, phase: str, sync: bool = False) -> None:
        """What the fit does between events from now on (its claims stay open)."""
        if phase == self._base:
            return
        self._charge(sync)
        self._base = phase
        if phase != "train":
            self.interruptions += 1

    def enter(self, phase: str, sync: bool = False) -> None:
        """A claim begins: time goes to ``phase`` until :meth:`leave`."""
        self._charge(sync)
        self._stack.append(phase)
        if sync:
            self.interruptions += 1

    def leave(self, phase: str, sync: bool = False) -> None:
        """The innermost open claim of ``phase`` ends (claims opened inside it and left open, by an
        exception, end with it)."""
        self._charge(sync)
        if phase in self._stack:
            while self._stack.pop() != phase:
                pass

    @contextlib.contextmanager
    def claim(self, phase: str, sync: bool = False) -> Iterator[None]:
        """``with clock.claim("checkpoint"): ...``: the block's time goes to ``phase``."""
        self.enter(phase, sync)
        try:
            yield
        except BaseException:
            if self.failed_in is None:
                self.failed_in = (phase, self.seconds())
            raise
        finally:
            self.leave(phase, sync)

    def wrap(self, fn: Callable[..., Any], phase: str, sync: bool = False) -> Callable[..., Any]:
        """``fn`` with its calls claimed by ``phase``."""

        def claimed(*args: Any, **kwargs: Any) -> Any:
            with self.claim(phase, sync):
                return fn(*args, **kwargs)

        return claimed

    def finish(self, base: str | None = None) -> float:
        """Charge what is left and close every claim; returns the seconds since the origin."""
        t = self._charge()
        self._stack.clear()
        if base is not None:
            self._base = base
        return t - self.origin

    def open_claims(self) -> list[str]:
        """The claims open now, outermost first (where a fit that raised was)."""
        return [self._base, *self._stack]


_UNCLAIMED = contextlib.nullcontext()


class PhaseProfiler(PassThroughProfiler):
    """A Lightning profiler that claims the actions Lightning wraps in it: ``save_checkpoint`` and
    every hook of a checkpoint callback (``checkpoint``), every hook of a progress bar (its metric
    reads to the host and its refresh: ``host_syncs``), the validation loader's creation
    (``validation``). Every other action gets one shared no-op context (it costs next to nothing).

    Args:
        clock: the fit's :class:`PhaseClock`.
        checkpoint_keys: the ``state_key`` of each checkpoint callback of the Trainer.
        progress_keys: the ``state_key`` of its progress bar.

    Example:
        >>> clock = PhaseClock(origin=0.0)
        >>> prof = PhaseProfiler(clock, checkpoint_keys={"ModelCheckpoint{}"}, progress_keys={"TQDMProgressBar"})
        >>> [prof.phase_of(a) for a in ("save_checkpoint", "[Callback]TQDMProgressBar.on_train_batch_end",
        ...                             "[Callback]ModelCheckpoint{}.on_validation_end", "run_training_batch")]
        ['checkpoint', 'host_syncs', 'checkpoint', None]
    """

    def __init__(self, clock: PhaseClock, checkpoint_keys: set[str], progress_keys: set[str]) -> None:
        super().__init__()
        self.clock = clock
        self.checkpoint_keys, self.progress_keys = set(checkpoint_keys), set(progress_keys)

    def phase_of(self, action: str) -> str | None:
        """The phase that claims ``action`` (None: the phase under way keeps it)."""
        if action == "save_checkpoint":
            return "checkpoint"
        if action.endswith(".val_dataloader"):
            return "validation"
        if action.startswith("[Callback]"):
            key = action[len("[Callback]") :].rpartition(".")[0]
            if key in self.checkpoint_keys:
                return "checkpoint"
            if key in self.progress_keys:
                return "host_syncs"
        return None

    def profile(self, action_name: str) -> Any:
        phase = self.phase_of(action_name)
        if phase is None:
            return _UNCLAIMED
        return self.clock.claim(phase, sync=action_name == "save_checkpoint")

    def start(self, action_name: str) -> None:
        pass  # the loaders' fetches (started and stopped apart) belong to the phase under way

    def stop(self, action_name: str) -> None:
        pass


class CompileWatch:
    """Each graph Dynamo compiles, claimed as ``compile`` by the clock and recorded: what set it
    off (a new frame, a deferred backward, a CUDA graph recorded), the phase it interrupted, its
    seconds, and whether Inductor found it in its cache (a warm compile) or built it cold.

    Args:
        clock: the fit's :class:`PhaseClock`.
        hooks: registers ``(start, end)`` with Dynamo and returns the undo
            (:func:`fastloop._torch_private.compile_event_hooks`).
        counters: Dynamo's counters (:func:`fastloop._torch_private.dynamo_counters`).
    """

    def __init__(
        self,
        clock: PhaseClock,
        hooks: Callable[[Callable[[Any], None], Callable[[Any], None]], Callable[[], None]],
        counters: Callable[[], dict],
    ) -> None:
        self.clock, self._counters = clock, counters
        self.events: list[dict] = []
        self._open: tuple[float, str, tuple[int, int]] | None = None
        self._undo = hooks(self._start, self._end)

    def _cache(self) -> tuple[int, int]:
        inductor = self._counters().get("inductor") or {}
        return int(inductor.get("fxgraph_cache_hit", 0)), int(inductor.get("fxgraph_cache_miss", 0))

    def _start(self, args: Any) -> None:
        self._open = (self.clock.seconds(), self.clock.current, self._cache())
        self.clock.enter("compile", sync=True)

    def _end(self, args: Any) -> None:
        if self._open is None:
            return
        started, interrupted, (hits, misses) = self._open
        self._open = None
        self.clock.leave("compile", sync=True)
        now_hits, now_misses = self._cache()
        trigger = getattr(getattr(args, "callback_trigger", None), "name", None)
        self.events.append(
            {
                "trigger": (trigger or "DYNAMO").lower(),
                "phase": interrupted,
                "at_s": started,
                "seconds": self.clock.seconds() - started,
                "cache": "warm"
                if now_hits > hits and now_misses == misses
                else "cold"
                if now_misses > misses
                else None,
            }
        )

    def close(self) -> None:
        """Stop watching (Dynamo's hooks are process-wide)."""
        self._undo()

    def summary(self) -> dict:
        """``{"count", "seconds", "warm", "cold", "events"}`` (``warm``/``cold``: graphs Inductor
        found in / built outside its cache; a backend without that cache counts in neither)."""
        return {
            "count": len(self.events),
            "seconds": sum(e["seconds"] for e in self.events),
            "warm": sum(e["cache"] == "warm" for e in self.events),
            "cold": sum(e["cache"] == "cold" for e in self.events),
            "events": list(self.events),
        }
