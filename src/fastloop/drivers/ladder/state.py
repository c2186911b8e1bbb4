"""The ladder's state and its one owner: the selected set, the best configuration's runs, the
rungs, the story (stages, what was not tried or cut short, ties), the comparisons that measure
them, and the document written from them. The searches read it and ask it to change through its
methods (:meth:`LadderState.keep`, :meth:`~LadderState.drop`, :meth:`~LadderState.record_rung`,
:meth:`~LadderState.note_stage`, ...); nothing else writes its lists. Its budget is a
:class:`~fastloop.drivers.ladder.budget.Budget` it holds.

Each comparison interleaves the two configurations in fresh processes, starts with 3 runs a side
(the best configuration's runs so far count again), stops when the answer is clear (kept,
slower, or at most 1% faster: ``MIN_GAIN``; a candidate whose first run is clearly slower than
the best's runs is dropped after that run: ``EARLY_DROP``) and otherwise adds runs up to
``max_repeats`` while the runs and the final comparison fit the budget. Each look uses a
stricter interval (Bonferroni over the looks). The ladder ends with :meth:`LadderState.finish`:
the selected set measured against the baseline, interleaved, and the document.

Example:
    >>> run = lambda s: {"step_s_all": [s] * 30}
    >>> few = lambda *xs: Runs("x", docs=[run(x) for x in xs])
    >>> cut = {"ratio": 1.8, "significant": False, "budget": True, "verdict": "no significant difference"}
    >>> out = pooled_final(cut, few(.040, .050, .045, .056), [few(.027, .028, .027)], few(.049, .042), few(.027, .028))
    >>> out["significant"], out["pooled_runs"], out["interleaved"]["ratio"]
    (True, {'baseline': 6, 'selected': 5}, 1.8)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from fastloop.compare import (
    VERDICT_CONFIDENCE,
    Runs,
    compare,
    measure_interleaved,
    merge_runs,
    step_rate_of,
    unsteady_note,
)
from fastloop.drivers.doctor import diagnose
from fastloop.drivers.ladder import wording
from fastloop.drivers.ladder.budget import Budget
from fastloop.drivers.ladder.candidates import join_specs
from fastloop.drivers.ladder.rung import Rung
from fastloop.drivers.pick_check import can_check, check_ladder_pick, predicted_check_s
from fastloop.errors import ConfigurationFailed, FastloopError, UserCodeError
from fastloop.measure.run_result import RunResult
from fastloop.speedups.base import name_of

__all__ = ["EARLY_DROP", "MIN_GAIN", "MIN_REPEATS", "LadderState", "baseline_failed", "pooled_final"]

MIN_REPEATS = 3
EARLY_DROP = 0.98
"""A candidate whose first run is at most this fast relative to the best configuration so far
(2% slower or worse), and outside the prediction interval of that configuration's runs, is
dropped after that one run."""
MIN_GAIN = 1.01
"""In the selecting ladder a comparison stops at a look once its interval's upper end is below
this ratio: the candidate can be at most 1% faster, so more runs could not make it worth keeping
(workers on a compiled GPT step ran 4 more processes, ~60 s, to learn 1.00x)."""

Comparison = tuple[dict[str, Runs], dict | None, int]
"""A comparison's runs by configuration, its interval (None: no verdict) and its runs a side."""


class LadderState:
    """The ladder under way: what it measured, kept and said. ``measure(target, spec, **kw)`` runs
    one configuration (a fresh process) and returns its document; ``budget`` times every run."""

    def __init__(
        self,
        target: str,
        *,
        steps: int,
        warmup: int,
        device: str,
        measure: Callable[..., dict],
        budget: Budget,
        max_repeats: int,
        mode: str,
        base: list[str] | None = None,
        measure_s: float | None = None,
        progress: Callable[[str], None] | None = None,
        on_update: Callable[[dict], None] | None = None,
        objective: str = "step",
    ) -> None:
        self.target, self.steps, self.warmup, self.device = target, steps, warmup, device
        self.objective = objective
        """What the ladder makes fast: ``step`` (the training step) or ``fit`` (the whole fit:
        :mod:`~fastloop.drivers.ladder.fit_objective`)."""
        self._fit: dict = {}
        """The fit objective's section of the document (its short fits, rungs and prediction)."""
        self._fit_reserve_s = 0.0
        """Seconds kept for the fit objective's fit still to run (the fit with the fit speedups)."""
        self.budget, self.max_repeats, self.mode = budget, max_repeats, mode
        self.min_repeats, self.min_gain = MIN_REPEATS, MIN_GAIN
        self.measure_s = measure_s
        """Seconds of steady steps each run was asked to measure (None: ``steps`` steps)."""
        self.base_spec = join_specs(list(base or []))
        self._base = list(base or [])
        """Speedups every configuration has (``--base``): the baseline is this set, not plain training."""
        self._measure = budget.timed(measure)
        self.untimed_measure = measure
        """The check's paired runs: not ladder runs, not in the budget's predictions of them."""
        self._check: dict | None = None
        """The check of the pick against the baseline (:mod:`fastloop.drivers.pick_check`)."""
        self._progress, self._on_update = progress, on_update
        self._selected: list[str] = []
        self._best_runs: dict[str, Runs] = {}
        """The best configuration's runs so far (and, during a comparison, its base's), by spec."""
        self._base_runs: Runs | None = None
        self._vs_baseline: tuple[dict[str, Runs], dict | None] | None = None
        """The latest comparison of the baseline with a kept configuration (fresh runs, its interval)."""
        self._rungs: list[Rung] = []
        self._stage = "baseline"
        self._stages: list[dict] = []
        """The search's story: each stage, the bottleneck then, and what it did."""
        self._not_tried: list[dict] = []
        """What the budget (or a reason) left unmeasured: name, stage, why (with the budget's arithmetic)."""
        self._cut_short: list[dict] = []
        """Comparisons measured but ended by the budget before their interval called them: name, stage, runs."""
        self._ties: list[dict] = []
        """Configurations the comparisons could not tell apart (the simpler kept)."""
        self._queued: list[tuple[int, str | None]] = []
        """Runs the search keeps for comparisons it has still planned in this stage (the first look
        of each: runs, configuration): a comparison is extended past its first look only when they
        still fit, so the budget measures every rung before it measures one rung longer."""
        self._final: Rung | None = None
        self._pending: dict[str, Runs] | None = None
        self._interrupted = False
        self._finalizing = False
        self._final_first = MIN_REPEATS  # the final comparison's runs a side, sure of the budget
        self._cut_by_budget = False
        """Set when the budget ended a comparison before its look (cleared at each comparison)."""

    # -- reading ---------------------------------------------------------------------------------
    @property
    def base(self) -> list[str]:
        return list(self._base)

    @property
    def selected(self) -> list[str]:
        """The kept speedups' specs, in the order they were kept."""
        return list(self._selected)

    @property
    def rungs(self) -> tuple[Rung, ...]:
        return tuple(self._rungs)

    @property
    def stage(self) -> str:
        """The stage the search is in (its last :meth:`note_stage`)."""
        return self._stage

    @property
    def check(self) -> dict | None:
        """The check of the pick against the baseline (None until it ran)."""
        return self._check

    def runs_of(self, spec: str) -> Runs | None:
        """The runs of ``spec`` the ladder holds (the best configuration's, or the baseline's)."""
        return self._best_runs.get(spec) or (self._base_runs if spec == self.base_spec else None)

    @property
    def base_runs(self) -> Runs | None:
        """The baseline's runs (None until it ran)."""
        return self._base_runs

    def spec_with(self, extra: list[str] | None = None) -> str:
        """The configuration: the base, the kept candidates, and ``extra``."""
        return join_specs(self._base + self._selected + list(extra or []))

    def spec_without(self, member: str) -> str:
        """The configuration with the kept ``member`` taken out (an ablation's candidate)."""
        return join_specs(self._base + [s for s in self._selected if s != member])

    def spec_replacing(self, current: str, new: str) -> str:
        """The configuration with the kept ``current`` replaced by ``new`` (another size)."""
        i = self._selected.index(current)
        return ",".join(self._base + self._selected[:i] + [new] + self._selected[i + 1 :])

    def best(self) -> Runs | None:
        """The best configuration's runs so far."""
        return self._best_runs.get(self.spec_with())

    def bottleneck(self) -> dict:
        """The doctor's diagnosis of the best configuration's runs ({} before any)."""
        runs = self.best()
        return diagnose(merge_runs(runs)) if runs is not None and runs.docs else {}

    def bottleneck_kind(self) -> str:
        """The bottleneck's first word (data-bound, compute-bound, ...; unknown before any run)."""
        return (self.bottleneck().get("bottleneck") or "unknown").split()[0]

    def first_look(self, base: str) -> int:
        """The runs of a comparison's first look against ``base``: one in the selecting ladder where
        the base has runs enough to judge a single run against (:meth:`compare_adaptive`'s early look)."""
        runs = self._best_runs.get(base)
        return 1 if self.mode != "cumulative" and runs is not None and len(runs.docs) >= MIN_REPEATS else MIN_REPEATS

    def final_ready(self) -> bool:
        """Has the selected set already been measured against the baseline, interleaved?"""
        spec = self.spec_with()
        return self._vs_baseline is not None and spec in self._vs_baseline[0] and self.base_spec in self._vs_baseline[0]

    # -- the budget --------------------------------------------------------------------------------
    def check_reserve_s(self) -> float:
        """Seconds kept for the check of the pick (its two paired runs, before the final comparison):
        0 once it ran, with nothing selected, or where the runs record no losses."""
        if self._check is not None or not self._selected or not can_check(self):
            return 0.0
        return predicted_check_s(self)

    def final_reserve_s(self) -> float:
        """The final comparison's first look, while a selected set still needs one."""
        if not self._selected or self.final_ready():
            return 0.0
        return self.budget.final_reserve_s(self.base_spec, self.spec_with(), self.min_repeats)

    def plan(self, runs: int, spec: str | None = None, final: bool = True, queued: bool = False) -> dict:
        """The budget's arithmetic for ``runs`` more runs (of ``spec``): their predicted seconds,
        the reserve kept for the final comparison (``final``) and, with ``queued``, for the first
        runs of the comparisons the search has still planned (:meth:`queue`), what is left."""
        reserve = (self.final_reserve_s() + self.check_reserve_s() if final else 0.0) + self._fit_reserve_s
        if queued:
            reserve += sum(n * self.budget.per_run_s(s) for n, s in self._queued)
        return self.budget.plan(runs, spec, reserve)

    def fits(self, runs: int, final: bool = True, spec: str | None = None, queued: bool = False) -> bool:
        """Do ``runs`` more runs (and, with ``final``, the final comparison after them; with
        ``queued``, the comparisons still planned) fit the budget?"""
        if self.budget.limit_s is None or not self.budget.runs:
            return True
        p = self.plan(runs, spec, final, queued)
        return p["predicted_s"] + p["reserve_s"] <= p["left_s"]

    def _run_fits(self, spec: str, fresh: dict[str, Runs]) -> bool:
        """Does one more run of ``spec`` fit the budget, with the final comparison after it? The
        final comparison itself always gets its first look (a selection must be measured)."""
        if self._finalizing and len(fresh[spec].docs) < self._final_first:
            return True
        reserve = 0.0 if self._finalizing else self.final_reserve_s() + self.check_reserve_s() + self._fit_reserve_s
        return self.budget.run_fits(spec, reserve)

    # -- measuring ---------------------------------------------------------------------------------
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
        """Interleaved runs of ``specs`` into ``fresh``; ``own``: the candidate speedup of the last
        spec, whose configuration is not run again once that speedup skipped itself or fell back in
        a run; ``told``: the step rate each spec's runs are told (a feed candidate: its base's)."""
        self._pending = fresh  # shown as "in progress" (or "interrupted") until its rung is written

        def done(spec: str, doc: dict) -> str:
            rec = own_record(doc, own) if own and spec == specs[-1] else None
            return wording.inactive_in_run(own, rec["status"]) if rec and rec["status"] != "applied" else ""

        def stop(spec: str) -> bool:
            if self._run_fits(spec, fresh):
                return False
            self._cut_by_budget = True
            return True

        measure_interleaved(
            self.target,
            specs,
            repeats,
            measure=self._measure,
            steps=self.steps,
            warmup=self.warmup,
            device=self.device,
            runs=fresh,
            progress=self._progress,
            on_run=self._publish,
            up_to=up_to,
            done=done,
            stop=stop,
            told=told,
            order=order,
        )
        self._pending = None

    def _looks(self, early: bool = False) -> list[int]:
        looks = sorted({MIN_REPEATS, self.max_repeats}) if self.max_repeats > MIN_REPEATS else [MIN_REPEATS]
        return [1] + looks if early else looks

    def compare_adaptive(self, base: str, cand: str, own: str | None = None, tell_rate: bool = False) -> Comparison:
        """Interleaved runs of base and candidate until the answer is clear or the budget is spent.

        When the base's runs are already measured (the best configuration so far), the selecting
        ladder looks once after the candidate's first run: a candidate slower than
        ``EARLY_DROP`` whose one run lies outside the prediction interval of the base's runs is
        dropped there (it can only be dropped early, never kept)."""
        fresh: dict[str, Runs] = {}
        order: list[str] = []
        if base in self._best_runs:  # the best configuration's runs so far count again
            fresh[base] = self._best_runs[base]
        reused = len(fresh[base].docs) if base in fresh else 0
        early = self.mode != "cumulative" and len(fresh[base].docs) >= MIN_REPEATS if base in fresh else False
        looks = self._looks(early)
        confidence = 1 - (1 - VERDICT_CONFIDENCE) / len(looks)
        ci = None
        self._cut_by_budget = False
        for i, n in enumerate(looks):
            needed = sum(max(0, n - len(fresh[k].docs)) if k in fresh else n for k in (base, cand))
            if i > 0 and ci is not None and not self.fits(needed, queued=True):
                ci["budget"] = True  # the next look's runs and the final comparison would not fit
                break
            told = {cand: step_rate_of(self._best_runs.get(base))} if tell_rate else None
            self.measure_runs([base, cand], n, fresh, up_to=n, own=own, order=order, told=told)
            self._best_runs[base] = fresh[base]
            ci, stop = self._look(fresh[base], fresh[cand], n, confidence, last=i == len(looks) - 1)
            if stop:
                break
        note_run_order(ci, order, base, reused, fresh[base], fresh[cand])
        return fresh, ci, n

    def _look(self, base: Runs, cand: Runs, n: int, confidence: float, last: bool) -> tuple[dict | None, bool]:
        """One look of :meth:`compare_adaptive` at ``n`` runs a side: its interval, and whether the
        comparison stops there."""
        if self._cut_by_budget:  # the budget ended this look early: decide on what ran
            ci = compare(base, cand, confidence=confidence) if cand.docs else None
            if ci is not None:
                ci["budget"] = True
            return ci, True
        if n == 1:  # the early look: one run of the candidate against the base's runs
            ci = compare(base, cand, confidence=confidence, one_run=True)
            return ci, bool(ci is None or cand.settled or (ci["significant"] and ci["ratio"] <= EARLY_DROP))
        ci = compare(base, cand, confidence=confidence)
        if ci is None or ci["significant"] or cand.settled or last:
            return ci, True
        if ci["ci_high"] is not None and ci["ci_high"] < 1.0:  # clearly slower: no point measuring more
            return ci, True
        if self.mode != "cumulative" and ci["ci_high"] is not None and ci["ci_high"] < MIN_GAIN:
            ci["futile"] = True  # at most 1% faster: no number of runs makes it worth keeping
            return ci, True
        return ci, self.budget.spent()

    # -- changing: the only writers of the state -------------------------------------------------
    def set_baseline(self, runs: Runs) -> None:
        """The baseline's runs (the first rung); a baseline that did not run ends the ladder."""
        if not runs.docs:
            raise baseline_failed(runs)
        if not any(r.label == "baseline" for r in self._rungs):
            label = wording.baseline_label(self.base_spec, bool(self._base))
            self._rungs.insert(0, Rung.of_runs(label, self.base_spec, runs, "applied"))
            self._base_runs = runs

    def start_from_baseline(self) -> None:
        """The baseline is the best configuration so far (the search begins)."""
        assert self._base_runs is not None, "set_baseline first"
        self._best_runs = {self.base_spec: self._base_runs}

    def note_stage(self, stage: str, action: str) -> None:
        """A line of the story: the stage, the bottleneck of the best configuration then, what was done."""
        self._stage = stage
        b = self.bottleneck()
        self._stages.append(
            {
                "stage": stage,
                "configuration": self.spec_with(),
                "bottleneck": b.get("bottleneck"),
                "evidence": b.get("evidence"),
                "action": action,
            }
        )
        self._publish()

    def record_rung(self, rung: Rung) -> None:
        self._rungs.append(rung)
        self._publish()

    def extend_last_decision(self, text: str) -> None:
        """Add ``text`` to the last rung's decision (it was measured again: the reader is told so)."""
        last = self._rungs[-1]
        self._rungs[-1] = replace(last, decision=(last.decision or "") + text)

    def keep(self, specs: list[str], runs: Runs, *, vs_spec: str, vs_runs: Runs, ci: dict | None) -> None:
        """Keep ``specs`` (measured in ``runs`` against ``vs_spec``'s ``vs_runs``, interval ``ci``):
        their configuration is the best now; against the baseline, it is the final comparison's too."""
        self._selected.extend(specs)
        self._best_runs = {self.spec_with(): runs}  # members that did nothing change nothing: the same runs
        if vs_spec == self.base_spec:
            self._vs_baseline = ({self.base_spec: vs_runs, self.spec_with(): runs}, ci)

    def drop(self, member: str, runs: Runs) -> None:
        """Take the kept ``member`` out (not missed): the configuration without it (``runs``) is the best."""
        without = self.spec_without(member)
        self._selected = [s for s in self._selected if s != member]
        self._best_runs = {without: runs}
        if without == self.base_spec:
            self._vs_baseline = None

    def replace_member(self, current: str, new: str, runs: Runs) -> None:
        """``new`` (another size) in place of the kept ``current``: its configuration (``runs``) is the best."""
        spec = self.spec_replacing(current, new)
        self._selected[self._selected.index(current)] = new
        self._best_runs = {spec: runs}

    def pin(self, spec: str, pinned: str, trained_with: Callable[[dict], bool]) -> None:
        """The kept self-sized ``spec`` as ``pinned`` (``NAME:N``): the best configuration's runs that
        trained with that size (``trained_with``) stay its runs; its run costs carry over."""
        old = self.spec_with()
        self._selected[self._selected.index(spec)] = pinned
        new = self.spec_with()
        runs = self._best_runs.pop(old, None)
        if runs is not None:
            same = [d for d in runs.docs if trained_with(d)]
            if same:
                self._best_runs[new] = Runs(new, same, list(runs.failures))
        self.budget.carry_costs(old, new)

    def not_tried(self, names: list[str], why: str = "budget", plan: dict | None = None) -> None:
        """List what was not measured, and why; a budget entry carries the arithmetic (the
        prediction, the reserve for the final comparison and the seconds that were left)."""
        for n in names:
            if not any(t["name"] == n for t in self._not_tried):
                self._not_tried.append({"name": n, "stage": self._stage, "why": why, **(plan or {})})

    def cut_short(self, what: str, runs: int) -> None:
        """A comparison that was measured, but ended by the budget before its interval could call it."""
        self._cut_short.append({"name": what, "stage": self._stage, "runs": runs})

    def tie(self, kept: str, other: str, ci: dict) -> None:
        """Two configurations the comparison could not tell apart: the simpler, ``kept``, was kept."""
        self._ties.append(
            {
                "kept": kept,
                "other": other,
                "ratio": ci["ratio"],
                "ci_low": ci.get("ci_low"),
                "ci_high": ci.get("ci_high"),
                "why": wording.TIE_WHY,
                "negligible": bool(ci.get("negligible")),
            }
        )

    def untie(self, other: str) -> None:
        """The ties that left ``other`` out no longer decide anything (it was measured again)."""
        self._ties = [t for t in self._ties if t["other"] != other]

    def queue(self, planned: list[tuple[int, str | None]]) -> None:
        """The comparisons the search still plans in this stage after the current one: each one's
        first look (runs, configuration; None: the median run), kept out of the current's extensions."""
        self._queued = list(planned)

    def queue_runs(self, comparisons: int, runs_each: int | None = None) -> None:
        """:meth:`queue` ``comparisons`` comparisons of ``runs_each`` runs each (default 3)."""
        self.queue([(runs_each or self.min_repeats, None)] * max(0, comparisons))

    def say(self, text: str) -> None:
        """Show ``text`` as the ladder's progress."""
        if self._progress:
            self._progress(text)

    def record_check(self, check: dict) -> None:
        """The check of the pick ran (:func:`~fastloop.drivers.pick_check.check_ladder_pick`)."""
        self._check = check
        self._publish()

    def reserve_for_fits(self, seconds: float) -> None:
        """Keep ``seconds`` of the budget for the fit objective's fit still to run while the step's
        search plans its runs (0: none left to run)."""
        self._fit_reserve_s = max(0.0, seconds)

    def record_fit(self, section: dict) -> None:
        """The fit objective's section of the document (:mod:`~fastloop.drivers.ladder.fit_objective`)."""
        self._fit = dict(section)
        self._publish()

    def fall_back(self, kept: set[str]) -> None:
        """The check refused the pick: keep only the speedups named ``kept`` (the configuration that
        passed, or none: the baseline)."""
        self._selected = [s for s in self._selected if name_of(s) in kept]

    # -- the end ---------------------------------------------------------------------------------
    def finish(self) -> dict:
        """The ladder's end: the pick checked against the baseline (it may fall back), the selected
        set measured against the baseline (the search's own interleaved comparison where it made
        one, else a final comparison), and the document."""
        check_ladder_pick(self)  # before the final comparison: a pick that trains differently falls back
        if self._selected and self.final_ready():
            # the selected set was kept in a comparison with the baseline itself, interleaved:
            # those runs are the final measurement (no second comparison of the same pair)
            assert self._vs_baseline is not None
            self._final_from(*self._vs_baseline)
        else:
            self._final_comparison()
        return self.document()

    def interrupt(self) -> dict:
        """The document of what finished, after Ctrl-C (the comparison under way shown as interrupted)."""
        self._interrupted = True
        doc = self.document()
        doc["interrupted"] = True
        return doc

    def _final_from(self, fresh: dict[str, Runs], ci: dict | None = None) -> None:
        """The final rung from interleaved runs of the baseline and the selected set (``ci``: their
        comparison at the confidence its looks used; computed here when not given)."""
        spec = self.spec_with()
        runs = fresh[spec]
        status = "applied" if runs.docs else "failed"
        rung = Rung.of_runs("selected: " + spec, spec, runs, status, runs.failures[-1] if runs.failures else "")
        vs_baseline = ci if ci is not None else compare(fresh[self.base_spec], runs)
        self._final = replace(rung, final=True, speedup_vs_baseline=vs_baseline)

    def _final_comparison(self) -> None:
        if not self._selected:
            assert self._base_runs is not None
            rung = Rung.of_runs(
                f"selected: {self.base_spec}", self.base_spec, self._base_runs, "applied", wording.NOTHING_KEPT
            )
            self._final = replace(rung, final=True, speedup_vs_baseline=None)
            return
        # fresh runs of both, interleaved (not the selected set's runs from its own comparison):
        # 3 a side while the budget lasts (it is sure of one a side where both ran 3 times in the
        # ladder: cut there, the interval pools every run), more only while too wide to call
        spec = self.spec_with()
        earlier, base = [r for s, r in self._best_runs.items() if s == spec], self._base_runs
        assert base is not None
        self._final_first = self.budget.final_runs(self.base_spec, spec, self.min_repeats)
        self._best_runs, self._finalizing = {}, True
        fresh, ci, _ = self.compare_adaptive(self.base_spec, spec)
        self._final_from(fresh, pooled_final(ci, base, earlier, fresh[self.base_spec], fresh[spec]))

    def document(self) -> dict:
        """The ladder's document (the JSON contract's ``ladder``), without the env stamp."""
        rungs = list(self._rungs)
        base = self._base_runs
        if (
            base is not None
            and rungs
            and rungs[0].label.startswith("baseline")
            and rungs[0].measured.get("repeats") != len(base.docs)
        ):  # topped up by later comparisons
            rungs[0] = Rung.of_runs(rungs[0].label, self.base_spec, base, "applied")
        if self._final is not None:
            rungs.append(self._final)
        for spec, runs in (self._pending or {}).items():  # the comparison under way
            if runs.docs:
                state = "interrupted" if self._interrupted else "in progress"
                label, reason = wording.in_progress(state, spec, len(runs.docs))
                rungs.append(Rung.of_runs(label, spec, runs, state, reason))
        docs = [r.to_dict() for r in rungs]
        wording.filter_advice(docs, [r.moved for r in rungs])
        measured = self._final is not None and self._final.status == "applied"
        not_finished = len(self._not_tried) + len(self._cut_short)
        return {
            "kind": "ladder",
            "mode": self.mode,
            "rungs": docs,
            "selected": list(self._selected),
            "selected_spec": self.spec_with(),
            "base": list(self._base),
            "wall_s": self.budget.elapsed(),
            "max_repeats": self.max_repeats,
            "budget_s": self.budget.limit_s,
            "measure_s": self.measure_s,
            "runs": self.budget.runs,
            "run_s_mean": self.budget.run_s_mean(),
            "run_log": self.budget.run_log,
            "stages": list(self._stages),
            "not_tried": list(self._not_tried),
            "cut_short": list(self._cut_short),
            "ties": list(self._ties),
            "method": wording.method(MIN_REPEATS, self.max_repeats, EARLY_DROP, MIN_GAIN),
            "helpful": list(self._selected),
            **wording.answer_lines(self.spec_with(), bool(self._selected), measured, not_finished),
            "moves": [r["bottleneck_moved"] for r in docs if r.get("bottleneck_moved")],
            **self._check_section(),
            **({"objective": self.objective, "fit": dict(self._fit)} if self.objective != "step" else {}),
        }

    def _check_section(self) -> dict:
        if self._check is None:
            return {}
        out: dict = {"check": self._check}
        if self._check.get("passed") is False and not self._selected:
            out["callbacks_line"] = wording.pick_refused(self._check["pick_spec"])
        return out

    def _publish(self) -> None:
        if self._on_update:
            self._on_update(self.document())


def own_record(doc: dict, spec: str) -> dict | None:
    """The run's own record of the speedup ``spec`` names (applied, skipped or fallback, and why)."""
    name = name_of(spec)
    return next((r.to_dict() for r in RunResult.from_dict(doc).speedups if r.name == name), None)


def baseline_failed(runs: Runs) -> Exception:
    """The error a failed baseline ends the ladder with: bad input (2), the user's code (1), or the process."""
    rc = runs.returncodes[-1] if runs.returncodes else None
    message = runs.failures[-1] if runs.failures else "the baseline did not run"
    if rc == 2:
        return FastloopError(message.split("failed in its process: ", 1)[-1])
    if rc == 1:
        return UserCodeError(
            f"the baseline configuration failed, so there is nothing to compare against:\n"
            f"{runs.details[-1].strip() if runs.details else message}"
        )
    return ConfigurationFailed(message, rc)


def pooled_final(ci: dict | None, base: Runs, earlier: list[Runs], fresh_base: Runs, fresh_sel: Runs) -> dict | None:
    """The final comparison's interval when the budget cut it before it could call the selected set
    against the baseline: every run of both configurations in the ladder pooled (``base``: the
    baseline's earlier runs; ``earlier``: the selected set's from its own comparisons), a Welch
    interval (those runs were not all interleaved with each other), the cut interleaved one kept
    beside it. Else ``ci`` as it is."""
    if ci is None or not ci.get("budget") or ci.get("significant"):
        return ci
    pooled_base = Runs(fresh_base.spec, docs=([] if base is fresh_base else base.docs) + fresh_base.docs)
    pooled_sel = Runs(fresh_sel.spec, docs=[d for r in earlier if r is not fresh_sel for d in r.docs] + fresh_sel.docs)
    pooled = compare(pooled_base, pooled_sel, confidence=ci.get("confidence") or VERDICT_CONFIDENCE, paired=False)
    if pooled is None or pooled.get("too_few"):
        return ci
    pooled["verdict"] = wording.pooled_verdict(pooled["verdict"], ci.get("ratio", 0))
    return {
        **pooled,
        "pooled_runs": {"baseline": len(pooled_base.docs), "selected": len(pooled_sel.docs)},
        "interleaved": ci,
        "budget": True,
    }


def note_run_order(ci: dict | None, order: list[str], base: str, reused: int, base_runs: Runs, cand_runs: Runs) -> None:
    """Into a comparison's ``ci``: the order its runs ran in (``run_order``: A its base, B the
    candidate; counterbalanced pairs), how many of the base's runs came from earlier comparisons,
    and in the verdict the runs that never reached a steady rate."""
    if ci is None:
        return
    ci["run_order"] = ["A" if spec == base else "B" for spec in order]
    ci["base_runs_reused"] = reused
    ci["verdict"] = ci.get("verdict", "") + unsteady_note(base_runs, cand_runs)
