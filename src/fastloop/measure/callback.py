"""A Lightning callback that times every training step with :class:`StepTimer`.

Data wait is the time between the end of one ``on_train_batch_end`` and the next
``on_train_batch_start``: Lightning fetches the batch and moves it to the device in between.
Lightning also does its own bookkeeping there (progress, logging, schedulers), so where the
Trainer's profiler is a :class:`FeedClock` the host's time getting batches is the loader's
``next`` and the copy to the device alone: on the H200 the GPT recipe's compiled step spent 6.5%
of its host time between the hooks, most of it Lightning's, against ~1% in the loader and copy.
Losses are kept on the device and read once at the end (no per-step ``.item()``).

A loader with worker processes fills ``num_workers x prefetch_factor`` batches while the first
steps run (and while ``torch.compile`` compiles); timing from there would report the buffer,
not the loader. So the warm-up is extended by twice that many steps (``drain=True``): the
buffer drains in ``B / (1 - r)`` steps when the loader delivers a fraction ``r`` of what the
step consumes, so 2B suffices while the loader delivers at most half of that; one that nearly
keeps up drains more slowly, and the runner's steadiness warning flags what is left.
"""

from __future__ import annotations

import math
import time
from typing import Any

import torch

from fastloop._compat import Callback, LightningModule, Trainer
from fastloop._torch_private import is_compiled
from fastloop.measure.batches import batch_items, prefetch_buffer
from fastloop.measure.feed_clock import FeedClock
from fastloop.measure.shapes import ShapeTally
from fastloop.measure.stats import change_point, half_ratio, is_steady
from fastloop.measure.timer import StepStats, StepTimer, collect_garbage

MIN_MEASURED_STEPS = 10  # the fewest measured steps measure_s leaves a run
MAX_MEASURED_STEPS = 50_000  # the most steps a measure_s window measures (a 40 us step in a 2 s window)
WINDOW_OVERRUN = 3.0
"""A ``measure_s`` window ends on the host's clock once it has run this many times longer than
asked (and measured at least MIN_MEASURED_STEPS): a warm-up fed from a full prefetch buffer can
make a data-bound step look 30x faster than it is, and the planned count would then run minutes."""

__all__ = ["FeedClock", "MeasureCallback"]  # FeedClock: its own module, named here for the runner


class MeasureCallback(Callback):
    """Time steps, record data wait, losses, items per step, peak memory and FLOPs.

    Args:
        warmup: leading steps excluded from the statistics (compile and capture happen here).
        count_flops: count FLOPs of the first step with ``torch.utils.flop_counter`` when the
            module does not define ``flops_per_batch(batch)``.
    """

    def __init__(
        self,
        warmup: int = 5,
        count_flops: bool = True,
        drain: bool = True,
        steady: bool = True,
        max_extra_warmup: int | None = None,
        steps: int | None = None,
        profile_steps: int = 0,
        measure_s: float | None = None,
    ) -> None:
        if warmup < 0:
            raise ValueError(f"warmup must be >= 0, got {warmup}")
        if measure_s is not None and not measure_s > 0:
            raise ValueError(f"measure_s must be > 0 seconds, got {measure_s}")
        self.warmup = warmup
        self.steps = steps
        """Stop the fit after this many measured batches (None: the Trainer's own limits). Batches,
        not optimizer steps: with manual optimization or a training_step that returns None,
        Lightning's ``max_steps`` counts something else."""
        self.measure_s = measure_s
        """With ``steps`` and a steady-state warm-up: measure fewer steps (at least
        :data:`MIN_MEASURED_STEPS`) when the warm-up's last step times say ``steps`` would take
        longer than this many seconds (a slow fp32 step needs fewer steps for a precise mean)."""
        self.steps_planned = steps
        """``steps`` as asked, before ``measure_s`` shortened it."""
        self.profile_steps = profile_steps
        """On CUDA with ``steps`` set: this many extra steps after the measured ones run under
        :class:`~fastloop.measure.gpu_busy.GpuProfile` (GPU busy fraction, host syncs per step);
        they never enter the step statistics or the losses."""
        self.gpu_profile: dict | None = None
        self._profiler = None
        self._measured_end: int | None = None
        self._measured_wall: float | None = None
        self._window_t0: float | None = None
        self._first_window_s: float | None = None
        self.steady_reached: bool | None = None
        """Whether the measured steps ran at a steady rate (:func:`~fastloop.measure.stats.half_ratio`
        within STEADY_TOLERANCE), after measuring on where they did not; None: not checked."""
        self.unsteady_ratio: float | None = None
        self.unsteady_steps = 0
        """Measured steps moved into the warm-up because the rate was still changing."""
        self.window_cut = False
        """The ``measure_s`` window ended on time (:data:`WINDOW_OVERRUN`), before its planned count."""
        self.window_extended = 0
        """Steps added to the window because its measured steps summed to less than ``measure_s``."""
        self.window_short_why: str | None = None
        """Why the window holds less than ``measure_s`` of measured steps (None: it holds them)."""
        self.manual = False
        self._item_counts: list = []  # items_per_batch() of each batch, where the module declares it
        self._flop_counts: list = []  # flops_per_batch() of each batch, likewise
        self._manual_loss: torch.Tensor | None = None
        self.steady = steady and warmup > 0
        """Extend the warm-up, one step at a time, until step times are steady (the last three
        warm-up steps' median within 10% of the three before), at most ``max_extra_warmup`` steps."""
        self.max_extra_warmup = max(10, warmup) if max_extra_warmup is None else max_extra_warmup
        self.warmup_extended = 0
        self.warmup_steady: bool | None = None
        self.warmup_gc_s: float | None = None
        """Seconds of the full garbage collection run where the warm-up ends (None: not reached)."""
        self._warm_ends: list[float] = []
        self.drain = drain
        self.drain_steps = 0
        """Warm-up steps added to drain the loader's prefetch buffer (0 without workers)."""
        self.count_flops = count_flops
        self.timer: StepTimer | None = None
        self.losses: list[torch.Tensor] = []
        self.items_per_step: int | None = None
        self.flops_per_step: float | None = None
        self.flops_convention: str | None = None
        self.peak_mem_bytes: int | None = None
        self._flop_mode = None
        self._t0 = 0.0
        """The host's clock when training started (``on_train_start``)."""
        self.train_end_t: float | None = None
        """The host's clock when training ended (``on_train_end``)."""
        self.wall_s = 0.0
        self._pending_fetch = False
        self._clock: FeedClock | None = None
        self.shapes = ShapeTally()
        """The batch shapes of every step (a CUDA graph replays one)."""

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if trainer.world_size > 1:
            # every rank must train the same number of steps (a rank that stops early leaves the
            # others waiting in a collective), and extending the warm-up until steady is decided
            # from each rank's own timings: the warm-up stays fixed in multi-rank runs
            self.steady = False
        if self.drain and not self.drain_steps:
            self.drain_steps = 2 * prefetch_buffer(trainer.train_dataloader)
            limited = trainer.fit_loop.epoch_loop.max_steps > 0
            if self.drain_steps and (limited or self.steps is not None):
                self.warmup += self.drain_steps
                if limited:
                    trainer.fit_loop.epoch_loop.max_steps += self.drain_steps
        self.manual = not pl_module.automatic_optimization
        self.timer = StepTimer(trainer.strategy.root_device, warmup=self.warmup)
        self._clock = trainer.profiler if isinstance(trainer.profiler, FeedClock) else None
        if self._clock is not None:
            self._clock.take()  # what setup fetched (the first batch before training) is not a step's
        if self.timer.cuda:
            torch.cuda.reset_peak_memory_stats(self.timer.device)
        self._t0 = time.perf_counter()

    def on_train_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self.timer is not None and not self._pending_fetch:
            self.timer.fetch_start()
            self._pending_fetch = True

    def on_train_batch_start(self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int) -> None:
        assert self.timer is not None
        if self._clock is not None:
            self.timer.fetch_end(self._clock.take(), self._clock.last_copy)
        else:
            self.timer.fetch_end()
        self._pending_fetch = False
        self.shapes.add(batch)
        items = getattr(pl_module, "items_per_batch", None)
        if callable(items):  # counted every batch (text: real tokens vary), read once at the end
            count = items(batch)
            self._item_counts.append(count.detach() if torch.is_tensor(count) else int(count))
        fpb = getattr(pl_module, "flops_per_batch", None)
        if callable(fpb):  # per batch too: padded to a few buckets, a batch's FLOPs vary
            flops = fpb(batch)
            self._flop_counts.append(flops.detach() if torch.is_tensor(flops) else float(flops))
        if self.items_per_step is None:
            self.items_per_step = int(self._item_counts[0]) if callable(items) else batch_items(batch, trainer)
            if callable(fpb):
                self.flops_per_step = float(self._flop_counts[0])
                self.flops_convention = getattr(pl_module, "flops_convention", "flops_per_batch() of the module")
            elif self.count_flops and not is_compiled(pl_module):
                from torch.utils.flop_counter import FlopCounterMode

                self.flops_convention = (
                    "torch.utils.flop_counter, forward+backward of the first step (matmul/conv, 2 per MAC)"
                )
                self._flop_mode = FlopCounterMode(display=False)
                self._flop_mode.__enter__()

    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        assert self.timer is not None
        if self._flop_mode is not None:
            self._flop_mode.__exit__(None, None, None)
            self.flops_per_step = float(self._flop_mode.get_total_flops()) or None
            self._flop_mode = None
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        if self.manual:  # what the step passed to manual_backward (summed); None if nothing
            loss, self._manual_loss = self._manual_loss, None
        if torch.is_tensor(loss):
            self.losses.append(loss.detach().float().reshape(()))
        else:
            self.losses.append(None)
        self.timer.step_end()
        if self.steady and self.timer.recorded_steps <= self.warmup:
            self._extend_warmup_until_steady(trainer)
        if self.warmup_gc_s is None and self.timer.recorded_steps >= self.warmup:
            self.warmup_gc_s = collect_garbage()
            self.timer.resume()  # the collection is the warm-up's, not the first measured step's
            self._window_t0 = time.perf_counter()
        if self.steps is not None:
            self._maybe_stop(trainer)
        self.timer.fetch_start()
        self._pending_fetch = True

    def _maybe_stop(self, trainer: Trainer) -> None:
        assert self.timer is not None
        n = self.timer.recorded_steps
        if self._measured_end is None:
            if self._overran(trainer, n):
                self.steps, self.window_cut = n - self.warmup, True
            if (
                n < self.warmup + (self.steps or 0)
                or self._measure_on_until_steady(trainer, n)
                or self._window_short(trainer, n)
            ):
                return
            self._measured_end = n
            if self.profile_steps > 0 and self.timer.cuda and trainer.world_size == 1:
                from fastloop.measure.gpu_busy import GpuProfile

                self._profiler = GpuProfile()
                self._profiler.start()  # synchronizes first: the run's wall time ends here
                self._measured_wall = time.perf_counter() - self._t0
                return
            trainer.should_stop = True
        elif self._profiler is not None and n - self._measured_end >= self.profile_steps:
            self.gpu_profile = self._profiler.stop(n - self._measured_end)
            self._profiler = None
            trainer.should_stop = True

    def on_before_backward(self, trainer: Trainer, pl_module: LightningModule, loss: torch.Tensor) -> None:
        if self.manual:
            loss = loss.detach().float().reshape(())
            self._manual_loss = loss if self._manual_loss is None else self._manual_loss + loss

    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self._profiler is not None:  # the fit ended while profiling: what was profiled counts
            assert self.timer is not None and self._measured_end is not None
            done = self.timer.recorded_steps - self._measured_end
            self.gpu_profile = self._profiler.stop(done) if done else {"error": "no step ran under the profiler"}
            self._profiler = None
        if self.timer is not None and self.timer.cuda:
            torch.cuda.synchronize(self.timer.device)
            self.peak_mem_bytes = int(torch.cuda.max_memory_allocated(self.timer.device))
        self.wall_s = self._measured_wall if self._measured_wall is not None else time.perf_counter() - self._t0
        self.train_end_t = time.perf_counter()

    def _extend_warmup_until_steady(self, trainer: Trainer) -> None:
        """During warm-up only (a sync per step is fine there): one more warm-up step while the
        recent step times still drift (compile, autotuning, allocator growth, loader fill)."""
        assert self.timer is not None
        if self.timer.cuda:
            torch.cuda.synchronize(self.timer.device)
        self._warm_ends.append(time.perf_counter())
        if self.timer.recorded_steps < self.warmup:
            return
        durations = [b - a for a, b in zip(self._warm_ends, self._warm_ends[1:])]
        if len(durations) >= 6:
            first, last = sorted(durations[-6:-3])[1], sorted(durations[-3:])[1]
            if abs(last - first) <= 0.1 * min(first, last):
                self.warmup_steady = True
                self._fit_steps_to_time(last)
                return
        if self.warmup_extended >= self.max_extra_warmup:
            self.warmup_steady = False
            if durations:
                self._fit_steps_to_time(sorted(durations[-3:])[len(durations[-3:]) // 2])
            return
        self.warmup += 1
        self.warmup_extended += 1
        self.timer.warmup += 1
        if trainer.fit_loop.epoch_loop.max_steps > 0:
            trainer.fit_loop.epoch_loop.max_steps += 1

    def _measure_on_until_steady(self, trainer: Trainer, n: int) -> bool:
        """The window is over: when its second half ran clearly slower or faster than its first (a
        loader's buffer draining, clocks ramping), its steps before the change (at least a quarter
        of them) become warm-up and the window measures on, until the rate is steady or the window
        has run WINDOW_OVERRUN times its first length (then the run is marked not steady). One
        synchronize per check, at the window's end; one process only (ranks must stop at the same
        step)."""
        if not self.steady or self._window_t0 is None or trainer.world_size != 1:
            return False
        step_s = self.timer.result(upto=n).step_s
        ratio = half_ratio(step_s)
        if ratio is None:
            return False
        elapsed = time.perf_counter() - self._window_t0
        if self._first_window_s is None:
            self._first_window_s = elapsed
        if is_steady(ratio):
            self.steady_reached = True
            return False
        if elapsed > WINDOW_OVERRUN * max(self.measure_s or 0.0, self._first_window_s):
            self.steady_reached, self.unsteady_ratio = False, ratio
            return False
        moved = max(change_point(step_s), len(step_s) // 4)  # the steps before the rate changed
        self.warmup += moved
        self.timer.warmup += moved
        self.unsteady_steps += moved
        if trainer.fit_loop.epoch_loop.max_steps > 0:
            trainer.fit_loop.epoch_loop.max_steps += moved
        return True

    def _window_short(self, trainer: Trainer, n: int) -> bool:
        """The planned count is done but its steps' times sum to less than ``measure_s``: measure
        on for the seconds missing (estimated from the window's mean step) until it holds them, or
        a cap ends it (:data:`MAX_MEASURED_STEPS`, or :data:`WINDOW_OVERRUN` x ``measure_s`` on the
        host's clock), said in ``window_short_why``. One process only."""
        if self.measure_s is None or self.steps is None or trainer.world_size != 1 or self.window_cut:
            return False
        step_s = self.timer.result(upto=n).step_s
        measured = sum(step_s)
        self.window_short_why = None
        if measured >= self.measure_s or not step_s:
            return False
        if self.steps >= MAX_MEASURED_STEPS:
            self.window_short_why = f"the window stopped at the cap of {MAX_MEASURED_STEPS:,} measured steps"
            return False
        if self._window_t0 is not None and time.perf_counter() - self._window_t0 > WINDOW_OVERRUN * self.measure_s:
            self.window_short_why = (
                f"the window ended on the host's clock after {WINDOW_OVERRUN:g}x "
                f"{self.measure_s:g} s (the steps' own times sum to less)"
            )
            return False
        extra = min(
            MAX_MEASURED_STEPS - self.steps, math.ceil(1.05 * (self.measure_s - measured) * len(step_s) / measured) + 1
        )
        self.steps += extra
        self.window_extended += extra
        if trainer.fit_loop.epoch_loop.max_steps > 0:
            trainer.fit_loop.epoch_loop.max_steps += extra
        return True

    def _overran(self, trainer: Trainer, n: int) -> bool:
        """The time window has run :data:`WINDOW_OVERRUN` times longer than ``measure_s`` (one
        process only: ranks that stopped on their own clocks would stop at different steps)."""
        return (
            self.measure_s is not None
            and self._window_t0 is not None
            and trainer.world_size == 1
            and self._first_window_s is None
            and n - self.warmup >= MIN_MEASURED_STEPS
            and time.perf_counter() - self._window_t0 > WINDOW_OVERRUN * self.measure_s
        )

    def _fit_steps_to_time(self, step_s: float) -> None:
        """At the end of the warm-up: a window of ``measure_s`` seconds of measured steps, however
        short or long the step (at least MIN_MEASURED_STEPS, at most MAX_MEASURED_STEPS)."""
        if self.measure_s is None or self.steps is None or step_s <= 0:
            return
        self.steps = min(MAX_MEASURED_STEPS, max(MIN_MEASURED_STEPS, math.ceil(self.measure_s / step_s)))

    def on_exception(self, trainer: Trainer, pl_module: LightningModule, exception: BaseException) -> None:
        if self._flop_mode is not None:  # the first step raised while FLOPs were being counted
            self._flop_mode.__exit__(None, None, None)
            self._flop_mode = None
        if self._profiler is not None:
            self._profiler.stop(1)
            self._profiler = None

    @property
    def train_start_t(self) -> float:
        """The host's clock when training started (``on_train_start``; 0 before)."""
        return self._t0

    @property
    def measured_steps(self) -> int:
        """Steps recorded after the warm-up (0 when the loader yielded nothing)."""
        if self.timer is None:
            return 0
        return max(0, (self._measured_end or self.timer.recorded_steps) - self.warmup)

    def _kept_losses(self) -> list[torch.Tensor | None]:
        """The losses of the warm-up and measured steps (not of the profiled ones)."""
        return self.losses[: self._measured_end] if self._measured_end is not None else self.losses

    @property
    def none_steps(self) -> int:
        """Batches whose training_step returned None (Lightning skipped their optimizer step)."""
        return sum(t is None for t in self._kept_losses())

    def result(self) -> StepStats:
        if self.timer is None or self.timer.recorded_steps == 0:
            raise RuntimeError("no training step was measured (did the loader yield any batch?)")
        stats = self.timer.result(upto=self._measured_end)
        stats.set_warmup_overhead(self.wall_s)
        return stats

    def _measured_mean(self, counts: list, first: float | None) -> float | None:
        counts = counts[self.warmup : self._measured_end] if counts else []
        return float(sum(float(c) for c in counts)) / len(counts) if counts else first

    def mean_items_per_step(self) -> float | None:
        """Items per measured step: the mean of the module's ``items_per_batch`` over the measured
        steps where it declares one (real tokens of padded text), else the first batch's count."""
        return self._measured_mean(self._item_counts, self.items_per_step)

    def mean_flops_per_step(self) -> float | None:
        """FLOPs per measured step: the mean of ``flops_per_batch`` likewise, else the first step's."""
        return self._measured_mean(self._flop_counts, self.flops_per_step)

    def loss_values(self) -> list[float | None]:
        """One entry per step: the loss, or None where training_step returned None (with manual
        optimization: the sum of the losses passed to ``manual_backward``)."""
        losses = self._kept_losses()
        present = [t for t in losses if t is not None]
        values = iter(torch.stack(present).cpu().tolist() if present else [])
        return [None if t is None else next(values) for t in losses]
