"""The ladder aimed at the whole fit (``fastloop ladder TARGET --objective fit``).

The user pays for the fit: training steps, and validation, checkpoint saves, the host syncs of
logging and the progress bar, epoch edges, compiles and start-up. The ladder's step runs turn all
but the steps off, so under this objective it also runs short fits of the target (its own
validation, checkpoints, logger and progress bar; :mod:`fastloop.drivers.fit`) and **predicts the
fit's time from their measured phases**, rather than measuring every candidate as a fit: a fit pays
its start-up, its validation and its saves on every run, and a comparison needs several runs a side,
so measuring candidates as fits would cost many times what the budget holds (the document says how
many: :func:`~fastloop.drivers.ladder.wording.fit_method_why`). Two short fits are measured:

1. **Plain** (the baseline's configuration), before the step's search: the fit's phases, what the
   target has beside its steps (:func:`~fastloop.drivers.fit_parts.fit_parts`: a validation loop,
   checkpoints, a logger or progress bar) and what a fit costs, which the budget keeps for the
   second fit while the step's search runs (:meth:`LadderState.reserve_for_fits`).
2. **With the fit speedups** (those whose :func:`~fastloop.drivers.ladder.candidates.fit_phase_of`
   names a phase the target has), after the step's search: each shortens its own phase, so one fit
   measures them all; each is kept where its phase is at least ``FIT_PHASE_GAIN`` shorter and what
   it saves at least ``FIT_MIN_SHARE`` of the fit.

A short fit runs one epoch of a few batches (``SHORT_FIT``) and its record says what a whole epoch
of the target's fit has (its loaders' batches): :func:`fit_shape` scales the short fit's phases up
to one whole epoch (steady steps for the batches it did not run, validation and logging syncs by
their batches), and :func:`predict_pick` turns the plain fit's shape into the pick's: the training
phase divided by the step's measured speedup (its interval gives the prediction's), the kept fit
speedups' phases from the fit with them, the pick's compile seconds from its runs.

Example:
    >>> plain = FitShape(once={"startup": 2.0}, epoch={"train": 5.0, "validation": 3.0})
    >>> round(plain.total() / predict_pick(plain, 2.0, {}, None).total(), 2)   # half the fit trains, 2x faster
    1.33
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from fastloop.drivers.fit import FitOptions, run_fit
from fastloop.drivers.fit_result import PHASE_NAMES
from fastloop.drivers.ladder import wording
from fastloop.drivers.ladder.candidates import fit_phase_of, join_specs
from fastloop.drivers.ladder.state import MIN_REPEATS, LadderState
from fastloop.errors import UserCodeError
from fastloop.speedups.base import Context, Speedup

__all__ = [
    "EPOCH_PHASES",
    "FIT_MIN_SHARE",
    "FIT_PHASE_GAIN",
    "FIT_RESERVE",
    "NEEDS",
    "SHORT_FIT",
    "FitObjective",
    "FitShape",
    "fit_shape",
    "predict_pick",
    "run_short_fit",
]

SHORT_FIT = {"cuda": (32, 8), "cpu": (16, 4)}
"""The ladder's short fit on each device: (training batches, batches a validation run), one epoch.
Enough for a steady step and a per-batch validation cost; few enough that two fits fit the budget
beside the step's search (a CPU step of the demo is ~0.1-0.5 s)."""
FIT_PHASE_GAIN = 0.1
"""A fit speedup is kept where its phase is at least this much shorter in the fit with it (one
short fit a side: a point estimate, not an interval) ..."""
FIT_MIN_SHARE = 0.01
"""... and the seconds it saves are at least this share of the plain fit (one whole epoch): a
phase of a few milliseconds moves by as much from one fit to the next."""
FIT_RESERVE = 1.2
"""The fit with the fit speedups is predicted to cost this many times the plain fit (the speedups'
own set-up: a writer thread, a deferred connector)."""
EPOCH_PHASES = ("train", "validation", "checkpoint", "epoch_edges", "host_syncs")
"""The phases every epoch pays again; the rest (start-up, compile, teardown) a fit pays once."""
COMPILE_PHASE = "compile"
"""The fit's phase of compiles (the phase, not the speedup of that name): the pick's compile seconds go there."""
NEEDS = {"validation": ("validates",), "checkpoint": ("checkpoints",), "host_syncs": ("logs", "progress_bar")}
"""What the target's fit must have (:func:`~fastloop.drivers.fit_parts.fit_parts`, any of them) for
a speedup of each phase to have something to shorten."""

Fit = Callable[[FitOptions], dict]
"""Runs one fit and returns its document (``kind: "fit"``)."""


def run_short_fit(opts: FitOptions) -> dict:
    """One fit in a fresh process (:func:`~fastloop.drivers.fit.run_fit`): its document; the user's
    error, when their code raised in it, as :class:`~fastloop.errors.UserCodeError`."""
    doc, error = run_fit(opts)
    if error is not None:
        raise UserCodeError(f"the short fit of {opts.target} ({opts.speedups}) raised:\n{error}")
    return doc


@dataclass(frozen=True)
class FitShape:
    """A fit's seconds by phase: ``once`` (start-up, compile, teardown, the sanity check: paid once a
    fit) and ``epoch`` (:data:`EPOCH_PHASES` of one whole epoch of the target's fit)."""

    once: dict[str, float] = field(default_factory=dict)
    epoch: dict[str, float] = field(default_factory=dict)

    def phase(self, name: str) -> float:
        """The seconds of phase ``name`` in a fit of one epoch."""
        return self.once.get(name, 0.0) + self.epoch.get(name, 0.0)

    def phases(self) -> dict[str, float]:
        """Every phase's seconds in a fit of one epoch."""
        return {p: self.phase(p) for p in PHASE_NAMES}

    def total(self) -> float:
        """A fit of one epoch: seconds."""
        return sum(self.once.values()) + sum(self.epoch.values())

    def epoch_s(self) -> float:
        """Each further epoch: seconds."""
        return sum(self.epoch.values())


def _validation_scale(fit: dict) -> float:
    """How many times the batches of the short fit's validation runs a whole run has (1 where the
    record does not say: its validation stands as measured)."""
    loaders = fit.get("loaders") or {}
    runs = fit.get("outcome", {}).get("validation") or []
    ran, full = loaders.get("val_run"), loaders.get("val")
    if not runs or not ran or not full:
        return 1.0
    per_run = ran / len(runs)  # the short fit's runs all had the same limit
    return full / per_run


def fit_shape(fit: dict) -> FitShape:
    """A fit document's phases as a :class:`FitShape` of one whole epoch of the target's fit: a
    short fit (fewer training batches than the target's epoch, fewer validation batches than a run)
    scaled up by its record (``loaders``): the batches it did not run at its steady step, its
    logging syncs by the batches, its validation by the batches a run has.

    Args:
        fit: a fit document (``fastloop fit``), or a record with ``phases`` and ``epochs``.

    Returns:
        Its seconds paid once and in one whole epoch.

    Example:
        >>> doc = {"phases": {"startup": 2.0, "train": 4.0, "host_syncs": 1.0}, "loaders": {"train": 8},
        ...        "epochs": [{"epoch": 0, "batches": 4, "phases": {"train": 4.0, "host_syncs": 1.0}}],
        ...        "step_only": {"median_s": 0.5}}
        >>> shape = fit_shape(doc)
        >>> shape.once["startup"], shape.epoch["train"], shape.epoch["host_syncs"]
        (2.0, 6.0, 2.0)
    """
    totals = {p: float(fit["phases"].get(p) or 0.0) for p in PHASE_NAMES}
    first = (fit.get("epochs") or [None])[0]
    measured = (first or {}).get("phases") or {}
    epoch = {p: float(measured.get(p) or 0.0) for p in EPOCH_PHASES}
    once = {p: totals[p] - epoch.get(p, 0.0) for p in PHASE_NAMES}
    ran = (first or {}).get("batches") or 0
    full = (fit.get("loaders") or {}).get("train") or ran
    if first is not None and ran and full > ran:
        median = (fit.get("step_only") or {}).get("median_s") or epoch["train"] / ran
        epoch["train"] += (full - ran) * median
        epoch["host_syncs"] *= full / ran
    if first is not None:
        epoch["validation"] *= _validation_scale(fit)
    return FitShape(once=once, epoch=epoch)


def predict_pick(plain: FitShape, step_ratio: float, kept: dict[str, FitShape], compile_s: float | None) -> FitShape:
    """The pick's fit predicted from the plain fit's shape.

    Args:
        plain: the plain fit's :class:`FitShape`.
        step_ratio: the pick's step speedup over the baseline (> 1: faster); it divides the training phase.
        kept: for each phase a kept fit speedup shortens, the shape of the fit measured with it.
        compile_s: the pick's compile seconds (its step runs'), None where it compiles nothing.

    Returns:
        The pick's predicted shape.

    Example:
        >>> plain = FitShape(once={"startup": 2.0}, epoch={"train": 4.0, "checkpoint": 2.0})
        >>> faster_saves = FitShape(once={"startup": 2.5}, epoch={"train": 4.1, "checkpoint": 0.5})
        >>> predict_pick(plain, 2.0, {"checkpoint": faster_saves}, 3.0).phases()["checkpoint"]
        0.5
    """
    once, epoch = dict(plain.once), dict(plain.epoch)
    epoch["train"] = plain.epoch.get("train", 0.0) / step_ratio
    for phase, shape in kept.items():
        once[phase], epoch[phase] = shape.once.get(phase, 0.0), shape.epoch.get(phase, 0.0)
    if compile_s:
        once[COMPILE_PHASE] = max(once.get(COMPILE_PHASE, 0.0), compile_s)
    return FitShape(once=once, epoch=epoch)


def _record_of(fit: dict, s: Speedup) -> dict | None:
    return next((r for r in fit.get("speedups") or [] if r.get("name") == s.name), None)


class FitObjective:
    """The fit objective under way on a :class:`LadderState` (see the module's docstring): its
    short fits, its rungs (the fit speedups), and its section of the document, written through the
    state's :meth:`~LadderState.record_fit`.

    Args:
        state: the ladder's state (its target, device, base and budget).
        candidates: the fit speedups to try (:func:`~fastloop.drivers.ladder.candidates.split_fit`).
        ctx: the device's context (a speedup that cannot apply there is skipped with its reason).
        step_candidates: how many candidates the step's search tries.
        fit: runs one fit (default: a fresh process, :func:`run_short_fit`).
    """

    def __init__(
        self,
        state: LadderState,
        candidates: list[Speedup],
        ctx: Context,
        *,
        step_candidates: int,
        fit: Fit | None = None,
    ) -> None:
        self.state, self.candidates, self.ctx = state, candidates, ctx
        self.step_candidates = step_candidates
        """How many candidates the step's search tries (what measuring every one as fits would cost)."""
        self.fit = fit or run_short_fit
        self.short = SHORT_FIT.get(state.device, SHORT_FIT["cuda"])
        self.fits: list[dict] = []
        """The short fits measured: label, spec, cost and the fit's document."""
        self.rungs: list[dict] = []
        self.applicable: list[Speedup] = []
        self.plain: FitShape | None = None
        self.with_speedups: dict | None = None

    def _options(self, spec: str) -> FitOptions:
        return FitOptions(
            target=self.state.target,
            speedups=spec,
            device=self.state.device,
            epochs=1,
            train_batches=self.short[0],
            val_batches=self.short[1],
        )

    def _measure(self, label: str, spec: str) -> dict:
        self.state.say(f"short fit ({label}): {spec}")
        t0 = time.perf_counter()
        doc = self.fit(self._options(spec))
        self.fits.append({"label": label, "spec": spec, "cost_s": time.perf_counter() - t0, "doc": doc})
        return doc

    def start(self) -> None:
        """The plain short fit (before the step's search): the fit's phases, what the target has,
        and the budget kept for the fit with the fit speedups."""
        doc = self._measure("plain", self.state.base_spec)
        self.plain = fit_shape(doc)
        parts = doc.get("parts") or {}
        for s in self.candidates:
            reason = s.why_not(self.ctx) or self._lacks(s, parts)
            if reason:
                self.rungs.append(self._rung(s, "skipped", reason))
            else:
                self.applicable.append(s)
        if self.applicable:
            self.state.reserve_for_fits(FIT_RESERVE * self.fits[0]["cost_s"])
        self.state.record_fit(self.section())

    @staticmethod
    def _lacks(s: Speedup, parts: dict) -> str | None:
        """Why the target's fit has nothing for ``s`` to shorten (None: it has)."""
        needs = NEEDS.get(fit_phase_of(s) or "", ())
        return None if any(parts.get(n) for n in needs) else wording.fit_nothing_to_shorten(fit_phase_of(s), needs)

    def _rung(self, s: Speedup, status: str, reason: str = "", **measured: object) -> dict:
        return {"name": s.spec, "phase": fit_phase_of(s), "status": status, "reason": reason, "kept": False, **measured}

    def measure_rungs(self) -> None:
        """After the step's search: the fit with the applicable fit speedups, each one's phase
        against the plain fit's, kept or dropped (not tried where the budget has no room for it)."""
        state, cost = self.state, FIT_RESERVE * self.fits[0]["cost_s"]
        state.reserve_for_fits(0.0)
        if not self.applicable:
            return
        limit = state.budget.limit_s
        reserve = state.final_reserve_s() + state.check_reserve_s()
        if limit is not None and state.budget.elapsed() + cost + reserve > limit:
            plan = {"predicted_s": round(cost, 1), "left_s": round(limit - state.budget.elapsed(), 1)}
            self.rungs += [self._rung(s, "not tried", wording.fit_budget(plan)) for s in self.applicable]
            state.record_fit(self.section())
            return
        spec = join_specs(state.base + [s.spec for s in self.applicable])
        doc = self._measure("fit speedups", spec)
        self.with_speedups = doc
        with_shape = fit_shape(doc)
        assert self.plain is not None, "start first"
        for s in self.applicable:
            self.rungs.append(self._decide(s, _record_of(doc, s), self.plain, with_shape))
        state.record_fit(self.section())

    def _decide(self, s: Speedup, record: dict | None, plain: FitShape, with_shape: FitShape) -> dict:
        """Keep ``s`` where it applied, its phase is at least :data:`FIT_PHASE_GAIN` shorter and the
        seconds saved at least :data:`FIT_MIN_SHARE` of the plain fit."""
        if record is None or record.get("status") != "applied":
            status = (record or {}).get("status") or "skipped"
            return self._rung(s, status, (record or {}).get("reason") or wording.FIT_NOT_RECORDED)
        phase = fit_phase_of(s) or ""
        before, after = plain.phase(phase), with_shape.phase(phase)
        least = FIT_MIN_SHARE * plain.total()
        kept = before > 0 and after <= before * (1 - FIT_PHASE_GAIN) and before - after >= least
        decision = wording.fit_rung_decision(phase, before, after, kept, FIT_PHASE_GAIN, least)
        return {**self._rung(s, "applied", plain_s=before, with_s=after), "kept": kept, "decision": decision}

    def kept(self) -> list[dict]:
        return [r for r in self.rungs if r["kept"]]

    def section(self, ladder_doc: dict | None = None) -> dict:
        """The document's ``fit`` section: how, the short fits, the rungs, and (given the ladder's
        finished document) the prediction plain vs pick beside the step's."""
        cost = self.fits[0]["cost_s"] if self.fits else None
        train, val = self.short
        out: dict = {
            "method": "predicted from measured phases",
            "why": wording.fit_method_why(
                cost, len(self.candidates) + self.step_candidates, MIN_REPEATS, self.state.budget.limit_s
            ),
            "assumes": wording.FIT_ASSUMES,
            "short_fit": {"epochs": 1, "train_batches": train, "val_batches": val},
            "parts": (self.fits[0]["doc"].get("parts") if self.fits else None) or {},
            "fits": [self._fit_entry(f) for f in self.fits],
            "rungs": list(self.rungs),
            "selected": [r["name"] for r in self.kept()],
            "predicted": None,
        }
        if ladder_doc is not None and self.plain is not None:
            out.update(self._prediction(ladder_doc))
        return out

    @staticmethod
    def _fit_entry(f: dict) -> dict:
        doc = f["doc"]
        return {
            "label": f["label"],
            "spec": f["spec"],
            "cost_s": round(f["cost_s"], 2),
            "wall_s": doc.get("wall_s"),
            "phases": doc.get("phases"),
            "loaders": doc.get("loaders") or {},
            "speedups": doc.get("speedups") or [],
        }

    def _prediction(self, ladder_doc: dict) -> dict:
        """The fit of one epoch and each further one, plain vs the pick (the step's pick and the
        kept fit speedups), beside the step's speedup; the pick's line to paste."""
        assert self.plain is not None
        final = next((r for r in ladder_doc.get("rungs") or [] if r.get("final")), {})
        step = final.get("speedup_vs_baseline") or None
        compile_s = final.get("compile_s") if ladder_doc.get("selected") else None
        with_shape = fit_shape(self.with_speedups) if self.with_speedups is not None else None
        kept = {r["phase"]: with_shape for r in self.kept() if with_shape is not None}
        ratio = (step or {}).get("ratio") or 1.0
        pick = predict_pick(self.plain, ratio, kept, compile_s)
        ends = [predict_pick(self.plain, (step or {}).get(k) or ratio, kept, compile_s) for k in ("ci_high", "ci_low")]
        plain_s = self.plain.total()
        step_pick = [s for s in str(ladder_doc.get("selected_spec") or "none").split(",") if s != "none"]
        spec = join_specs(step_pick + [r["name"] for r in self.kept()])
        first = (self.fits[0]["doc"].get("loaders") or {}) if self.fits else {}
        return {
            "pick_spec": spec,
            "callbacks_line": wording.fit_callbacks_line(spec),
            "predicted": {
                "for": wording.fit_predicted_for(first.get("train"), first.get("val")),
                "plain": {"wall_s": plain_s, "epoch_s": self.plain.epoch_s(), "phases": self.plain.phases()},
                "pick": {
                    "wall_s": pick.total(),
                    "low_s": ends[0].total(),
                    "high_s": ends[1].total(),
                    "epoch_s": pick.epoch_s(),
                    "phases": pick.phases(),
                },
                "speedup": {
                    "ratio": plain_s / pick.total(),
                    "ci_low": plain_s / ends[1].total(),
                    "ci_high": plain_s / ends[0].total(),
                },
                "epoch_speedup": self.plain.epoch_s() / pick.epoch_s() if pick.epoch_s() else None,
                "step_speedup": step,
                "compile_s": compile_s,
            },
        }
