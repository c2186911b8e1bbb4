"""What a run records of its speedups and what it lets them see: :class:`Record`, the
:class:`Skip` and :class:`Fallback` a speedup raises, :class:`RunInputs` and :class:`Context`.
Below :mod:`fastloop.speedups.base` and :mod:`fastloop.speedups.run`, which both use them
(re-exported from ``base``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

import torch

__all__ = ["Context", "Fallback", "Record", "RunInputs", "Skip", "Status", "valid_step_rate"]

Status = Literal["applied", "skipped", "fallback"]


@dataclass
class Record:
    """What happened to one requested speedup (the JSON contract's ``speedups`` entries)."""

    name: str
    status: Status
    reason: str = ""
    detail: str = ""
    """For an applied speedup: what it changed (the modules compiled, the loader rebuilt, ...)."""

    def to_dict(self) -> dict:
        return {"name": self.name, "status": self.status, "reason": self.reason, "detail": self.detail}


class Skip(Exception):
    """Raised by a speedup's ``apply`` (or a function it gave the run) when it cannot apply here:
    :func:`~fastloop.speedups.run.apply_all` records it as :attr:`status` with the reason, puts
    back what the speedup changed, and goes on (records are results, never control flow)."""

    status: ClassVar[Status] = "skipped"

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class Fallback(Skip):
    """A :class:`Skip` for a speedup that applies in general but met what it cannot handle."""

    status: ClassVar[Status] = "fallback"


@dataclass
class RunInputs:
    """What the driver declares to every speedup of one run (one object, shared by them all)."""

    step_rate: float | None = None
    """Steps/s the step runs at when it never waits for data, when a driver measured it (the
    ladder and the A/B tell a feed candidate its base's rate): ``workers`` weighs its loader by it."""
    compile_cache: bool = True
    """Compiles read and write the project's compile cache (:mod:`fastloop.speedups.compile.cache`);
    False (``--no-cache``): a cold compile in a fresh directory, the cache left as it was."""
    batches_on_device: str | None = None
    """The speedup serving this run's batches on the device (``gpu_resident``), set when it
    applies: the CPU feed (workers, pinned memory, prefetch) then has nothing to do."""


def valid_step_rate(rate: object) -> bool:
    """A step rate a run can be told: a number of steps per second, finite and > 0."""
    return isinstance(rate, (int, float)) and not isinstance(rate, bool) and 0 < rate < float("inf")


@dataclass
class Context:
    """What a speedup may look at to decide whether it applies, and where it reports."""

    device: torch.device
    inputs: RunInputs = field(default_factory=RunInputs)
    """What the driver declared for this run (shared by all of its speedups)."""
    records: dict[str, Record] = field(default_factory=dict)
    """One record per requested speedup, filled as they are applied."""
    stats: dict[str, Any] = field(default_factory=dict)
    """Counters speedups report (fp16 skipped steps, recompilations, ...)."""
    _details: dict[str, str] = field(default_factory=dict)
    """What a speedup said it changed before its record was written (see :meth:`describe`)."""
    ddp_kwargs: dict | None = None
    """In a multi-rank DDP run under Lightning: the keyword arguments its strategy will give
    ``DistributedDataParallel`` (a speedup may edit them before the model is wrapped); None
    otherwise."""
    undo: list = field(default_factory=list)
    """Functions that put the user's objects back (a swapped layer, a set attribute); the
    Lightning adapter calls them, newest first, when the fit is torn down."""

    @property
    def cuda(self) -> bool:
        return self.device.type == "cuda"

    def record(self, name: str, status: Status, reason: str = "", detail: str = "") -> None:
        if status == "applied" and not detail:
            detail = self._details.get(name, "")
        self.records[name] = Record(name, status, reason, detail)

    def describe(self, name: str, detail: str) -> None:
        """Say what an applied speedup changed: lands in its record's ``detail`` (now, or when the
        record is written)."""
        self._details[name] = detail
        rec = self.records.get(name)
        if rec is not None and rec.status == "applied":
            rec.detail = detail

    def applied(self, name: str) -> bool:
        rec = self.records.get(name)
        return rec is not None and rec.status == "applied"
