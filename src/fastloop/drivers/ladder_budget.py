"""The ladder's budget: what each run cost, what more runs are predicted to cost, and whether
they fit with the reserve kept for the final comparison (a mixin of the ladder's state)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from fastloop.compare import Runs

__all__ = ["BudgetPlan"]


class BudgetPlan:
    """The budget's arithmetic over the ladder's runs. The ladder sets ``budget``, ``t0``,
    ``process_s``, ``spec_s``, ``run_log``, ``selected``, ``min_repeats``, ``queued_runs`` and
    ``finalizing``, and defines ``final_ready()``."""

    budget: float | None
    t0: float
    process_s: list[float]
    spec_s: dict[str, list[float]]
    run_log: list[dict]
    selected: list[str]
    min_repeats: int
    queued_runs: int
    finalizing: bool

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

    def per_run_s(self, spec: str | None = None) -> float:
        """The predicted cost of one more run of ``spec``: the mean of its own runs, else of all runs."""
        own = self.spec_s.get(spec or "")
        runs = own or self.process_s
        return sum(runs) / len(runs) if runs else 0.0

    def plan(self, runs: int, spec: str | None = None, final: bool = True, queued: bool = False) -> dict:
        """The budget's arithmetic for ``runs`` more runs (of ``spec``): their predicted seconds,
        the reserve kept for the final comparison (``final``) and, with ``queued``, for the first
        runs of the comparisons the search has still planned (:attr:`queued_runs`), what is left."""
        per_run = self.per_run_s(spec)
        reserve_runs = 2 * self.min_repeats if final and self.selected and not self.final_ready() else 0
        if queued:
            reserve_runs += self.queued_runs
        left = None if self.budget is None else self.budget - self.elapsed()
        return {"predicted_s": round(per_run * runs, 1), "reserve_s": round(self.per_run_s() * reserve_runs, 1),
                "left_s": None if left is None else round(left, 1)}

    def fits(self, runs: int, final: bool = True, spec: str | None = None, queued: bool = False) -> bool:
        """Do ``runs`` more runs (and, with ``final``, the final comparison after them; with
        ``queued``, the comparisons still planned) fit the budget?"""
        if self.budget is None or not self.process_s:
            return True
        p = self.plan(runs, spec, final, queued)
        return p["predicted_s"] + p["reserve_s"] <= p["left_s"]

    def run_fits(self, spec: str, fresh: dict[str, Runs]) -> bool:
        """Does one more run of ``spec`` fit the budget, with the final comparison after it? The
        final comparison itself always gets its first 3 runs a side (a selection must be measured)."""
        if self.budget is None or not self.process_s:
            return True
        if self.finalizing and len(fresh[spec].docs) < self.min_repeats:
            return True
        mean = sum(self.process_s) / len(self.process_s)
        own = self.spec_s.get(spec)
        per_run = sum(own) / len(own) if own else mean
        reserve = 0 if self.finalizing else (2 * self.min_repeats * mean if self.selected and not self.final_ready() else 0)
        return self.elapsed() + per_run + reserve <= self.budget
