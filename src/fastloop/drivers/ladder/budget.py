"""The ladder's budget: what each run cost, what more runs are predicted to cost, and whether they
fit in the seconds left with a reserve the caller names (the ladder's state reserves the final
comparison's runs and the first looks of the comparisons its search still plans).

A run's predicted cost is what its configuration's runs cost once warm: the first compiled run of a
configuration fills the compiler's cache (62.9 s of warm-up against 8.5-17 s a run for a ResNet-50 on
an H100), which its later runs do not pay again. A configuration not yet run is predicted at the
median warm run, plus that one-off where it compiles a graph no run has compiled yet (another
precision or layout: the cache misses).

Example:
    >>> b = Budget(60.0)
    >>> b.record("none", 2.0, 0.5); b.record("none", 3.0, 0.5)
    >>> b.per_run_s("none"), b.per_run_s("bf16")
    (2.5, 2.5)
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

from fastloop.speedups import REGISTRY
from fastloop.speedups.base import name_of

__all__ = ["Budget"]


class Budget:
    """The seconds a whole ladder may take (``limit_s``; None: no limit) and the cost of every run
    so far, measured through :meth:`timed`. Its clock starts when it is made."""

    def __init__(self, limit_s: float | None) -> None:
        self.limit_s = limit_s
        self.t0 = time.perf_counter()
        self._process_s: list[float] = []
        """Each run's cost for planning: its wall time less the fork server's one-off start."""
        self._spec_s: dict[str, list[float]] = {}
        """Each configuration's run costs (a compiled configuration's runs cost more)."""
        self._spec_warm: dict[str, list[float | None]] = {}
        """Each configuration's runs' warm-up seconds beyond their steps (a cold compiler cache's
        one-off shows here): a run is predicted once warm."""
        self._run_log: list[dict] = []

    # -- what the runs cost ----------------------------------------------------------------------
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
                self._log(spec, time.perf_counter() - t, doc)

        return timed

    def _log(self, spec: str | None, wall: float, doc: dict | None) -> None:
        # a run's cost for planning: its own process, not the one-off wait for the fork server's
        # imports that the first run pays (5.7 s against 2.2 s on 2 cores)
        startup = ((doc or {}).get("timings") or {}).get("startup_s") or 0.0 if isinstance(doc, dict) else 0.0
        self.record(
            str(spec), max(0.0, wall - startup), doc.get("warmup_overhead_s") if isinstance(doc, dict) else None
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
        self._run_log.append(entry)

    def record(self, spec: str, cost_s: float, warmup_overhead_s: float | None) -> None:
        """One run of ``spec`` that cost ``cost_s`` seconds, of which ``warmup_overhead_s`` warming up."""
        self._process_s.append(cost_s)
        self._spec_s.setdefault(spec, []).append(cost_s)
        self._spec_warm.setdefault(spec, []).append(warmup_overhead_s)

    def carry_costs(self, old: str, new: str) -> None:
        """``new`` is ``old`` under another name (a size pinned): its run costs count for it."""
        for costs in (self._spec_s, self._spec_warm):
            if old in costs:
                costs.setdefault(new, list(costs[old]))

    @property
    def runs(self) -> int:
        return len(self._process_s)

    def runs_of(self, spec: str) -> int:
        return len(self._spec_s.get(spec, []))

    def run_s_mean(self) -> float | None:
        return sum(self._process_s) / len(self._process_s) if self._process_s else None

    @property
    def run_log(self) -> list[dict]:
        """Each run in order: its configuration, wall seconds, and (where the run says) its compile
        and GPU-profile seconds."""
        return list(self._run_log)

    def elapsed(self) -> float:
        return time.perf_counter() - self.t0

    def spent(self) -> bool:
        """Has the whole budget gone (no reserve counted)?"""
        return self.limit_s is not None and self.elapsed() > self.limit_s

    # -- predictions ------------------------------------------------------------------------------
    def warm_costs(self, spec: str) -> list[float]:
        """``spec``'s run costs with each run's warm-up cost above the configuration's least (a
        cold compiler cache, paid once) taken out."""
        costs, warm = self._spec_s.get(spec, []), self._spec_warm.get(spec, [])
        known = [w for w in warm if w is not None]
        least = min(known) if known else 0.0
        return [c - max(0.0, (w if w is not None else least) - least) for c, w in zip(costs, warm)]

    def one_off_s(self) -> float:
        """The largest warm-up cost a configuration paid once (its first run against its least):
        what a graph not compiled before costs on top of a warm run."""
        out = 0.0
        for warm in self._spec_warm.values():
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
        warm = [c for s in self._spec_s for c in self.warm_costs(s)]
        if not warm:
            return 0.0
        return statistics.median(warm) + self.cold_compile_s(spec)

    def cold_compile_s(self, spec: str | None) -> float:
        """What a run of ``spec`` pays once for a compiled graph no run has compiled (0 when its
        graph was compiled, it compiles nothing, or it has run)."""
        key = self.graph_key(spec) if spec and spec not in self._spec_s else None
        cold = key is not None and all(self.graph_key(s) != key for s in self._spec_s)
        return self.one_off_s() if cold else 0.0

    def final_runs(self, base_spec: str, selected_spec: str, min_repeats: int) -> int:
        """The final comparison's first look, runs a side (what the budget reserves for it): one
        where the baseline and the selected set have each run ``min_repeats`` times in the ladder
        already (a final comparison the budget ends there pools those runs), else ``min_repeats``.
        On a ResNet-50 whose ablations each compile a new graph, the two runs a side saved are the
        last ablation."""
        have = min(self.runs_of(base_spec), self.runs_of(selected_spec))
        return 1 if have >= min_repeats else min_repeats

    def final_reserve_s(self, base_spec: str, selected_spec: str, min_repeats: int) -> float:
        """The seconds the final comparison's first look takes: its runs a side, each side's run."""
        pair = self.per_run_s(base_spec) + self.per_run_s(selected_spec)
        return self.final_runs(base_spec, selected_spec, min_repeats) * pair

    # -- what fits ----------------------------------------------------------------------------------
    def plan(self, runs: int, spec: str | None, reserve_s: float) -> dict:
        """The budget's arithmetic for ``runs`` more runs (of ``spec``): their predicted seconds,
        the reserve kept after them, what is left (and a new compiled graph's cold compile)."""
        left = None if self.limit_s is None else self.limit_s - self.elapsed()
        out = {
            "predicted_s": round(self.per_run_s(spec) * runs, 1),
            "reserve_s": round(reserve_s, 1),
            "left_s": None if left is None else round(left, 1),
        }
        if self.cold_compile_s(spec):
            out["cold_compile_s"] = round(self.cold_compile_s(spec), 1)
        return out

    def fits(self, runs: int, spec: str | None, reserve_s: float) -> bool:
        """Do ``runs`` more runs of ``spec`` fit, with ``reserve_s`` kept after them? (Before any
        run, or without a limit, everything fits: nothing predicts a cost yet.)"""
        if self.limit_s is None or not self._process_s:
            return True
        p = self.plan(runs, spec, reserve_s)
        return p["predicted_s"] + p["reserve_s"] <= p["left_s"]

    def run_fits(self, spec: str, reserve_s: float) -> bool:
        """Does one more run of ``spec`` fit, with ``reserve_s`` kept after it?"""
        if self.limit_s is None or not self._process_s:
            return True
        return self.elapsed() + self.per_run_s(spec) + reserve_s <= self.limit_s
