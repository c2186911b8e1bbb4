"""The feed: batches built off the step's critical path. :class:`BackgroundFeed` fetches and
collates the next batches on a background thread (the loader's own sampler, dataset and
``collate_fn``, unchanged), pins them and copies them to the device on a side stream, and hands
them to the step from a bounded queue. A step that waits for the GPU (a ``.item()``, Lightning's
``prog_bar`` values) then finds its next batch ready instead of building it while the GPU idles.

What it keeps (tests/test_feed.py):

- the order and the random state: ``iter(loader)`` and the epoch's first two batches are taken on
  the calling thread, each when the step asks for it (where the sampler draws its seed, and where
  worker processes are started and seeded), so the batches are the loader's own, in its order; a
  loader whose batches draw from the host's global generators in this process (a random transform
  in ``__getitem__`` with no worker processes: seen in the second batch) is not read ahead at all,
  since the step's draws and the loader's would interleave differently: its batches are fetched on
  the calling thread when the step asks, and :attr:`BackgroundFeed.why_not_threaded` says why;
- each rank's share: the loader is read through its own sampler (under Lightning's DDP or FSDP the
  callbacks give the feed the loader Lightning prepared, with this rank's ``DistributedSampler``,
  which Lightning could not add to the feed itself), and ``sampler`` is the loader's, so
  ``set_epoch`` reaches it;
- errors: an exception raised by the loader (a collate that fails) is raised in the step's
  thread with its own traceback (the user's line);
- the thread's end: at the end of each epoch, on an exception, on Ctrl-C, when the iteration is
  abandoned (``break``) and on :meth:`BackgroundFeed.close`; :func:`live_feed_threads` lists any
  still running.

While a feed thread runs, the interpreter's switch interval is lowered (:data:`SWITCH_INTERVAL_S`,
restored after), so that the step's thread gets the GIL back within a fraction of a millisecond
when the feed is in the middle of a collate.

Example (on a CPU nothing is copied; the batches come from the thread):
    >>> import torch
    >>> from torch.utils.data import DataLoader, TensorDataset
    >>> loader = DataLoader(TensorDataset(torch.arange(10.0)), batch_size=4)
    >>> [b[0].tolist() for b in BackgroundFeed(loader, "cpu")]
    [[0.0, 1.0, 2.0, 3.0], [4.0, 5.0, 6.0, 7.0], [8.0, 9.0]]
    >>> live_feed_threads()
    []
"""

from __future__ import annotations

import queue
import random
import sys
import threading
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np
import torch

from fastloop.data import map_tensors, to_device

__all__ = ["DEPTH", "SWITCH_INTERVAL_S", "BackgroundFeed", "host_rng_changed", "host_rng_snapshot", "live_feed_threads"]

DEPTH = 2
"""Batches the thread prepares ahead of the step (on the device, where there is one)."""
SWITCH_INTERVAL_S = 2e-4
"""The interpreter's switch interval while a feed thread runs (Python's default is 5 ms)."""
_POLL_S = 0.05
_END = object()
_LIVE: set[threading.Thread] = set()
_LOCK = threading.Lock()
_SAVED_INTERVAL: list[float] = []


def live_feed_threads() -> list[threading.Thread]:
    """The feed threads still running in this process."""
    with _LOCK:
        return [t for t in _LIVE if t.is_alive()]


def _started(thread: threading.Thread) -> None:
    with _LOCK:
        if not any(t.is_alive() for t in _LIVE):
            _SAVED_INTERVAL[:] = [sys.getswitchinterval()]
            sys.setswitchinterval(min(SWITCH_INTERVAL_S, _SAVED_INTERVAL[0]))
        _LIVE.add(thread)


def _ended(thread: threading.Thread) -> None:
    with _LOCK:
        _LIVE.discard(thread)
        if not any(t.is_alive() for t in _LIVE) and _SAVED_INTERVAL:
            sys.setswitchinterval(_SAVED_INTERVAL.pop())


class _Failed:
    def __init__(self, err: BaseException) -> None:
        self.err = err


def host_rng_snapshot() -> tuple:
    """The host's random states (torch's CPU generator, Python's ``random``, numpy's global
    generator), to tell afterwards whether some code drew on the host, whatever code drew."""
    return torch.get_rng_state(), random.getstate(), np.random.get_state()


def host_rng_changed(before: tuple) -> str | None:
    """Which host generator moved since ``before`` (:func:`host_rng_snapshot`), or None.

    Example:
        >>> snap = host_rng_snapshot()
        >>> print(host_rng_changed(snap))
        None
        >>> _ = torch.rand(())
        >>> host_rng_changed(snap)
        "torch's CPU generator"
    """
    torch_state, py_state, np_state = before
    moved = []
    if not torch.equal(torch_state, torch.get_rng_state()):
        moved.append("torch's CPU generator")
    if py_state != random.getstate():
        moved.append("Python's random")
    now = np.random.get_state()
    if not (np.array_equal(np_state[1], now[1]) and np_state[2:] == now[2:]):
        moved.append("numpy's global generator")
    return ", ".join(moved) or None


class BackgroundFeed:
    """Iterate ``loader`` with the next :data:`DEPTH` batches built on a background thread and,
    on CUDA, pinned and copied to ``device`` on a side stream (see the module's docstring).

    Args:
        loader: any iterable of batches (a DataLoader, with or without worker processes).
        device: where the step runs; on CUDA every tensor of a batch arrives there.
        depth: batches prepared ahead.
        threaded: False keeps every fetch on the calling thread (the copy still goes one step
            ahead on the side stream).
    """

    def __init__(
        self, loader: Iterable, device: torch.device | str = "cuda", *, depth: int = DEPTH, threaded: bool = True
    ) -> None:
        self.loader = loader
        self.device = torch.device(device)
        self.depth = depth
        self.threaded = threaded
        self.why_not_threaded: str | None = None if threaded else "asked for"
        """Why the batches are fetched on the calling thread (None: on the background thread)."""
        self._checked = False
        self._stops: list[threading.Event] = []

    def __len__(self) -> int:
        return len(self.loader)  # type: ignore[arg-type]

    def __getattr__(self, attr: str) -> Any:  # batch_size, dataset, sampler... of the loader
        if attr in ("loader", "__setstate__"):  # not set yet (unpickling): no recursion
            raise AttributeError(attr)
        return getattr(self.loader, attr)

    @property
    def mode(self) -> str:
        """How the batches come: from the background thread, or fetched on the calling thread."""
        return "background thread" if self.threaded and self.why_not_threaded is None else "calling thread"

    def close(self) -> None:
        """End every thread this feed started (an epoch abandoned at teardown or on an error)."""
        for stop in self._stops:
            stop.set()

    # -- moving a batch ---------------------------------------------------------------------------
    def _ready(self, host: Any, stream: Any) -> tuple[Any, Any]:
        """``host`` on the device, its copy queued on ``stream`` (pinned first), and the event the
        step's stream waits for; on a CPU, the batch as it is."""
        if stream is None:
            return host, None
        with torch.cuda.device(self.device), torch.cuda.stream(stream):
            pinned = map_tensors(lambda t: t if t.device.type != "cpu" or t.is_pinned() else t.pin_memory(), host)
            moved = to_device(pinned, self.device, non_blocking=True)
            event = torch.cuda.Event()
            event.record(stream)
        return moved, event

    def _hand_out(self, item: tuple[Any, Any]) -> Any:
        batch, event = item
        if event is None:
            return batch
        current = torch.cuda.current_stream(self.device)
        current.wait_event(event)
        # the allocator must not reuse these blocks while the step's stream still reads them
        return map_tensors(lambda t: (t.record_stream(current), t)[1] if t.device.type == "cuda" else t, batch)

    # -- iterating --------------------------------------------------------------------------------
    def __iter__(self) -> Iterator[Any]:
        stream = torch.cuda.Stream(device=self.device) if self.device.type == "cuda" else None
        it = iter(self.loader)  # here: the sampler's seed, the workers' start and seeds, as without the feed
        for k in range(2):  # the epoch's first two batches here, each when the loader alone would give it
            before = host_rng_snapshot() if k == 1 and not self._checked else None
            try:
                host = next(it)
            except StopIteration:
                return
            if before is not None:
                self._checked = True
                moved = host_rng_changed(before)
                if moved and self.threaded:
                    self.why_not_threaded = (
                        f"the loader's batches draw random numbers on the host in this process "
                        f"({moved}): on a thread its draws and the step's would interleave "
                        f"differently, so they are fetched here, when the step asks"
                    )
            yield self._hand_out(self._ready(host, stream))
        if self.why_not_threaded is None:
            yield from self._threaded(it, stream)
        else:
            for host in it:  # no fetch ahead: the loader's draws fall between the step's as without the feed
                yield self._hand_out(self._ready(host, stream))

    def _threaded(self, it: Iterator, stream: Any) -> Iterator[Any]:
        q: queue.Queue = queue.Queue(maxsize=self.depth)
        stop = threading.Event()
        self._stops.append(stop)

        def put(item: Any) -> bool:
            while not stop.is_set():
                try:
                    q.put(item, timeout=_POLL_S)
                    return True
                except queue.Full:
                    continue
            return False

        def work() -> None:
            try:
                while not stop.is_set():
                    try:
                        host = next(it)
                    except StopIteration:
                        put(_END)
                        return
                    if not put(self._ready(host, stream)):
                        return
            except BaseException as err:  # noqa: BLE001 - the loader's error, raised in the step's thread
                put(_Failed(err))
            finally:
                _ended(threading.current_thread())

        thread = threading.Thread(target=work, name="fastloop-feed", daemon=True)
        _started(thread)
        thread.start()
        try:
            while True:
                try:
                    item = q.get(timeout=_POLL_S)
                except queue.Empty:
                    if not thread.is_alive() and q.empty():
                        raise RuntimeError("the feed thread ended without a batch or an error") from None
                    continue
                if item is _END:
                    return
                if isinstance(item, _Failed):
                    raise item.err
                yield self._hand_out(item)
        finally:
            stop.set()
            while True:  # let a thread blocked on a full queue see the stop
                try:
                    q.get_nowait()
                except queue.Empty:
                    break
            thread.join(timeout=5)
            self._stops.remove(stop)
