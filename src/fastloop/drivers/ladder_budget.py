"""The ladder's budget: what each run cost, what more runs are predicted to cost, and whether
they fit with the reserve kept for the final comparison (a mixin of the ladder's state)."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

from fastloop.compare import Runs
from fastloop.drivers.pick_check import can_check, predicted_check_s
from fastloop.speedups import REGISTRY
from fastloop.speedups.base import name_of

__all__ = ["BudgetPlan"]


class BudgetPlan:
    """The budget's arithmetic over the ladder's runs. The ladder sets ``budget``, ``t0``,
    ``process_s``, ``spec_s``, ``spec_warm``, ``base_spec``, ``run_log``, ``selected``,
    ``min_repeats``, ``queued``, ``finalizing`` and ``check``, and defines ``final_ready()`` and
    ``spec_with()``.

    A run's predicted cost is what its configuration's runs cost once warm: the first compiled run
    of a configuration fills the compiler's cache (62.9 s of warm-up against 8.5-17 s a run for a
    ResNet-50 on an H100), which its later runs do not pay again. A configuration not yet run is
    predicted at the median warm run, plus that one-off where it compiles a graph no run has
    compiled yet (another precision or layout: the cache misses)."""

    budget: float | None
    t0: float
    process_s: list[float]
    spec_s: dict[str, list[float]]
    spec_warm: dict[str, list[float | None]]
    base_spec: str
    run_log: list[dict]
    selected: list[str]
    min_repeats: int
    queued: list[tuple[int, str | None]]
    finalizing: bool
    final_first: int
    check: dict | None

    def final_ready(self) -> bool:  # pragma: no cover - the ladder's
        raise NotImplementedError

    def timed(self, measure: Callable[..., dict]) -> Callable[..., dict]:
        """``measure`` that logs each run: its wall time, its cost for planning (without the fork
        server's one-off start), throughput, compile and measured seconds."""

        def timed(*args: Any, **kwargs: Any) -> dict:  # measure(target, spec, ...)
            t = time.perf_counter()
            doc: dict | None = None
            spec = args[1] if len(args) > 1 else kwargs.get("spec")
            try:
                doc = measure(*args, **kwargs)
                return doc
            finally:
                wall = time.perf_counter() - t
                # a run's cost for planning: its own process, not the one-off wait for the fork
                # server's imports that the first run pays (5.7 s against 2.2 s on 2 cores)
                startup = ((doc or {}).get("timings") or {}).get("startup_s") or 0.0 if isinstance(doc, dict) else 0.0
                self.process_s.append(max(0.0, wall - startup))
                self.spec_s.setdefault(str(spec), []).append(self.process_s[-1])
                self.spec_warm.setdefault(str(spec), []).append(
                    doc.get("warmup_overhead_s") if isinstance(doc, dict) else None
                )
                entry: dict = {"spec": spec, "s": round(wall, 3)}
                if startup:
                    entry["startup_s"] = round(startup, 3)
                entry["elapsed_s"] = round(self.elapsed(), 1)
                if isinstance(doc, dict):
                    entry["throughput"] = doc.get("throughput")
                    entry["compile_s"] = doc.get("compile_s")
                    entry["profile_s"] = (doc.get("gpu_profile") or {}).get("profile_s")
                    entry["measured_s"] = doc.get("measured_s")
                    entry["steps"] = doc.get("steps")
                self.run_log.append(entry)

        return timed

    def elapsed(self) -> float:
        return time.perf_counter() - self.t0

    def warm_costs(self, spec: str) -> list[float]:
        """``spec``'s run costs with each run's warm-up cost above the configuration's least (a
        cold compiler cache, paid once) taken out."""
        costs, warm = self.spec_s.get(spec, []), self.spec_warm.get(spec, [])
        known = [w for w in warm if w is not None]
        least = min(known) if known else 0.0
        return [c - max(0.0, (w if w is not None else least) - least) for c, w in zip(costs, warm)]

    def one_off_s(self) -> float:
        """The largest warm-up cost a configuration paid once (its first run against its least):
        what a graph not compiled before costs on top of a warm run."""
        out = 0.0
        for warm in self.spec_warm.values():
            known = [w for w in warm if w is not None]
            if len(known) >= 2:
                out = max(out, known[0] - min(known))
        return out

    @staticmethod
    def graph_key(spec: str) -> frozenset[str] | None:
        """The speedups of ``spec`` that shape a compiled graph (the model's changes and the math
        precision); None when nothing in it compiles."""
        names = {name_of(s) for s in spec.split(",")} & set(REGISTRY)
        key = frozenset(n for n in names if REGISTRY[n].changes == "model" or REGISTRY[n].math_dtype)
        return key if any(REGISTRY[n].compiles for n in key) else None

    def per_run_s(self, spec: str | None = None) -> float:
        """The predicted cost of one more run of ``spec``: its own runs once warm; a configuration
        not yet run: the median warm run of all, plus :meth:`one_off_s` where it compiles a graph
        that no run has compiled."""
        own = self.warm_costs(spec) if spec else []
        if own:
            return sum(own) / len(own)
        warm = [c for s in self.spec_s for c in self.warm_costs(s)]
        if not warm:
            return 0.0
        return statistics.median(warm) + self.cold_compile_s(spec)

    def cold_compile_s(self, spec: str | None) -> float:
        """What a run of ``spec`` pays once for a compiled graph no run has compiled (0 when its
        graph was compiled, it compiles nothing, or it has run)."""
        key = self.graph_key(spec) if spec and spec not in self.spec_s else None
        cold = key is not None and all(self.graph_key(s) != key for s in self.spec_s)
        return self.one_off_s() if cold else 0.0

    def final_runs(self) -> int:
        """The final comparison's first look, runs a side (what the budget reserves for it): one
        where the baseline and the selected set have each run ``min_repeats`` times in the ladder
        already (a final comparison the budget ends there pools those runs:
        :func:`~fastloop.drivers.ladder_report.pooled_final`), else ``min_repeats``. On a ResNet-50
        whose ablations each compile a new graph, the two runs a side saved are the last ablation."""
        have = min(len(self.spec_s.get(self.base_spec, [])), len(self.spec_s.get(self.spec_with(), [])))
        return 1 if have >= self.min_repeats else self.min_repeats

    def final_run_s(self) -> float:
        """One run a side of the final comparison: the baseline's and the selected set's."""
        return self.per_run_s(self.base_spec) + self.per_run_s(self.spec_with())

    def spec_with(self, extra: list[str] | None = None) -> str:  # pragma: no cover - the ladder's
        raise NotImplementedError

    def plan(self, runs: int, spec: str | None = None, final: bool = True, queued: bool = False) -> dict:
        """The budget's arithmetic for ``runs`` more runs (of ``spec``): their predicted seconds,
        the reserve kept for the check of the pick and the final comparison (``final``) and, with
        ``queued``, for the first runs of the comparisons the search has still planned
        (:attr:`queued`: runs, configuration), what is left."""
        per_run = self.per_run_s(spec)
        reserve = self.final_runs() * self.final_run_s() if final and self.selected and not self.final_ready() else 0.0
        reserve += self.check_reserve_s() if final else 0.0
        if queued:
            reserve += sum(n * self.per_run_s(spec) for n, spec in self.queued)
        left = None if self.budget is None else self.budget - self.elapsed()
        out = {
            "predicted_s": round(per_run * runs, 1),
            "reserve_s": round(reserve, 1),
            "left_s": None if left is None else round(left, 1),
        }
        if self.cold_compile_s(spec):
            out["cold_compile_s"] = round(self.cold_compile_s(spec), 1)
        return out

    def fits(self, runs: int, final: bool = True, spec: str | None = None, queued: bool = False) -> bool:
        """Do ``runs`` more runs (and, with ``final``, the final comparison after them; with
        ``queued``, the comparisons still planned) fit the budget?"""
        if self.budget is None or not self.process_s:
            return True
        p = self.plan(runs, spec, final, queued)
        return p["predicted_s"] + p["reserve_s"] <= p["left_s"]

    def run_fits(self, spec: str, fresh: dict[str, Runs]) -> bool:
        """Does one more run of ``spec`` fit the budget, with the final comparison after it? The
        final comparison itself always gets its first look (:meth:`final_runs`: a selection must be measured)."""
        if self.budget is None or not self.process_s:
            return True
        if self.finalizing and len(fresh[spec].docs) < self.final_first:
            return True
        reserve = (
            0.0
            if self.finalizing or not self.selected or self.final_ready()
            else self.final_runs() * self.final_run_s()
        )
        reserve += 0.0 if self.finalizing else self.check_reserve_s()
        return self.elapsed() + self.per_run_s(spec) + reserve <= self.budget

    def check_reserve_s(self) -> float:
        """Seconds kept for the check of the pick (its two paired runs, before the final
        comparison): 0 once it ran, with nothing selected, or where the runs record no losses."""
        if self.check is not None or not self.selected or not can_check(self):  # type: ignore[arg-type]
            return 0.0
        return predicted_check_s(self)  # type: ignore[arg-type]
