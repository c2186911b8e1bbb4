"""The ladder's budget predictions (fastloop.drivers.ladder.budget): a run is predicted at its
configuration's warm cost (a cold compiler cache is paid once), a configuration not yet run at the
median warm run, plus that one-off where it compiles a graph no run has compiled; the final
comparison's reserve is one baseline and one selected run a side where each has run 3 times in
the ladder (the final comparison pools those runs where the budget ends it there), else 3 a side."""

from __future__ import annotations

import pytest

from fastloop.compare import Runs
from fastloop.drivers.ladder.budget import Budget
from fastloop.drivers.ladder.state import LadderState


def _state(runs: list[tuple[str, float, float | None]], selected: list[str] | None = None) -> LadderState:
    """A ladder state whose budget recorded runs that cost ``(spec, seconds, warm-up overhead)``, and
    that kept ``selected`` in a comparison with another configuration than the baseline (so the
    final comparison is still to come, and reserved)."""
    budget = Budget(300.0)
    for spec, seconds, warm in runs:
        budget.record(spec, seconds, warm)
    L = LadderState(
        "x",
        steps=10,
        warmup=2,
        device="cpu",
        measure=lambda target, spec, **kw: {},
        budget=budget,
        max_repeats=5,
        mode="select",
    )
    if selected:
        spec = ",".join(selected)
        L.keep(list(selected), Runs(spec), vs_spec="bf16", vs_runs=Runs("bf16"), ci=None)
    return L


def test_the_timer_records_each_runs_cost_less_its_start_up():
    """A run's cost for planning is its wall time less the fork server's one-off start; the log
    keeps both."""
    budget = Budget(None)
    timed = budget.timed(lambda target, spec, **kw: {"timings": {"startup_s": 0.25}, "warmup_overhead_s": 0.1})
    timed("x", "bf16")
    (entry,) = budget.run_log
    assert entry["spec"] == "bf16" and entry["startup_s"] == 0.25 and budget.runs == 1
    assert budget.per_run_s("bf16") == pytest.approx(max(0.0, entry["s"] - 0.25), abs=1e-3)


# a ResNet-50 on an H100, its measured figures: the baseline 10 s a run; the compiled bundle's first
# run compiles cold (66.9 s of warm-up, 74.9 s in all), its next runs 12 s with 4 s of warm-up
_R50 = [
    ("none", 10.0, 1.0),
    ("none", 10.0, 1.0),
    ("none", 10.0, 1.0),
    ("bf16,channels_last,compile", 74.9, 66.9),
    ("bf16,channels_last,compile", 12.0, 4.0),
    ("bf16,channels_last,compile", 12.0, 4.0),
]


def test_a_cold_compile_is_predicted_once_not_for_every_run():
    L = _state(_R50, selected=["bf16", "channels_last", "compile"])
    assert L.budget.warm_costs("bf16,channels_last,compile") == pytest.approx([12.0, 12.0, 12.0])
    assert L.budget.per_run_s("bf16,channels_last,compile") == pytest.approx(12.0)  # the mean cost was 33 s
    assert L.budget.one_off_s() == pytest.approx(62.9)
    # the final comparison's reserve at each side's own warm cost: one run a side, as both ran 3 times
    assert L.plan(1, "bf16,channels_last,compile")["reserve_s"] == pytest.approx(10.0 + 12.0)
    # a selected set that ran twice (an ablation's candidate just kept): 3 runs a side
    L2 = _state(_R50[:-1], selected=["bf16", "channels_last", "compile"])
    assert L2.budget.final_runs("none", "bf16,channels_last,compile", 3) == 3 and L2.plan(1)[
        "reserve_s"
    ] == pytest.approx(3 * (10.0 + 12.0))


def test_a_configuration_that_compiles_a_new_graph_is_predicted_with_the_cold_compile():
    L = _state(_R50, selected=["bf16", "channels_last", "compile"])
    # the median warm run of all: 11 s (10, 10, 10, 12, 12, 12); without compile: nothing compiles, the
    # median warm run; a precision or layout taken out of a compiled configuration: a graph no run
    # compiled, so the cache misses once more
    assert L.budget.per_run_s("bf16,channels_last") == pytest.approx(11.0)
    assert L.budget.per_run_s("channels_last,compile") == pytest.approx(11.0 + 62.9)
    assert L.budget.per_run_s("bf16,compile") == pytest.approx(11.0 + 62.9)
    # the same graph as a measured one (a feed speedup added): warm
    assert L.budget.per_run_s("bf16,channels_last,compile,workers") == pytest.approx(11.0)


def test_the_budget_starts_an_ablation_only_when_its_first_look_and_the_final_fit():
    L = _state(_R50, selected=["bf16", "channels_last", "compile"])
    assert L.fits(1, spec="bf16,channels_last")  # 11 s + 22 s reserve: fits in ~300 s
    L.budget.limit_s = L.budget.elapsed() + 22.0 + 11.0 + 5.0  # 38 s left
    assert L.fits(1, spec="bf16,channels_last")
    assert not L.fits(1, spec="channels_last,compile")  # 73.9 s + 22 s > 38 s
    plan = L.plan(1, "channels_last,compile")
    assert plan["predicted_s"] == pytest.approx(73.9) and plan["reserve_s"] == pytest.approx(22.0)
    assert plan["cold_compile_s"] == pytest.approx(62.9) and "cold_compile_s" not in L.plan(1, "bf16,channels_last")
    from fastloop.report.markdown import _plan

    assert "predicted 73.9 s (with a new compiled graph's cold compile, 62.9 s) + 22 s reserve" in _plan(plan)


def test_the_ablations_still_planned_are_kept_at_their_own_predicted_cost():
    """An ablation's extension must leave room for the first looks of the ablations after it, each
    at its own prediction: one that compiles a new graph is kept at its cold compile, not at the
    median run (otherwise an extension of one ablation spends what the next one needs)."""
    L = _state(_R50, selected=["bf16", "channels_last", "compile"])
    L.queue([(1, "channels_last,compile"), (1, "bf16,channels_last")])
    plan = L.plan(2, queued=True)
    assert plan["reserve_s"] == pytest.approx((10.0 + 12.0) + (11.0 + 62.9) + 11.0)
    L.queue([])
    assert L.plan(2, queued=True)["reserve_s"] == pytest.approx(10.0 + 12.0)


@pytest.mark.slow  # a ladder with compiles: .ci/run's second step
def test_a_compile_heavy_data_bound_ladder_with_its_costs_scaled_down(monkeypatch):
    """A ResNet-50 on a JPEG folder (an H100), its run costs scaled by 1/25 (the baseline 10 s, a
    DALI run 8 s, a compiled run 12 s, a new compiled graph 55 s more, a 300 s budget): the
    ladder keeps DALI and the compute bundle, measures the compile ablation at its one-run first
    look, and lists an ablation it cannot fit with its cold compile in the prediction; it ends
    within a run of the budget."""
    import time

    import numpy as np

    from fastloop.drivers.ladder import run_ladder
    from fastloop.speedups import REGISTRY

    for name in REGISTRY:
        monkeypatch.setattr(REGISTRY[name], "why_not", lambda self, ctx: None)
    rng, compiled, scale = np.random.default_rng(0), set(), 1 / 25

    def measure(target, spec, **kw):
        n = set() if spec == "none" else {s.split(":")[0] for s in spec.split(",")}
        key = frozenset(n & {"bf16", "channels_last", "compile", "tf32"})
        cold = "compile" in n and key not in compiled
        compiled.update([key] if "compile" in n else [])
        time.sleep(scale * ((8 if "dali" in n else 10) + (2 if "compile" in n else 0) + (55 if cold else 0)))
        speed = (
            1.0
            if "dali" not in n
            else 1.38
            * (2.0 if "bf16" in n else 1)
            * (1.25 if {"bf16", "channels_last"} <= n else 1)
            * (1.15 if "compile" in n else 1)
            * (1.03 if "cuda_graph" in n else 1)
        )
        mean = 0.05 / speed
        steps = list(mean * (1 + 0.01 * rng.standard_normal()) * (1 + 0.005 * rng.standard_normal(60)))
        return {
            "step_s_all": steps,
            "items_per_step": 128,
            "throughput": {"value": 128 / mean, "unit": "samples/s"},
            "data_wait_frac": 0.03 if "dali" in n else 0.3,
            "step_s": {"mean": mean},
            "warmup_overhead_s": scale * (55 if cold else 1),
            "speedups": [{"name": x, "status": "applied", "reason": ""} for x in sorted(n)],
            "loss": {"first": 1.0, "last": 0.5},
            "steps": 60,
            "warmup_steps": 5,
        }

    t0 = time.perf_counter()
    doc = run_ladder(
        "x",
        ["dali", "tf32", "bf16", "fused_optimizer", "channels_last", "compile", "cuda_graph"],
        device="cpu",
        budget=300 * scale,
        measure=measure,
    )
    assert time.perf_counter() - t0 <= 300 * scale + 70 * scale
    assert {"dali", "bf16", "channels_last", "compile"} <= set(doc["selected"])
    ablations = {r["ablation"]: r for r in doc["rungs"] if r.get("ablation")}
    assert ablations["compile"]["repeats"] == 1 and ablations["compile"]["decision"].startswith("kept compile")
    assert not any("failed" in (r.get("decision") or "") for r in doc["rungs"])
    for entry in doc["not_tried"]:  # what did not fit says how much of it is a cold compile
        assert entry["name"] in ("ablation of bf16", "ablation of channels_last") and entry["cold_compile_s"] > 1.5
    assert doc["rungs"][-1]["final"] and doc["rungs"][-1]["speedup_vs_baseline"]["significant"]


def test_a_final_comparison_the_budget_ends_after_one_run_a_side_pools_every_run():
    """Both sides ran 3 times in the ladder: the budget keeps one run a side for the final
    comparison, not 3, and a final comparison it ends there pools every run of both (Welch) and
    says so; the ladder stays within about a run of its budget."""
    import time

    import numpy as np

    from fastloop.drivers.ladder import run_ladder

    rng = np.random.default_rng(1)

    def measure(target, spec, **kw):
        time.sleep(0.5)
        names = [] if spec == "none" else spec.split(",")
        mean = 0.04 / ((2.0 if "workers" in names else 1.0) * (2.0 if "bf16" in names else 1.0))
        steps = list(mean * (1 + 0.01 * rng.standard_normal()) * (1 + 0.005 * rng.standard_normal(60)))
        return {
            "step_s_all": steps,
            "items_per_step": 16,
            "throughput": {"value": 16 / mean, "unit": "samples/s"},
            "data_wait_frac": 0.0 if "workers" in names else 0.5,
            "step_s": {"mean": mean},
            "warmup_overhead_s": 0.01,
            "speedups": [{"name": n, "status": "applied", "reason": ""} for n in names],
            "loss": {"first": 1.0, "last": 0.5},
            "steps": 60,
            "warmup_steps": 5,
        }

    t0 = time.perf_counter()
    # 3 baseline runs, 3 of workers (kept, against the baseline), 3 of bf16 on top (kept): 4.5 s;
    # the final comparison's first run a side then fits the 5.8 s budget, a second does not
    doc = run_ladder("x", ["workers", "bf16"], device="cpu", budget=5.8, measure=measure)
    wall = time.perf_counter() - t0
    final = doc["rungs"][-1]
    assert doc["selected"] == ["workers", "bf16"]
    assert final["final"] and final["repeats"] == 1, [(e["spec"], e["elapsed_s"]) for e in doc["run_log"]]
    ci = final["speedup_vs_baseline"]
    assert ci["pooled_runs"] == {"baseline": 4, "selected": 4} and ci["significant"] and ci["ratio"] > 3.5, ci
    assert "every run of both in the ladder" in ci["verdict"]
    assert wall <= 5.8 + 0.5
