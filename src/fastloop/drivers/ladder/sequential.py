"""The ladder's sequential searches (``fastloop ladder --sequential`` and ``--cumulative``): each
candidate in turn on top of the best configuration so far (kept only when significantly faster),
or, in the cumulative ladder (the state's ``mode``), on top of all before it (the story). The
default search is :class:`~fastloop.drivers.ladder.search.StagedSearch`; both are a
:class:`~fastloop.drivers.ladder.search.Search`.
"""

from __future__ import annotations

from dataclasses import replace

from fastloop.compare import Runs
from fastloop.drivers.ladder import wording
from fastloop.drivers.ladder.gates import feed_cannot_help, model_says_no
from fastloop.drivers.ladder.moves import Measured
from fastloop.drivers.ladder.rung import Rung
from fastloop.drivers.ladder.state import LadderState, own_record
from fastloop.speedups.base import Context, Speedup

__all__ = ["SequentialSearch"]


class SequentialSearch:
    """One candidate at a time (a :class:`~fastloop.drivers.ladder.search.Search`)."""

    def run(self, state: LadderState, candidates: list[Speedup], ctx: Context) -> None:
        moved_from: str | None = None  # the bottleneck a kept rung's move is told against
        for s in candidates:
            reason = (
                s.why_not(ctx)
                or model_says_no(state.base_runs, s)
                or feed_cannot_help(state.best(), state.spec_with(), s)
            )
            if reason:
                state.record_rung(Rung.of_runs(f"+{s.spec}", state.spec_with([s.spec]), None, "skipped", reason))
                continue
            base_spec, cand_spec = state.spec_with(), state.spec_with([s.spec])
            # a feed candidate's runs learn what the step consumes (workers weighs its loader against it)
            compared = state.compare_adaptive(base_spec, cand_spec, own=s.spec, tell_rate=s.ladder.feeds)
            move = Measured(base_spec, cand_spec, *compared)
            if state.base_runs is None:
                state.set_baseline(move.fresh[state.base_spec])
                moved_from = (state.rungs[0].bottleneck or {}).get("bottleneck")
            if not (move.cand.docs or move.cand.failures or move.base.failures):
                # the budget ended the comparison before the candidate's first run
                state.not_tried([s.spec], plan=state.plan(state.first_look(base_spec), cand_spec))
                continue
            rung, keep = self.decide(state, move, s, moved_from)
            if keep:
                # against the baseline, these runs are the final comparison's (its interval computed then)
                state.keep([s.spec], move.cand, vs_spec=base_spec, vs_runs=move.base, ci=None)
                if rung.moved is not None and rung.bottleneck is not None:
                    moved_from = rung.bottleneck["bottleneck"]
            state.record_rung(rung)
        if state.base_runs is None:  # nothing could be measured on top of it: the baseline alone
            fresh: dict[str, Runs] = {}
            state.measure_runs([state.base_spec], state.min_repeats, fresh)
            state.set_baseline(fresh[state.base_spec])

    @staticmethod
    def decide(state: LadderState, move: Measured, s: Speedup, moved_from: str | None) -> tuple[Rung, bool]:
        """The rung of ``s`` measured on top of the best configuration, and whether it is kept."""
        label, cand, base, ci, n = f"+{s.spec}", move.cand, move.base, move.ci, move.runs_per_side
        if cand.failures or base.failures:  # a process died: no verdict, the ladder goes on
            return Rung.of_runs(
                label, move.cand_spec, cand, "failed", wording.comparison_failed(cand.failures, base.failures)
            ), False
        own = own_record(cand.docs[-1], s.spec)
        rung = replace(
            Rung.of_runs(label, move.cand_spec, cand, "applied"),
            compared=True,
            vs_spec=move.base_spec,
            runs_per_side=n,
            speedup_vs_prev=ci,
        )
        if own and own["status"] != "applied":
            inactive = replace(rung, status=own["status"], reason=own["reason"], speedup_vs_prev=None)
            return replace(inactive, decision=wording.dropped_inactive(own)), False
        cumulative = state.mode == "cumulative"
        keep = cumulative or bool(ci and ci["significant"] and ci["ratio"] > 1)
        if cumulative:
            decision = wording.KEPT_CUMULATIVE
        elif keep and ci:
            decision = wording.kept_faster(ci["ratio"], move.base_spec, ci.get("per"))
        elif ci and n == 1:
            decision = wording.dropped_after_one_run(ci, len(base.docs), move.base_spec)
        elif ci and ci.get("futile"):
            decision = wording.dropped_futile(ci, state.min_gain, n)
        else:
            decision = wording.dropped(ci)
        now = (rung.bottleneck or {}).get("bottleneck")
        moved = None
        if keep and now and moved_from and now.split()[0] != moved_from.split()[0]:  # "(fp32)" is no move
            moved = wording.moved_head(s.spec, now, rung.bottleneck["evidence"], rung.feed)
        return replace(rung, decision=decision, moved=moved), keep
