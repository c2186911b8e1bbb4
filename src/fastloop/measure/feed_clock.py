"""The feed clock: a Lightning profiler that times only the host's work getting training batches
(the loader's ``next`` and the copy to the device), so the data wait a report prints is the
loader's and the copy's, not Lightning's own bookkeeping between the hooks."""

from __future__ import annotations

import contextlib
import time
from typing import Any

from fastloop._compat import PassThroughProfiler

__all__ = ["FEED_ACTIONS", "FeedClock"]

FEED_ACTIONS = (".train_dataloader_next", ".batch_to_device")
"""The ends of the profiler actions Lightning wraps around getting a training batch: the
epoch loop's ``next`` on the loader and the strategy's ``batch_to_device`` (which runs the
module's transfer hooks)."""


_UNTIMED = contextlib.nullcontext()
"""The context every action but the feed's gets: one shared object, nothing to enter."""


class _Timed:
    """A feed action's context (``start`` on enter, ``stop`` on exit)."""

    __slots__ = ("clock", "name")

    def __init__(self, clock: FeedClock, name: str) -> None:
        self.clock, self.name = clock, name

    def __enter__(self) -> None:
        self.clock.start(self.name)

    def __exit__(self, *exc: object) -> None:
        self.clock.stop(self.name)


class FeedClock(PassThroughProfiler):
    """A Lightning profiler that times only the host's work getting training batches.

    Lightning calls ``profiler.start``/``stop`` around the loader's ``next`` and the batch's
    move to the device; this profiler adds up those two on the host's clock until
    :meth:`take` collects them, and ignores every other action (so it costs next to nothing).
    ``Trainer(profiler=FeedClock())`` lets :class:`MeasureCallback` tell the loader's time from
    Lightning's own work between steps.

    Lightning wraps every hook it calls in ``profiler.profile(name)`` (about 130 a step with
    seven callbacks); Lightning's own profilers, its default pass-through one included, answer
    with a fresh generator-based context each time. This one hands back one shared no-op context
    for every action but the feed's, so the measuring Trainer's host does less per step than a
    default one, not more (it matters where the step is host-bound, as a CUDA-graphed small model).

    Example:
        >>> clock = FeedClock()
        >>> fetch, hook = "[_TrainingEpochLoop].train_dataloader_next", "[LightningModule]M.on_train_batch_start"
        >>> clock.start(fetch); clock.stop(fetch)
        >>> clock.start(hook); clock.stop(hook)
        >>> 0.0 <= clock.take() < 0.1, clock.take()
        (True, 0.0)
        >>> with clock.profile("[Strategy]SingleDeviceStrategy.batch_to_device"):
        ...     time.sleep(0.01)
        >>> with clock.profile("[Callback]C.on_train_batch_end"):
        ...     time.sleep(0.01)
        >>> 0.01 <= clock.take() < 0.019, clock.last_copy >= 0.01
        (True, True)
    """

    def __init__(self) -> None:
        super().__init__()
        self._started: dict[str, float] = {}
        self._pending = 0.0
        self._copy = 0.0
        self.last_copy = 0.0
        """Of what the last :meth:`take` returned, the copy to the device's part (``batch_to_device``)."""

    def profile(self, action_name: str) -> Any:  # type: ignore[override]
        return _Timed(self, action_name) if action_name.endswith(FEED_ACTIONS) else _UNTIMED

    def start(self, action_name: str) -> None:
        if action_name.endswith(FEED_ACTIONS):
            self._started[action_name] = time.perf_counter()

    def stop(self, action_name: str) -> None:
        t = self._started.pop(action_name, None)
        if t is not None:
            dt = time.perf_counter() - t
            self._pending += dt
            if action_name.endswith(FEED_ACTIONS[1]):
                self._copy += dt

    def take(self) -> float:
        """The seconds spent getting batches since the last call (:attr:`last_copy`: the copy's part)."""
        out, self._pending = self._pending, 0.0
        self.last_copy, self._copy = self._copy, 0.0
        return out
