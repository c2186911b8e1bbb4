"""A fit's result as typed dataclasses, serialized to the JSON contract's ``fit`` keys (DESIGN.md):
``wall_s`` (the outside clock), ``phases`` (seconds, summing to ``wall_s``), ``epochs``,
``outcome``, ``compiles`` and ``step_only`` (the step figures of the same configuration, from
the fit's own steady steps). Imports without torch.

The phases add up to the outside clock by construction: the fit's process charges every second
from its spawn to the end of its record to one phase (:mod:`fastloop.measure.fit_clock`), and
``other`` is the remainder (Lightning's teardown, writing the record, the interpreter's exit).
:data:`PHASE_TOLERANCE` bounds that remainder: a fit whose ``other`` is larger says so.

Example:
    >>> p = Phases.from_child({"startup": 2.0, "train": 7.0, "validation": 0.5}, wall_s=10.0)
    >>> round(p.other, 6), round(p.total(), 6), p.other_frac(10.0)
    (0.5, 10.0, 0.05)
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = ["PHASE_NAMES", "PHASE_TOLERANCE", "EpochRecord", "FitResult", "Outcome", "Phases", "StepOnly"]

PHASE_NAMES = ("startup", "compile", "train", "validation", "checkpoint", "epoch_edges", "host_syncs", "other")
PHASE_TOLERANCE = 0.05
"""The most of the outside clock a fit may leave to ``other`` (what no phase claims) before its
report warns that the phases do not account for its time."""


@dataclass
class Phases:
    """Seconds of the fit by phase (see docs/fit.md for what each counts)."""

    startup: float = 0.0
    compile: float = 0.0
    train: float = 0.0
    validation: float = 0.0
    checkpoint: float = 0.0
    epoch_edges: float = 0.0
    host_syncs: float = 0.0
    other: float = 0.0

    @classmethod
    def from_child(cls, seconds: dict[str, float], wall_s: float) -> Phases:
        """The phases the fit's process charged, ``other`` grown by what the outside clock saw
        beyond them (the process's exit)."""
        known = {k: float(seconds.get(k, 0.0)) for k in PHASE_NAMES}
        known["other"] += wall_s - sum(known.values())
        return cls(**known)

    def total(self) -> float:
        return sum(asdict(self).values())

    def other_frac(self, wall_s: float) -> float | None:
        """``other`` as a fraction of the outside clock (None for a zero clock)."""
        return self.other / wall_s if wall_s > 0 else None


@dataclass
class EpochRecord:
    """One epoch: seconds by phase (start-up and the teardown after training belong to none),
    the training batches and samples."""

    epoch: int
    phases: dict[str, float]
    batches: int
    samples: int


@dataclass
class Outcome:
    """What the fit learned: the training loss of every batch (its global step and second), each
    validation run's logged metrics, and the ``--until`` target with where it was reached."""

    train_loss: dict[str, list] = field(default_factory=lambda: {"step": [], "second": [], "value": []})
    validation: list[dict] = field(default_factory=list)
    until: str | None = None
    reached: dict | None = None
    """``{"step", "second", "validation_run"}`` where the target was first reached; None: not reached."""
    diverged: dict | None = None
    """``{"step", "why"}`` where the loss stopped being a finite number, or blew up."""

    def final_metrics(self) -> dict[str, float | None]:
        """The last validation run's metrics ({} without one)."""
        return dict(self.validation[-1]["metrics"]) if self.validation else {}


BLOW_UP = 10.0
"""A training loss this many times its first values' mean (once past the first tenth of the fit)
is a blow-up: the run diverged, as surely as a NaN."""


def divergence(steps: list[int], values: list[float | None]) -> dict | None:
    """Where a loss curve diverged: the first non-finite value, or the first value past the fit's
    first tenth that is :data:`BLOW_UP` times the first tenth's mean; None when it did not.

    Example:
        >>> divergence([1, 2, 3, 4], [1.0, 0.9, float("nan"), 0.8])["step"]
        3
        >>> divergence(list(range(20)), [1.0] * 10 + [50.0] * 10)["why"]
        'the loss blew up to 50 (10x its first values, 1)'
        >>> divergence([1, 2], [1.0, 0.5]) is None
        True
    """
    for s, v in zip(steps, values):
        if v is not None and not math.isfinite(v):
            return {"step": s, "why": f"the loss was {v}"}
    finite = [(s, v) for s, v in zip(steps, values) if v is not None]
    head = finite[: max(1, len(finite) // 10)]
    if len(finite) < 10 or not head:
        return None
    start = sum(v for _, v in head) / len(head)
    for s, v in finite[len(head) :]:
        if start > 0 and v > BLOW_UP * start:
            return {"step": s, "why": f"the loss blew up to {v:.3g} ({BLOW_UP:g}x its first values, {start:.3g})"}
    return None


@dataclass
class StepOnly:
    """The step figures of the same configuration, from the fit's own steady steps (training
    batches that ran back to back, nothing else between them), beside the fit's."""

    steps: int
    """Training batches the fit ran."""
    steady_steps: int
    median_s: float | None
    p25_s: float | None
    p75_s: float | None
    covers_frac: float | None
    """``steps x median_s / wall_s``: the share of the fit a step-only figure accounts for."""
    basis: str = (
        "the median of the training seconds between consecutive training batches that nothing stopped (no "
        "validation, save, compile or epoch edge between them; the progress bar's, loggers' and checkpoint "
        "callbacks' per-step work left out); covers = batches x median step / the outside clock"
    )


@dataclass
class FitResult:
    """One fit (``kind: "fit"``), the JSON contract's ``fit`` document without the stamp."""

    wall_s: float
    phases: Phases
    epochs: list[EpochRecord]
    outcome: Outcome
    compiles: dict
    step_only: StepOnly
    speedups: list[dict]
    settings: dict
    """The fit's length and seed, the Trainer settings it used and left out (with why)."""
    phase_check: dict
    warnings: list[str] = field(default_factory=list)
    failed: dict | None = None
    """Where a fit that raised was: ``{"phase", "second", "error"}`` (the timeline up to it is kept)."""
    parts: dict = field(default_factory=dict)
    """What the target's fit has beside its steps, read off the target
    (:func:`~fastloop.drivers.fit_parts.fit_parts`: ``validates``, ``checkpoints``, ``progress_bar``, ``logs``)."""
    loaders: dict = field(default_factory=dict)
    """Batches: ``train``, a whole epoch of the target's own fit; ``val``, a whole validation run
    (None: a loader without a length); ``val_run`` and ``sanity_run``, the validation batches this
    fit ran after and in the sanity check. A short fit (``train_batches``) ran fewer than ``train``."""
    extra: dict = field(default_factory=dict)
    """What the speedups counted, by statistic (the batch-size search's; ``fast_validation``: the compiles
    after its warm-up, by phase)."""

    def to_dict(self) -> dict[str, Any]:
        """The document: plain dicts and lists (non-finite numbers become null when written)."""
        doc = asdict(self)
        doc["kind"] = "fit"
        return doc


def phase_check(
    phases: Phases, wall_s: float, tolerance: float = PHASE_TOLERANCE, other_parts: dict | None = None
) -> dict:
    """Whether the phases account for the outside clock: ``other`` (the remainder) within
    ``tolerance`` of it.

    Example:
        >>> phase_check(Phases(train=9.0, other=1.0), 10.0)["within"]
        False
    """
    frac = phases.other_frac(wall_s)
    return {
        "sum_s": phases.total(),
        "wall_s": wall_s,
        "other_frac": frac,
        "tolerance": tolerance,
        "within": frac is not None and frac <= tolerance,
        "other_parts": other_parts or {},
        "how": "every phase but `other` is charged by the fit's own clock from the process's spawn; `other` is the "
        "outside clock's remainder (Lightning's teardown, the record written, the interpreter's exit)",
    }
