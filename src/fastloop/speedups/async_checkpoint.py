"""``async_checkpoint``: checkpoints written on a background thread, from a snapshot taken at once.

A synchronous save blocks training for the whole of it: the state copied to the host, pickled and
written. Here the training thread only takes a snapshot (every tensor copied, on the GPU into
pinned host memory without waiting for the copy, on the CPU by ``memcpy``), and a writer thread
pickles and writes that snapshot while training goes on. The file is the one a synchronous
``torch.save`` of the same step writes, byte for byte: the same pickled structure, the same storages
shared the same way, each storage tagged with its original device (a pinned copy of a ``cuda:0``
tensor is saved as ``cuda:0``, through ``torch.serialization.register_package``).

The rules, for both adapters: at most one save in flight (a second save waits for the first, it is
never skipped); every file is written under a temporary name beside it and renamed when complete, so
a reader sees the previous checkpoint or the new one, never half of one; a deletion or a load of a
file still being written waits for it; closing after Ctrl-C abandons the write and removes its
temporary file, closing otherwise waits for it. What the snapshot cannot copy faithfully (a tensor
subclass, a sparse tensor, an object that cannot be deep-copied) is written at once, as a
synchronous save, and the record says why.

The card (when it helps, when it hurts, what it costs): ``docs/speedups/async_checkpoint.md``.

Example:
    >>> import os, tempfile, torch
    >>> model = torch.nn.Linear(4, 2)
    >>> writer = CheckpointWriter()
    >>> path = os.path.join(tempfile.mkdtemp(), "last.ckpt")
    >>> writer.save({"state_dict": model.state_dict()}, path)
    >>> with torch.no_grad():
    ...     _ = model.weight.add_(1.0)  # training goes on while the file is written: the snapshot is unchanged
    >>> writer.close()
    >>> saved = torch.load(path)["state_dict"]["weight"]
    >>> torch.equal(saved + 1.0, model.weight.detach()), sorted(os.listdir(os.path.dirname(path)))
    (True, ['last.ckpt'])
"""

from __future__ import annotations

import copy
import os
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from fastloop.speedups.base import Speedup, register
from fastloop.speedups.options import Options, option
from fastloop.speedups.run import Run

__all__ = [
    "STATS_KEY",
    "AsyncCheckpoint",
    "AsyncCheckpointOptions",
    "CheckpointWriter",
    "closing_after_interrupt",
    "partial_path",
    "snapshot",
    "write_checkpoint",
]

STATS_KEY = "async_checkpoint"
"""Where a run's statistics hold the saves: per save the seconds training was blocked, of which
waiting for the previous write, the seconds the write took in the background and the bytes."""

CHUNK_BYTES = 64 << 20
"""The writer checks, between pieces of this size, whether the write was abandoned (Ctrl-C): a
large storage is one record of torch.save's file, written in one call otherwise."""

PARTIAL = ".partial-"


def partial_path(path: str) -> str:
    """Where ``path`` is written before it is renamed into place (the process id keeps two
    processes saving the same path apart).

    Example:
        >>> partial_path("/ckpt/last.ckpt").startswith("/ckpt/last.ckpt.partial-")
        True
    """
    return f"{path}{PARTIAL}{os.getpid()}"


class Abandoned(Exception):
    """The write was abandoned (closing after Ctrl-C): its temporary file is removed."""


class _ChunkedFile:
    """The file object torch.save writes into: each write in pieces of :data:`CHUNK_BYTES`, and
    before each piece a look at whether the write was abandoned. torch.save given a file object
    (not a path) names its archive ``archive/``, as Lightning's save into memory does; given a
    path it would name the archive after the temporary file, and the bytes would differ."""

    def __init__(self, file: Any, abandon: threading.Event | None) -> None:
        self.file, self.abandon = file, abandon

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        for start in range(0, len(view), CHUNK_BYTES):
            if self.abandon is not None and self.abandon.is_set():
                raise Abandoned("the checkpoint write was abandoned")
            self.file.write(view[start : start + CHUNK_BYTES])
        return len(view)

    def flush(self) -> None:
        self.file.flush()


def write_checkpoint(
    checkpoint: Any, path: str | os.PathLike, *, fsync: bool = True, abandon: threading.Event | None = None
) -> int:
    """``torch.save(checkpoint)`` to ``path`` as a whole or not at all: written under
    :func:`partial_path`, flushed to the disk (``fsync``), then renamed over ``path``; on any error
    (or ``abandon`` set) the temporary file is removed and ``path`` is left as it was. Returns the
    bytes written.

    Example:
        >>> import os, tempfile, torch
        >>> path = os.path.join(tempfile.mkdtemp(), "w.pt")
        >>> write_checkpoint({"w": torch.ones(2)}, path) > 0, os.listdir(os.path.dirname(path))
        (True, ['w.pt'])
    """
    path = os.fspath(path)
    tmp = partial_path(path)
    try:
        with open(tmp, "wb") as f:
            torch.save(checkpoint, _ChunkedFile(f, abandon))
            f.flush()
            if fsync:
                os.fsync(f.fileno())
            size = f.tell()
        os.replace(tmp, path)
    except BaseException:
        try:
            os.remove(tmp)
        except OSError:
            pass
        raise
    return size


# -- the snapshot -------------------------------------------------------------------------------

_HOST_COPIES: dict[int, str] = {}
"""data_ptr of a pinned host copy -> the location its original was saved with (``cuda:0``)."""
_TAGGER_LOCK = threading.Lock()
_TAGGER: list = []
"""Holds the tagger once it is registered (torch keeps a registered one for the process's life)."""


def _tag_host_copy(storage: Any) -> str | None:
    """torch.save's location of a storage (``register_package``'s tagger): a pinned copy that a
    snapshot made of a GPU storage keeps its original's location; anything else is not ours."""
    if not _HOST_COPIES or storage.device.type != "cpu":
        return None
    return _HOST_COPIES.get(storage.data_ptr())


def _never_loads(storage: Any, location: str) -> None:
    """The deserializer paired with :func:`_tag_host_copy`: loading is left to torch's own."""
    return None


def _register_tagger() -> None:
    with _TAGGER_LOCK:
        if not _TAGGER:
            # priority 9: consulted before torch's CPU tagger (10); unique, so the registry's sort
            # never compares the functions
            torch.serialization.register_package(9, _tag_host_copy, _never_loads)
            _TAGGER.append(_tag_host_copy)


class Unsnappable(Exception):
    """What a snapshot cannot copy faithfully (the save is then written at once)."""


_IMMUTABLE = (type(None), bool, int, float, complex, str, bytes, torch.dtype, torch.device, torch.Size, range, type)


class _Snapshot:
    """One checkpoint's copy: its tensors copied now (their storages once each, shared as before),
    its containers rebuilt, other objects deep-copied."""

    def __init__(self) -> None:
        self.memo: dict[int, Any] = {}
        self.storages: dict[tuple, torch.UntypedStorage] = {}
        self.devices: set[torch.device] = set()
        self.host_ptrs: list[int] = []
        self.events: list[Any] = []

    def take(self, obj: Any) -> Any:
        out = self.walk(obj)
        for device in self.devices:  # the writer waits for the copies; training goes on behind them
            event = torch.cuda.Event()
            event.record(torch.cuda.current_stream(device))
            self.events.append(event)
        return out

    def walk(self, x: Any) -> Any:
        if isinstance(x, _IMMUTABLE):
            return x
        if id(x) in self.memo:
            return self.memo[id(x)]
        if isinstance(x, torch.Tensor):
            out: Any = self.tensor(x)
        elif isinstance(x, dict):
            out = {} if type(x) is dict else copy.copy(x)  # a subclass keeps its type and attributes
            self.memo[id(x)] = out
            for k, v in x.items():
                out[k] = self.walk(v)
            if type(x) is not dict and hasattr(x, "__dict__"):
                for k, v in vars(x).items():  # an OrderedDict state_dict's _metadata
                    vars(out)[k] = self.walk(v)
        elif type(x) is list:
            out = []
            self.memo[id(x)] = out
            out.extend(self.walk(v) for v in x)
        elif type(x) is tuple or (isinstance(x, tuple) and hasattr(type(x), "_fields")):
            items = [self.walk(v) for v in x]
            same = all(a is b for a, b in zip(items, x))
            out = x if same else (tuple(items) if type(x) is tuple else type(x)(*items))
        else:
            try:
                out = copy.deepcopy(x, self.memo)
            except Exception as err:  # noqa: BLE001 - any object: the save is then written at once
                raise Unsnappable(f"a {type(x).__name__} that cannot be copied ({type(err).__name__}: {err})") from err
        self.memo[id(x)] = out
        return out

    def tensor(self, t: torch.Tensor) -> torch.Tensor:
        if type(t) not in (torch.Tensor, torch.nn.Parameter):
            raise Unsnappable(f"a {type(t).__name__} (a tensor subclass)")
        if t.layout != torch.strided or t.is_quantized or t.is_nested:
            raise Unsnappable(f"a {t.layout} tensor" if t.layout != torch.strided else "a quantized or nested tensor")
        if t.is_conj() or t.is_neg():
            raise Unsnappable("a tensor with a lazy conjugate or negation")
        if t.device.type == "meta":
            return t  # no data to copy
        if t.device.type not in ("cpu", "cuda"):
            raise Unsnappable(f"a tensor on {t.device}")
        storage = t.untyped_storage()
        if storage.nbytes() == 0:
            return t  # no data to change under the writer
        key = (t.device, storage.data_ptr(), storage.nbytes())
        copied = self.storages.get(key)
        if copied is None:
            copied = self.storages[key] = self.copy_storage(storage, t.device)
        out = torch.empty(0, dtype=t.dtype).set_(copied, t.storage_offset(), t.size(), t.stride())
        if isinstance(t, torch.nn.Parameter):
            out = torch.nn.Parameter(out, requires_grad=t.requires_grad)
        elif t.requires_grad:
            out.requires_grad_(True)
        for k, v in vars(t).items():  # attributes set on the tensor are pickled with it
            setattr(out, k, self.walk(v))
        return out

    def copy_storage(self, storage: torch.UntypedStorage, device: torch.device) -> torch.UntypedStorage:
        source = torch.empty(0, dtype=torch.uint8, device=device).set_(storage)
        if device.type != "cuda":
            return source.clone().untyped_storage()
        host = torch.empty(storage.nbytes(), dtype=torch.uint8, pin_memory=True)
        host.copy_(source, non_blocking=True)  # queued on the step's stream: the next step's updates come after
        copied = host.untyped_storage()
        _register_tagger()
        _HOST_COPIES[copied.data_ptr()] = torch.serialization.location_tag(storage)
        self.host_ptrs.append(copied.data_ptr())
        self.devices.add(device)
        return copied

    def release(self) -> None:
        """After the write: the pinned copies are no longer ours to tag."""
        for ptr in self.host_ptrs:
            _HOST_COPIES.pop(ptr, None)
        self.host_ptrs.clear()


def snapshot(checkpoint: Any) -> tuple[Any, Callable[[], None], Callable[[], None]]:
    """A copy of ``checkpoint`` that training can no longer change, taken now: returns the copy, a
    function the writer calls before reading it (it waits for the GPU's copies) and one it calls
    after writing it. Raises :class:`Unsnappable` with what it cannot copy faithfully.

    Example:
        >>> import torch
        >>> w = torch.zeros(3)
        >>> copied, ready, done = snapshot({"w": w, "view": w[1:]})
        >>> w.add_(1.0) is w, ready(), copied["w"].tolist(), copied["view"].untyped_storage().data_ptr() == (
        ...     copied["w"].untyped_storage().data_ptr())
        (True, None, [0.0, 0.0, 0.0], True)
    """
    snap = _Snapshot()
    try:
        copied = snap.take(checkpoint)
    except BaseException:
        snap.release()
        raise

    def ready() -> None:
        for event in snap.events:
            event.synchronize()

    return copied, ready, snap.release


# -- the writer ---------------------------------------------------------------------------------


@dataclass
class _Job:
    path: str
    index: int
    thread: threading.Thread | None = None
    error: BaseException | None = None


def closing_after_interrupt() -> bool:
    """Whether the code that closes a writer runs while a Ctrl-C unwinds (Lightning closes its
    checkpoint IO inside its ``except KeyboardInterrupt``): the write is then abandoned, not waited
    for."""
    return isinstance(sys.exc_info()[1], KeyboardInterrupt)


class CheckpointWriter:
    """Writes checkpoints as ``torch.save`` does, one at a time, each from a snapshot taken when
    :meth:`save` is called, on a background thread (``background=False``: in the caller, the same
    file). A save while one is in flight waits for it; :meth:`wait` waits for the write of a path
    (before it is loaded or deleted); :meth:`close` waits for the last one (``abandon=True``:
    abandons it and removes its temporary file). An error of a background write is raised by the
    next call. The writer stays usable after :meth:`close`.

    Args:
        background: write on a thread (else at once, in the caller).
        fsync: flush each file to the disk before it is renamed into place.
        stats: the run's statistics, where :data:`STATS_KEY` records every save.
    """

    def __init__(self, *, background: bool = True, fsync: bool = True, stats: dict | None = None) -> None:
        self.background, self.fsync = background, fsync
        self.stats = stats if stats is not None else {}
        self.record: dict = self.stats.setdefault(
            STATS_KEY,
            {"saves": 0, "blocked_s": [], "waited_s": [], "write_s": [], "bytes": [], "at_once": 0, "why_at_once": ""},
        )
        self._job: _Job | None = None
        self._abandon = threading.Event()

    def _note(self, blocked_s: float, waited_s: float, write_s: float | None, size: int | None, why: str) -> int:
        rec = self.record
        rec["saves"] += 1
        for key, value in (("blocked_s", blocked_s), ("waited_s", waited_s), ("write_s", write_s), ("bytes", size)):
            rec[key].append(value)
        if why:
            rec["at_once"] += 1
            rec["why_at_once"] = rec["why_at_once"] or why
        return rec["saves"] - 1

    def save(self, checkpoint: Any, path: str | os.PathLike) -> None:
        """Save ``checkpoint`` to ``path``: the previous write ends first, then the snapshot is
        taken and written in the background (at once where it cannot be taken: the record says why)."""
        t0 = time.perf_counter()
        self.wait()
        waited = time.perf_counter() - t0
        path = os.fspath(path)
        why = "" if self.background else "the writer writes in the caller (background=False)"
        if not why:
            try:
                copied, ready, release = snapshot(checkpoint)
            except Unsnappable as err:
                why = f"the checkpoint holds {err}"
        if why:
            t1 = time.perf_counter()
            size = write_checkpoint(checkpoint, path, fsync=self.fsync)
            now = time.perf_counter()
            self._note(now - t0, waited, now - t1, size, why)
            return
        index = self._note(0.0, waited, None, None, "")
        job = _Job(path, index)
        job.thread = threading.Thread(
            target=self._write, args=(job, copied, ready, release), name="fastloop-checkpoint-writer"
        )
        self._job = job
        job.thread.start()  # not a daemon: an interpreter that exits waits for the file to be whole
        self.record["blocked_s"][index] = time.perf_counter() - t0

    def save_at_once(self, save: Callable[[], None], why: str) -> None:
        """Run ``save`` (a synchronous save the writer cannot take over) after the write in flight,
        recorded as written at once, with ``why``."""
        t0 = time.perf_counter()
        self.wait()
        waited = time.perf_counter() - t0
        save()
        self._note(time.perf_counter() - t0, waited, time.perf_counter() - t0 - waited, None, why)

    def _write(self, job: _Job, copied: Any, ready: Callable[[], None], release: Callable[[], None]) -> None:
        t0 = time.perf_counter()
        try:
            ready()
            self.record["bytes"][job.index] = write_checkpoint(
                copied, job.path, fsync=self.fsync, abandon=self._abandon
            )
        except BaseException as err:  # noqa: BLE001 - handed to the training thread by wait()
            job.error = err
        finally:
            release()
            self.record["write_s"][job.index] = time.perf_counter() - t0

    def in_flight(self) -> str | None:
        """The path being written now, or None."""
        job = self._job
        return job.path if job is not None and job.thread is not None and job.thread.is_alive() else None

    def wait(self, path: str | os.PathLike | None = None) -> None:
        """Wait for the write in flight (only if it writes ``path``, when given); raise its error."""
        job = self._job
        if job is None:
            return
        if path is not None and os.path.abspath(os.fspath(path)) != os.path.abspath(job.path):
            return
        if job.thread is not None:
            job.thread.join()
        self._job = None
        if job.error is not None and not isinstance(job.error, Abandoned):
            raise job.error

    def close(self, *, abandon: bool = False) -> None:
        """Wait for the write in flight; ``abandon``: stop it instead (its temporary file is
        removed, the file it would have replaced stays as it was)."""
        if abandon:
            self._abandon.set()
        try:
            self.wait()
        finally:
            self._abandon.clear()


@dataclass(frozen=True, kw_only=True)
class AsyncCheckpointOptions(Options):
    """Options of ``async_checkpoint``."""

    speedup = "async_checkpoint"
    fsync: bool = option(
        True, "flush each file to the disk before renaming it into place (a power cut leaves the old or the new file)"
    )


@register
class AsyncCheckpoint(Speedup):
    __doc__ = __doc__
    name = "async_checkpoint"
    changes = "step"
    order = 80
    fit_phase = "checkpoint"
    options_type = AsyncCheckpointOptions
    advice_pattern = r"async[ _]checkpoint|checkpoint saves? block"

    def apply(self, run: Run) -> None:
        run.save_checkpoints_with(CheckpointWriter(fsync=self.opts.fsync, stats=run.ctx.stats))
