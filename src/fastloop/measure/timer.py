"""Step timing that does not perturb the thing it measures.

On CUDA every mark is a ``torch.cuda.Event`` recorded on the current stream; nothing
synchronizes until :meth:`StepTimer.result` reads all events once, late. The data wait of a
step is the gap between the "fetch started" and "fetch ended" events *on the GPU timeline*: if
the loader returns before the GPU drains its queue, both events complete back to back and the
wait is ~0 (the fetch was hidden); if the GPU ran dry, the gap is exactly the idle time.
On CPU the marks are ``time.perf_counter`` readings (the work is synchronous there).

Example:
    >>> import time
    >>> t = StepTimer("cpu", warmup=1)
    >>> for _ in range(4):
    ...     t.fetch_start(); t.fetch_end(); time.sleep(0.001); t.step_end()
    >>> r = t.result()
    >>> r.steps, r.warmup_steps
    (3, 1)
"""

from __future__ import annotations

import contextlib
import gc
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

from fastloop.measure.stats import summarize

__all__ = ["StepStats", "StepTimer", "collect_garbage", "one_off_step"]

_ONE_OFF: list[str] = []
"""What the step under way did once (set by :func:`one_off_step`, read by the next ``step_end``)."""


def one_off_step(why: str) -> None:
    """The step under way does one-off work, ``why`` (a CUDA graph captured for a batch shape first
    seen after warm-up): every :class:`StepTimer` leaves it out of its step statistics and counts
    it (``StepStats.one_off``)."""
    _ONE_OFF.append(why)


def collect_garbage() -> float:
    """A full garbage collection where the warm-up ends; returns its seconds.

    ``torch.compile`` leaves hundreds of thousands of objects behind, and Python's collector
    scans all of them in the next full collection it decides on: 0.7 s on a 2-core CPU after
    compiling a ResNet-18, 0.3-0.5 s in the H200's GPT-2 and CIFAR runs (1.4 s after fp8's
    compile). When that happens is up to the collector's thresholds; a measured window of a few
    hundred milliseconds that met it would read several times too slow. Collecting once here puts
    it in the warm-up, with compile, where every run pays it and none measures it (with
    :meth:`StepTimer.resume` after it); a long training run pays it once too.
    """
    t = time.perf_counter()
    gc.collect()
    return time.perf_counter() - t


@dataclass
class StepStats:
    """What a timed run measured (warm-up excluded, but counted)."""

    step_s: list[float]
    """Per-step wall time (fetch + compute) of each measured step, seconds."""
    wait_s: list[float]
    """Per-step time spent waiting for the batch, seconds."""
    warmup_steps: int
    """Steps run before measurement started (excluded from the statistics)."""
    compile_s: float | None = None
    """One-off compile / graph-capture time, reported on its own line."""
    host_wait_s: list[float] | None = None
    """Per-step host (wall-clock) time spent getting the batch; on CPU the same as ``wait_s``."""
    host_step_s: list[float] | None = None
    """Per-step host (wall-clock) time from the end of the previous step's issue to this one's."""
    host_copy_s: list[float] | None = None
    """Of ``host_wait_s``, the copy to the device's part (where it was timed apart)."""
    one_off: list[dict] | None = None
    """Steps after warm-up left out of the statistics for one-off work (:func:`one_off_step`):
    each with its index, its seconds and why."""

    @property
    def steps(self) -> int:
        return len(self.step_s)

    @property
    def data_wait_frac(self) -> float:
        total = sum(self.step_s)
        return float(min(1.0, sum(self.wait_s) / total)) if total > 0 else 0.0

    @property
    def host_wait_frac(self) -> float | None:
        """The share of the host's time per step spent getting batches (loader + copy to the
        device): with ``data_wait_frac``, the bound on what a faster feed could give back (a
        host-bound step is as slow as its host, a GPU-bound one as its GPU). None when not timed."""
        if self.host_wait_s is None or self.host_step_s is None:
            return None
        total = sum(self.host_step_s)
        return float(min(1.0, sum(self.host_wait_s) / total)) if total > 0 else 0.0

    def summary(self) -> dict:
        return summarize(self.step_s)

    def set_warmup_overhead(self, wall_s: float) -> None:
        """Set ``compile_s`` from the run's wall time: what the warm-up steps cost beyond
        ordinary steps (compile, graph capture, allocator and cuDNN warm-up)."""
        if self.warmup_steps and self.steps:
            med = sorted(self.step_s)[len(self.step_s) // 2]
            self.compile_s = max(0.0, wall_s - sum(self.step_s) - self.warmup_steps * med)


def _timed_apart(values: list[float | None]) -> list[float] | None:
    """``values`` when every step has one (the caller timed that part apart), else None."""
    if not values or any(v is None for v in values):
        return None
    return [float(v) for v in values]  # type: ignore[arg-type]


class StepTimer:
    """Times steps of any loop: call ``fetch_start``/``fetch_end`` around getting a batch and
    ``step_end`` after the step's work has been issued.

    Args:
        device: ``"cpu"``, ``"cuda"`` or a ``torch.device``.
        warmup: number of leading steps excluded from the statistics.
    """

    def __init__(self, device: str | torch.device = "cpu", warmup: int = 0) -> None:
        if warmup < 0:
            raise ValueError(f"warmup must be >= 0, got {warmup}")
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"
        self.warmup = warmup
        self._fetch_start: list = []
        self._fetch_end: list = []
        self._step_end: list = []
        self._host: tuple[list[float], list[float], list[float]] = ([], [], [])
        """On CUDA, the host's clock at each mark as well (fetch start, fetch end, step end)."""
        self._feed: list[float | None] = []
        """Per step, the host seconds spent inside the loader and the copy to the device, where
        the caller timed them apart (:class:`~fastloop.measure.callback.FeedClock`); else None."""
        self._copy: list[float | None] = []
        """Per step, the copy to the device's part of ``_feed`` (None where not timed apart)."""
        self._one_off: dict[int, str] = {}
        """Step index -> the one-off work it did (left out of the statistics)."""
        _ONE_OFF.clear()  # marks from before this timer (work outside any timed run) belong to no step of it
        self._resumed: dict[int, tuple[Any, float]] = {}
        """Step index -> (mark, host clock) where that step starts instead of at the previous
        step's end (see :meth:`resume`)."""

    def _stamp(self) -> tuple[Any, float]:
        """(a mark for :meth:`_elapsed`, the host's clock): a recorded CUDA event on CUDA."""
        host = time.perf_counter()
        if self.cuda:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            return ev, host
        return host, host

    def _mark(self, which: int):
        mark, host = self._stamp()
        if self.cuda:
            self._host[which].append(host)
        return mark

    def fetch_start(self) -> None:
        self._fetch_start.append(self._mark(0))

    def fetch_end(self, feed_s: float | None = None, copy_s: float | None = None) -> None:
        """``feed_s``: of the time since ``fetch_start``, the host seconds the loader and the copy
        to the device took (a framework's own work between steps excluded); None: all of it.
        ``copy_s``: of ``feed_s``, the copy to the device's part."""
        self._fetch_end.append(self._mark(1))
        self._feed.append(feed_s)
        self._copy.append(copy_s)

    def step_end(self) -> None:
        self._step_end.append(self._mark(2))
        if _ONE_OFF:
            self._one_off[len(self._step_end) - 1] = "; ".join(_ONE_OFF)
            _ONE_OFF.clear()

    def resume(self) -> None:
        """The next step starts now: what ran since the last ``step_end`` (the full garbage
        collection between the warm-up and the measured steps) belongs to no step."""
        self._resumed[len(self._step_end)] = self._stamp()

    @contextlib.contextmanager
    def fetching(self) -> Iterator[None]:
        self.fetch_start()
        yield
        self.fetch_end()

    def wrap(self, iterable) -> Iterator:
        """Iterate ``iterable`` with fetch marks around each ``next``; call ``step_end`` yourself."""
        it = iter(iterable)
        while True:
            self.fetch_start()
            try:
                item = next(it)
            except StopIteration:
                self._fetch_start.pop()
                if self.cuda:
                    self._host[0].pop()
                return
            self.fetch_end()  # nothing else runs between the marks: the whole gap is the loader's
            yield item

    def _elapsed(self, a, b) -> float:
        if self.cuda:
            return a.elapsed_time(b) / 1e3
        return b - a

    @property
    def recorded_steps(self) -> int:
        return len(self._step_end)

    def result(self, upto: int | None = None) -> StepStats:
        """Synchronize once and turn the marks into per-step times (of the first ``upto`` steps)."""
        n = len(self._step_end) if upto is None else min(upto, len(self._step_end))
        if len(self._fetch_start) < n or len(self._fetch_end) < n:
            raise RuntimeError("StepTimer: every step_end needs a fetch_start and fetch_end before it")
        if self.cuda and n:
            self._step_end[n - 1].synchronize()
        step_s, wait_s, host_step, host_wait = [], [], [], []
        one_off: list[dict] = []
        fs, fe, se = self._host
        feed, host_copy = _timed_apart(self._feed[self.warmup : n]), _timed_apart(self._copy[self.warmup : n])
        for k, i in enumerate(range(self.warmup, n)):
            # a step runs from the end of the previous step (when it starts asking for data)
            # to its own end; its first step starts at its own fetch.
            resumed = self._resumed.get(i)
            start = resumed[0] if resumed else self._step_end[i - 1] if i > 0 else self._fetch_start[i]
            if i in self._one_off:  # timed and reported, not a step of the steady rate
                one_off.append(
                    {"step": i, "s": round(self._elapsed(start, self._step_end[i]), 4), "why": self._one_off[i]}
                )
                continue
            step_s.append(self._elapsed(start, self._step_end[i]))
            wait_s.append(max(0.0, self._elapsed(self._fetch_start[i], self._fetch_end[i])))
            if self.cuda:
                host_step.append(se[i] - (resumed[1] if resumed else se[i - 1] if i > 0 else fs[i]))
                host_wait.append(max(0.0, fe[i] - fs[i]) if feed is None else feed[k])
            elif feed is not None:  # synchronous work: the loader's own time is the wait
                wait_s[-1] = min(wait_s[-1], feed[k])
        if not self.cuda:  # the work is synchronous: the host's clock is the only one
            host_step, host_wait = step_s, wait_s
        if one_off and host_copy is not None:  # the copies timed apart, of the steps kept
            host_copy = [host_copy[k] for k, i in enumerate(range(self.warmup, n)) if i not in self._one_off]
        return StepStats(
            step_s=step_s,
            wait_s=wait_s,
            warmup_steps=min(self.warmup, n),
            host_wait_s=host_wait,
            host_step_s=host_step,
            host_copy_s=host_copy,
            one_off=one_off or None,
        )
