"""The ladder's state: its runs, their budget, its comparisons and its document. One public
object that the search (:mod:`fastloop.drivers.ladder_search`), the sequential path and the
gates use; :func:`fastloop.drivers.ladder.run_ladder` builds it and runs the search on it."""

from __future__ import annotations

import time
from collections.abc import Callable

from fastloop.compare import VERDICT_CONFIDENCE, Runs, compare, measure_interleaved, step_rate_of
from fastloop.drivers.ladder_budget import BudgetPlan
from fastloop.drivers.ladder_report import (
    answer_lines,
    baseline_failed,
    filter_advice,
    join_specs,
    note_run_order,
    own_record,
    pooled_final,
    rung_doc,
)
from fastloop.drivers.pick_check import check_ladder_pick

__all__ = ["EARLY_DROP", "LadderState", "MIN_GAIN", "MIN_REPEATS"]

MIN_REPEATS = 3
EARLY_DROP = 0.98
"""A candidate whose first run is at most this fast relative to the best configuration so far
(2% slower or worse), and outside the prediction interval of that configuration's runs, is
dropped after that one run."""
MIN_GAIN = 1.01
"""In the selecting ladder a comparison stops at a look once its interval's upper end is below
this ratio: the candidate can be at most 1% faster, so more runs could not make it worth keeping
(H200 round 8: workers on the compiled GPT step ran 4 more processes, ~60 s, to learn 1.00x)."""


class LadderState(BudgetPlan):
    def __init__(
        self,
        target: str,
        *,
        steps: int,
        warmup: int,
        device: str,
        measure: Callable[..., dict],
        progress: Callable[[str], None] | None,
        on_update: Callable[[dict], None] | None,
        max_repeats: int,
        budget: float | None,
        mode: str,
        base: list[str] | None = None,
    ) -> None:
        self.target, self.steps, self.warmup, self.device = target, steps, warmup, device
        self.base = list(base or [])
        """Speedups every configuration has (``--base``): the baseline is this set, not plain training."""
        self.base_spec = join_specs(self.base)
        self.progress, self.on_update = progress, on_update
        self.process_s: list[float] = []
        """Wall time of each configuration run (a fresh process each): where the ladder's time goes."""
        self.ties: list[dict] = []  # configurations the comparisons could not tell apart (the simpler kept)
        self.run_log: list[dict] = []
        """Each run in order: its configuration, wall seconds, and (where the run says) its compile
        and GPU-profile seconds."""

        self.measure = self.timed(measure)
        self.untimed_measure = measure  # the check's paired runs: not ladder runs, not in their predictions
        self.check: dict | None = None
        """The check of the pick against the baseline (:mod:`fastloop.drivers.pick_check`)."""
        self.max_repeats, self.budget, self.mode = max_repeats, budget, mode
        self.min_repeats, self.min_gain = MIN_REPEATS, MIN_GAIN
        self.finalizing = False
        self.final_first = MIN_REPEATS  # the final comparison's runs a side, sure of the budget
        self.queued: list[tuple[int, str | None]] = []
        self.measure_s: float | None = None
        """Seconds of steady steps each run was asked to measure (None: ``steps`` steps)."""
        """Runs the search keeps for comparisons it has still planned in this stage (the first
        look of each): a comparison is extended past its first look only when they still fit, so
        the budget measures every rung before it measures one rung longer."""
        self.cut_by_budget = False
        """Set when the budget ended a comparison before its look (cleared at each comparison)."""
        self.spec_s: dict[str, list[float]] = {}
        """Each configuration's run seconds (a compiled configuration's runs cost more)."""
        self.spec_warm: dict[str, list[float | None]] = {}
        """Each configuration's runs' warm-up seconds beyond their steps (a cold compiler cache's
        one-off shows here): the budget predicts a run once warm."""
        self.vs_baseline: tuple[dict[str, Runs], dict | None] | None = None
        """The latest comparison of the baseline with a kept configuration (fresh runs, its interval)."""
        self.stages: list[dict] = []
        """The staged search's story: each stage, the bottleneck then, and what it tried."""
        self.not_tried: list[dict] = []
        """What the budget (or a reason) left unmeasured: name, stage, why (with the budget's arithmetic)."""
        self.cut_short: list[dict] = []
        """Comparisons measured but ended by the budget before their interval called them: name, stage, runs."""
        self.rungs: list[dict] = []
        self.selected: list[str] = []
        self.final: dict | None = None
        self.t0 = time.perf_counter()
        self._pending: dict[str, Runs] | None = None
        self.interrupted = False
        self.best_runs: dict[str, Runs] = {}

    def final_ready(self) -> bool:
        """Has the selected set already been measured against the baseline, interleaved?"""
        spec = self.spec_with()
        return self.vs_baseline is not None and spec in self.vs_baseline[0] and self.base_spec in self.vs_baseline[0]

    def spec_without(self, member: str) -> str:
        """The configuration with the kept ``member`` taken out (an ablation's candidate)."""
        return join_specs(self.base + [s for s in self.selected if s != member])

    def spec_with(self, extra: list[str] | None = None) -> str:
        """The configuration: the base, the kept candidates, and ``extra``."""
        return join_specs(self.base + self.selected + list(extra or []))

    # -- measurement -------------------------------------------------------------------------
    def measure_runs(
        self,
        specs: list[str],
        repeats: int,
        fresh: dict[str, Runs],
        up_to: int | None = None,
        own: str | None = None,
        told: dict[str, float | None] | None = None,
        order: list[str] | None = None,
    ) -> None:
        """Interleaved runs of ``specs``; ``own``: the candidate speedup of the last spec, whose
        configuration is not run again once that speedup skipped itself or fell back in a run;
        ``told``: the step rate each spec's runs are told (a feed candidate: its base's)."""
        self._pending = fresh  # shown as "in progress" (or "interrupted") until its rung is written

        def done(spec: str, doc: dict) -> str:
            rec = own_record(doc, own) if own and spec == specs[-1] else None
            return f"{own} {rec['status']} inside its process" if rec and rec["status"] != "applied" else ""

        def stop(spec: str) -> bool:
            if self.run_fits(spec, fresh):
                return False
            self.cut_by_budget = True
            return True

        measure_interleaved(
            self.target,
            specs,
            repeats,
            measure=self.measure,
            steps=self.steps,
            warmup=self.warmup,
            device=self.device,
            runs=fresh,
            progress=self.progress,
            on_run=self.publish,
            up_to=up_to,
            done=done,
            stop=stop,
            told=told,
            order=order,
        )
        self._pending = None

    def first_look(self, base: str) -> int:
        """The runs of a comparison's first look against ``base``: one in the selecting ladder where
        the base has runs enough to judge a single run against (:meth:`compare_adaptive`'s early look)."""
        runs = self.best_runs.get(base)
        return 1 if self.mode != "cumulative" and runs is not None and len(runs.docs) >= MIN_REPEATS else MIN_REPEATS

    def _looks(self, early: bool = False) -> list[int]:
        looks = sorted({MIN_REPEATS, self.max_repeats}) if self.max_repeats > MIN_REPEATS else [MIN_REPEATS]
        return [1] + looks if early else looks

    def compare_adaptive(
        self, base: str, cand: str, own: str | None = None, tell_rate: bool = False
    ) -> tuple[dict[str, Runs], dict | None, int]:
        """Interleaved runs of base and candidate until the answer is clear or the budget is spent.

        When the base's runs are already measured (the best configuration so far), the selecting
        ladder looks once after the candidate's first run: a candidate slower than
        ``EARLY_DROP`` whose one run lies outside the prediction interval of the base's runs is
        dropped there (it can only be dropped early, never kept)."""
        fresh: dict[str, Runs] = {}
        order: list[str] = []
        if base in self.best_runs:  # the best configuration's runs so far count again
            fresh[base] = self.best_runs[base]
        reused = len(fresh[base].docs) if base in fresh else 0
        early = self.mode != "cumulative" and len(fresh[base].docs) >= MIN_REPEATS if base in fresh else False
        looks = self._looks(early)
        confidence = 1 - (1 - VERDICT_CONFIDENCE) / len(looks)
        ci = None
        self.cut_by_budget = False
        for i, n in enumerate(looks):
            needed = sum(max(0, n - len(fresh[k].docs)) if k in fresh else n for k in (base, cand))
            if i > 0 and ci is not None and not self.fits(needed, queued=True):
                ci["budget"] = True  # the next look's runs and the final comparison would not fit
                break
            self.measure_runs(
                [base, cand],
                n,
                fresh,
                up_to=n,
                own=own,
                order=order,
                told={cand: step_rate_of(self.best_runs.get(base))} if tell_rate else None,
            )
            self.best_runs[base] = fresh[base]
            if self.cut_by_budget:  # the budget ended this look early: decide on what ran
                ci = compare(fresh[base], fresh[cand], confidence=confidence) if fresh[cand].docs else None
                if ci is not None:
                    ci["budget"] = True
                break
            if n == 1:  # the early look: one run of the candidate against the base's runs
                ci = compare(fresh[base], fresh[cand], confidence=confidence, one_run=True)
                if ci is None or fresh[cand].settled or (ci["significant"] and ci["ratio"] <= EARLY_DROP):
                    break
                continue
            ci = compare(fresh[base], fresh[cand], confidence=confidence)
            if ci is None or ci["significant"] or fresh[cand].settled or i == len(looks) - 1:
                break
            if ci["ci_high"] is not None and ci["ci_high"] < 1.0:  # clearly slower: no point measuring more
                break
            if self.mode != "cumulative" and ci["ci_high"] is not None and ci["ci_high"] < MIN_GAIN:
                ci["futile"] = True  # at most 1% faster: no number of runs makes it worth keeping
                break
            if self.budget is not None and time.perf_counter() - self.t0 > self.budget:
                break
        note_run_order(ci, order, base, reused, fresh[base], fresh[cand])
        return fresh, ci, n

    # -- documents -----------------------------------------------------------------------------
    rung_doc = staticmethod(rung_doc)

    def document(self) -> dict:
        rungs = [dict(r) for r in self.rungs]
        base = getattr(self, "base_runs", None)
        if (
            base is not None
            and rungs
            and str(rungs[0].get("rung", "")).startswith("baseline")
            and rungs[0].get("repeats") != len(base.docs)
        ):  # topped up by later comparisons
            rungs[0] = self.rung_doc(rungs[0]["rung"], self.base_spec, base, "applied", "")
        if self.final is not None:
            rungs.append(self.final)
        for spec, runs in (self._pending or {}).items():  # the comparison under way
            if runs.docs:
                state = "interrupted" if self.interrupted else "in progress"
                rungs.append(
                    self.rung_doc(
                        f"{state}: {spec}",
                        spec,
                        runs,
                        state,
                        f"{len(runs.docs)} run(s) finished before the comparison ended",
                    )
                )
        out = {
            "kind": "ladder",
            "mode": self.mode,
            "rungs": rungs,
            "selected": list(self.selected),
            "selected_spec": self.spec_with(),
            "base": list(self.base),
            "wall_s": time.perf_counter() - self.t0,
            "max_repeats": self.max_repeats,
            "budget_s": self.budget,
            "measure_s": self.measure_s,
            "runs": len(self.process_s),
            "run_s_mean": sum(self.process_s) / len(self.process_s) if self.process_s else None,
            "run_log": list(self.run_log),
            "stages": list(self.stages),
            "not_tried": list(self.not_tried),
            "cut_short": list(self.cut_short),
            "ties": list(self.ties),
            "method": f"each comparison: interleaved fresh-process runs, {MIN_REPEATS} to {self.max_repeats} a side; "
            f"paired t-interval on log mean-step-time ratios at {100 * VERDICT_CONFIDENCE:g}% overall "
            "confidence (Bonferroni over the looks); in the selecting ladder a candidate's first run is "
            f"a look too, and one {100 * (1 - EARLY_DROP):g}% or more slower than the best configuration, "
            "outside the prediction interval of that configuration's runs, is dropped there; a comparison "
            f"whose interval's upper end falls below {MIN_GAIN}x stops (at most {100 * (MIN_GAIN - 1):g}% "
            "faster: not worth keeping)",
        }
        out["helpful"] = list(self.selected)
        measured = self.final is not None and self.final.get("rung_status") == "applied"
        out.update(
            answer_lines(self.spec_with(), bool(self.selected), measured, len(self.not_tried) + len(self.cut_short))
        )
        if self.check is not None:
            out["check"] = self.check
            if self.check.get("passed") is False and not self.selected:
                out["callbacks_line"] = (
                    f"# the pick ({self.check['pick_spec']}) trained differently from the baseline (the check): "
                    "none is recommended"
                )
        filter_advice(rungs)
        out["moves"] = [r["bottleneck_moved"] for r in rungs if r.get("bottleneck_moved")]
        return out

    def publish(self) -> None:
        if self.on_update:
            self.on_update(self.document())

    # -- the two modes ----------------------------------------------------------------------------
    def set_baseline(self, runs: Runs) -> None:
        if not runs.docs:
            raise baseline_failed(runs)
        if not any(r["rung"] == "baseline" for r in self.rungs):
            label = "baseline" if not self.base else f"baseline ({self.base_spec})"
            self.rungs.insert(0, self.rung_doc(label, self.base_spec, runs, "applied", ""))
            self.base_runs = runs

    def finish(self) -> dict:
        """After the search: the check of the pick (it may fall back), the final measured comparison
        of the selected set with the baseline (the search's own interleaved comparison where it
        already made one), and the document."""
        check_ladder_pick(self)
        if self.selected and self.final_ready():
            # the selected set was kept in a comparison with the baseline itself, interleaved:
            # those runs are the final measurement (no second comparison of the same pair)
            self.final_from(*self.vs_baseline)  # type: ignore[misc]
        else:
            self.final_comparison()
        return self.document()

    def final_from(self, fresh: dict[str, Runs], ci: dict | None = None) -> None:
        """The final rung from interleaved runs of the baseline and the selected set (``ci``: their
        comparison at the confidence its looks used; computed here when not given)."""
        spec = self.spec_with()
        runs = fresh[spec]
        status = "applied" if runs.docs else "failed"
        self.final = self.rung_doc("selected: " + spec, spec, runs, status, runs.failures[-1] if runs.failures else "")
        self.final["speedup_vs_baseline"] = ci if ci is not None else compare(fresh[self.base_spec], runs)
        self.final["final"] = True

    def final_comparison(self) -> None:
        if not self.selected:
            assert self.base_runs is not None
            self.final = self.rung_doc(
                f"selected: {self.base_spec}",
                self.base_spec,
                self.base_runs,
                "applied",
                "nothing was kept: the baseline",
            )
            self.final["speedup_vs_baseline"] = None
            self.final["final"] = True
            return
        # fresh runs of both, interleaved (not the selected set's runs from its own comparison):
        # 3 a side while the budget lasts (it is sure of one a side where both ran 3 times in the
        # ladder: cut there, the interval pools every run), more only while too wide to call
        earlier, base = [r for s, r in self.best_runs.items() if s == self.spec_with()], self.base_runs
        self.final_first, self.best_runs, self.finalizing = self.final_runs(), {}, True
        fresh, ci, _ = self.compare_adaptive(self.base_spec, self.spec_with())
        self.final_from(fresh, pooled_final(ci, base, earlier, fresh[self.base_spec], fresh[self.spec_with()]))
