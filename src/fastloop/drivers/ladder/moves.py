"""One measured move of the staged search, in three steps: **measure** the candidate against the
best configuration so far (interleaved runs, :meth:`LadderState.compare_adaptive`), **decide** on
what was measured (a :class:`Decision`: the rung, what is kept, a tie, a cut by the budget), and
**record** the decision through the ladder's state. Two moves: adding speedups
(:meth:`Moves.try_adding`) and taking a kept one out (:meth:`Moves.ablate`).

A candidate is kept when it is significantly faster. A member taken out is left out when it is not
missed: not significantly slower without it, and at most ``ABLATION_LOSS`` slower at the point
estimate (a wide interval is not evidence of no effect).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from fastloop.compare import Runs, merge_runs
from fastloop.drivers.doctor import diagnose
from fastloop.drivers.ladder import wording
from fastloop.drivers.ladder.candidates import ablation_order, spec_names
from fastloop.drivers.ladder.rung import Rung
from fastloop.drivers.ladder.state import LadderState
from fastloop.measure.run_result import RunResult
from fastloop.speedups.base import Speedup, name_of

__all__ = ["ABLATION_LOSS", "Decision", "Measured", "Moves"]

ABLATION_LOSS = 0.02
"""A member is kept when the configuration without it is this much slower at the point estimate,
even where the interval is too wide to call it significant."""


@dataclass(frozen=True, slots=True)
class Measured:
    """A comparison of the best configuration (``base_spec``) with a candidate (``cand_spec``)."""

    base_spec: str
    cand_spec: str
    fresh: dict[str, Runs]
    ci: dict | None
    runs_per_side: int

    @property
    def base(self) -> Runs:
        return self.fresh[self.base_spec]

    @property
    def cand(self) -> Runs:
        return self.fresh[self.cand_spec]


@dataclass(frozen=True, slots=True)
class Decision:
    """What a move decided: its rung, the specs it keeps or the kept member it takes out (neither:
    nothing changes), the tie to report (kept, other), and the comparison the budget cut short
    (name, runs)."""

    rung: Rung
    keep: list[str] = field(default_factory=list)
    remove: str | None = None
    tie: tuple[str, str] | None = None
    cut_short: tuple[str, int] | None = None


def kind_of(runs: Runs) -> str:
    """The bottleneck's first word of ``runs`` (``unknown`` where none finished)."""
    found = diagnose(merge_runs(runs)) if runs.docs else {}
    return (found.get("bottleneck") or "unknown").split()[0]


def tie_between(kept: str, other: str, ci: dict | None) -> tuple[str, str] | None:
    """Two configurations the comparison could not tell apart (an interval straddling 1, or apart
    by less than ``MIN_EFFECT``; not cut by the budget): the simpler one, ``kept``, is kept."""
    if not ci or ci.get("significant") or ci.get("budget") or ci.get("ratio") is None:
        return None
    return kept, other


def with_tie(rung: Rung, tie: tuple[str, str] | None, ci: dict | None) -> Rung:
    """The rung whose decision says that its comparison tied (the simpler configuration kept)."""
    if tie is None or ci is None:
        return rung
    return replace(rung, decision=(rung.decision or "") + wording.tie_text(*tie, bool(ci.get("negligible"))))


class Moves:
    """The staged search's moves on a :class:`LadderState`, and what they learned on the way:
    speedups that did nothing inside their runs (never tried again), the bottleneck under which a
    speedup was dropped (tried again once it moved), the members of a compute bundle that was not
    faster."""

    def __init__(self, state: LadderState) -> None:
        self.state = state
        self.inactive: set[str] = set()
        """Speedups that skipped themselves or fell back inside a run: never tried again."""
        self.dropped_under: dict[str, str] = {}
        """Speedup -> the bottleneck under which it was dropped (a feed rung is tried again once it moved)."""
        self.in_bundle: set[str] = set()
        """Measured in a compute bundle that was not faster."""

    # -- adding speedups ---------------------------------------------------------------------------
    def try_adding(self, add: list[Speedup], label: str, *, tell_rate: bool, sized: str | None = None) -> bool:
        """Measure the best configuration with ``add`` against the best; keep what applied when it
        is significantly faster (``sized``: the self-sized speedup whose size this measures).
        Returns whether it was kept."""
        specs = [s.spec for s in add]
        if not self._starts(specs):
            return False
        move = self.measure(specs, tell_rate)
        if self.state.base_runs is None:
            self.state.set_baseline(move.fresh[self.state.base_spec])
        decision = self.decide_adding(move, label, specs)
        if sized is not None:
            decision = replace(decision, rung=replace(decision.rung, sized=sized))
        self.record(decision, move, specs)
        return bool(decision.keep)

    def _starts(self, specs: list[str]) -> bool:
        """Does a comparison of the best with ``specs`` fit: its first look (the candidate's runs
        and the base's top-up), predicted at the candidate's cost where it ran before, and the
        final comparison's reserve? Where it does not, the rung is listed not tried, with the plan."""
        state = self.state
        base = state.best()
        runs = state.min_repeats + max(0, state.min_repeats - (len(base.docs) if base is not None else 0))
        cand = state.spec_with(specs)
        if state.fits(runs, spec=cand):
            return True
        # a member of a bundle that was measured and not faster was tried: only not alone
        why = wording.ALONE_BUDGET if spec_names(specs) <= self.in_bundle else "budget"
        state.not_tried(specs, why, plan=state.plan(runs, cand))
        return False

    def measure(self, specs: list[str], tell_rate: bool) -> Measured:
        """The best configuration and the best with ``specs``, measured until the answer is clear."""
        base_spec, cand_spec = self.state.spec_with(), self.state.spec_with(specs)
        own = specs[0] if len(specs) == 1 else None
        fresh, ci, n = self.state.compare_adaptive(base_spec, cand_spec, own=own, tell_rate=tell_rate)
        return Measured(base_spec, cand_spec, fresh, ci, n)

    def decide_adding(self, move: Measured, label: str, specs: list[str]) -> Decision:
        """Keep what applied (in ``specs``) when significantly faster; else drop it, saying why."""
        cand, base, ci = move.cand, move.base, move.ci
        stage = self.state.stage
        if cand.failures or base.failures or not cand.docs:
            why = wording.comparison_failed(cand.failures, base.failures)
            rung = replace(Rung.of_runs(label, move.cand_spec, cand, "failed", why), stage=stage, members=specs)
            return Decision(rung)
        own = own_records(cand, specs)
        inactive = {n: wording.inactive_member(r) for n, r in own.items() if r["status"] != "applied"}
        rung = replace(
            Rung.of_runs(label, move.cand_spec, cand, "applied"),
            compared=True,
            vs_spec=move.base_spec,
            runs_per_side=move.runs_per_side,
            speedup_vs_prev=ci,
            stage=stage,
            members=specs,
            inactive=inactive or None,
        )
        active = [s for s in specs if name_of(s) not in inactive]
        if active and ci and ci["significant"] and ci["ratio"] > 1:
            now, before = (rung.bottleneck or {}).get("bottleneck"), kind_of(base)
            moved = None
            if now and before and now.split()[0] != before:
                moved = wording.moved_head(label.lstrip("+"), now, rung.bottleneck["evidence"], rung.feed)
            kept = replace(rung, decision=wording.kept_faster(ci["ratio"], move.base_spec), moved=moved)
            return Decision(kept, keep=active)
        if not active:
            rung = replace(rung, status="skipped", reason=wording.inactive_reasons(inactive))
        decision = wording.dropped(ci)
        cut = None
        if ci and ci.get("budget"):
            decision += wording.budget_ended(len(cand.docs))
            cut = (label.lstrip("+"), len(cand.docs))
        not_faster = [name_of(specs[0])] if ci and ci.get("ratio") is not None and len(specs) == 1 and active else None
        tie = tie_between(move.base_spec, move.cand_spec, ci) if active else None
        rung = replace(rung, decision=decision, measured_not_faster=not_faster)
        return Decision(with_tie(rung, tie, ci), tie=tie, cut_short=cut)

    def record(self, decision: Decision, move: Measured, specs: list[str]) -> None:
        """What the move decided, into the state (and what it learned, into the search's memory)."""
        state = self.state
        if decision.rung.status != "failed":
            self.inactive.update(decision.rung.inactive or {})  # did nothing inside its process: not tried again
        if decision.keep:
            state.keep(decision.keep, move.cand, vs_spec=move.base_spec, vs_runs=move.base, ci=move.ci)
        elif decision.rung.status != "failed":
            if decision.cut_short:
                state.cut_short(*decision.cut_short)
            if decision.tie:
                state.tie(*decision.tie, move.ci)
            for s in specs:
                self.dropped_under[name_of(s)] = state.bottleneck_kind()
        state.record_rung(decision.rung)

    # -- taking a kept speedup out -------------------------------------------------------------------
    def ablate(self, members: list[str]) -> None:
        """Take each kept member that costs something out in turn (compile time, capture, precision,
        layout: :func:`ablation_order`); leave it out when the configuration without it is not slower.
        Members that cost nothing when they do not help (TF32, a fused optimizer, the data on the
        GPU) stay without a comparison: the budget goes where a removal can matter."""
        state = self.state
        order = ablation_order(members)
        for i, spec in enumerate(order):
            if spec not in state.selected or len(state.selected) <= 1:
                continue
            base_spec, cand_spec = state.spec_with(), state.spec_without(spec)
            first = state.first_look(base_spec)
            # the ablations after it: their first looks at their own predicted cost (a cold compile)
            state.queue([(first, state.spec_without(m)) for m in order[i + 1 :] if m in state.selected])
            move = None
            if state.fits(first, spec=cand_spec):
                move = Measured(base_spec, cand_spec, *state.compare_adaptive(base_spec, cand_spec))
            if move is None or not (move.cand.failures or move.cand.docs):
                state.not_tried([f"ablation of {spec}"], plan=state.plan(first, cand_spec))  # the budget stopped it
                continue
            decision = self.decide_ablation(move, spec)
            if decision.remove is not None:
                state.drop(decision.remove, move.cand)
            if decision.cut_short:
                state.cut_short(*decision.cut_short)
            if decision.tie:
                state.tie(*decision.tie, move.ci)
            state.record_rung(decision.rung)

    def decide_ablation(self, move: Measured, spec: str) -> Decision:
        """Measured without the kept ``spec``: keep it when it is missed, else take it out."""
        cand, ci, label, stage = move.cand, move.ci, f"-{spec}", self.state.stage
        if cand.failures:
            rung = Rung.of_runs(label, move.cand_spec, cand, "failed", cand.failures[-1])
            return Decision(replace(rung, stage=stage, decision=wording.ablation_failed(spec)))
        rung = replace(
            Rung.of_runs(label, move.cand_spec, cand, "applied"),
            compared=True,
            vs_spec=move.base_spec,
            runs_per_side=move.runs_per_side,
            speedup_vs_prev=ci,
            stage=stage,
            ablation=spec,
        )
        significantly_slower = bool(ci and ci["significant"] and ci["ratio"] < 1)
        slower = bool(ci and (significantly_slower or ci["ratio"] < 1 - ABLATION_LOSS))
        if ci and ci.get("budget") and not significantly_slower:  # too few runs to tell
            decided = wording.ablation_budget_ended(spec, len(cand.docs), ci.get("ratio"))
            return Decision(replace(rung, decision=decided), cut_short=(f"ablation of {spec}", len(cand.docs)))
        if ci and slower:
            return Decision(replace(rung, decision=wording.ablation_kept(spec, ci, ABLATION_LOSS)))
        tie = tie_between(move.cand_spec, move.base_spec, ci)
        removed = replace(rung, decision=wording.ablation_removed(spec, ci), measured_not_faster=[name_of(spec)])
        return Decision(with_tie(removed, tie, ci), remove=spec, tie=tie)


def own_records(runs: Runs, specs: list[str]) -> dict[str, dict]:
    """The last run's own records of the speedups ``specs`` name (applied, skipped, fallback)."""
    run = RunResult.from_dict(runs.docs[-1] if runs.docs else {})
    names = spec_names(specs)
    return {r.name: r.to_dict() for r in run.speedups if r.name in names}
