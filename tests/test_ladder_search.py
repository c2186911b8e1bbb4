"""The staged ladder search (fastloop.drivers.ladder.search) on fakes with known effects: the feed first
when the baseline is data-bound; the compute stack as one bundle, then its ablation, so that two
speedups that help only together are found; the feed re-checked after the bottleneck moved (a
rung dropped before it moved tried again); the budget bounding the whole ladder; the log lines."""

from __future__ import annotations

import time

import numpy as np
import pytest

from fastloop.drivers.ladder import run_ladder
from fastloop.report.lines import RunLines as _RunLines


def _fake(speed, wait, seed=0, sleep=0.0):
    """``speed(names)``: the step's speed-up over the baseline; ``wait(names)``: its data wait."""
    rng = np.random.default_rng(seed)

    def measure(target, spec, **kw):
        if sleep:
            time.sleep(sleep)
        names = [] if spec == "none" else [s.split(":")[0] for s in spec.split(",")]
        mean = 0.010 / speed(set(names))
        steps = list(mean * (1 + 0.01 * rng.standard_normal()) * (1 + 0.005 * rng.standard_normal(60)))
        return {
            "step_s_all": steps,
            "items_per_step": 16,
            "throughput": {"value": 16 / mean, "unit": "samples/s"},
            "data_wait_frac": wait(set(names)),
            "step_s": {"mean": mean},
            "speedups": [{"name": n, "status": "applied", "reason": ""} for n in names],
            "loss": {"first": 1.0, "last": 0.5},
            "steps": 60,
            "warmup_steps": 5,
        }

    return measure


def _measured(doc):
    return [r for r in doc["rungs"] if r.get("speedup_vs_prev") is not None]


def test_feed_first_when_the_baseline_waits_for_data():
    def speed(n):
        return (2.0 if "workers" in n else 1.0) * (1.2 if "bf16" in n else 1.0)

    doc = run_ladder(
        "x",
        ["bf16", "fused_optimizer", "workers"],
        device="cpu",
        measure=_fake(speed, lambda n: 0.05 if "workers" in n else 0.55),
    )
    first = _measured(doc)[0]
    assert first["rung"] == "+workers" and first["decision"].startswith("kept")
    assert first["stage"].startswith("feed first")
    assert [s["stage"] for s in doc["stages"]][:2] == ["baseline", "feed first (the baseline waits for data)"]
    assert doc["stages"][0]["bottleneck"] == "data-bound"
    assert set(doc["selected"]) == {"workers", "bf16", "fused_optimizer"}  # kept in the bundle: costs nothing
    # the report says what the compute rungs were measured on: the feed fixed first
    compute = next(s for s in doc["stages"] if s["stage"] == "compute stack" and "bundle" in s["action"])
    assert "measured on the feed fixed first (workers; the step waits 5% for data)" in compute["action"]


def test_compute_measured_on_a_feed_nothing_fixed_says_so():
    doc = run_ladder(
        "x", ["bf16", "fused_optimizer", "workers"], device="cpu", measure=_fake(lambda n: 1.0, lambda n: 0.55)
    )
    compute = next(s for s in doc["stages"] if s["stage"] == "compute stack" and "bundle" in s["action"])
    assert "measured on the user's feed, which no feed rung improved: the step waits 55% for data" in compute["action"]


def test_compute_measured_on_a_feed_that_still_waits_says_so():
    doc = run_ladder(
        "x",
        ["bf16", "fused_optimizer", "workers"],
        device="cpu",
        measure=_fake(lambda n: 2.0 if "workers" in n else 1.0, lambda n: 0.5),
    )
    compute = next(s for s in doc["stages"] if s["stage"] == "compute stack" and "bundle" in s["action"])
    assert (
        "measured on the feed chosen first (workers), which still leaves the step waiting 50% for data"
        in compute["action"]
    )


def test_the_compute_bundle_finds_a_pair_that_helps_only_together_and_ablation_drops_the_rest():
    def speed(n):  # bf16 and compile help only together (1.6x); channels_last does nothing
        return 1.6 if {"bf16", "compile"} <= n else 0.97 if "compile" in n else 1.0

    doc = run_ladder(
        "x", ["bf16", "channels_last", "fused_optimizer", "compile"], device="cpu", measure=_fake(speed, lambda n: 0.02)
    )
    bundle = next(r for r in doc["rungs"] if "compute bundle" in r["rung"])
    assert bundle["decision"].startswith("kept")
    assert set(bundle["members"]) == {"bf16", "channels_last", "fused_optimizer", "compile"}
    ablation = {r["ablation"]: r for r in doc["rungs"] if r.get("ablation")}
    assert ablation["channels_last"]["decision"].startswith("removed channels_last: not missed")
    assert ablation["compile"]["decision"].startswith("kept compile")
    assert ablation["bf16"]["decision"].startswith("kept bf16")
    assert "fused_optimizer" not in ablation  # costs nothing when it does not help: not ablated
    assert set(doc["selected"]) == {"bf16", "compile", "fused_optimizer"}
    final = doc["rungs"][-1]
    assert final["final"] and final["speedup_vs_baseline"]["significant"]
    assert final["speedup_vs_baseline"]["ci_low"] <= 1.6 <= final["speedup_vs_baseline"]["ci_high"]
    # one at a time, the old search finds nothing: neither helps alone
    old = run_ladder(
        "x", ["bf16", "channels_last", "compile"], device="cpu", mode="sequential", measure=_fake(speed, lambda n: 0.02)
    )
    assert old["selected"] == []


def test_the_feed_is_rechecked_after_the_bottleneck_moved():
    # data-bound at first, yet more workers do not help the slow fp32 step (the fake says so);
    # once bf16 makes the step fast and the wait moves, workers help: tried again and kept
    def speed(n):
        s = 2.0 if "bf16" in n else 1.0
        return s * (1.4 if "workers" in n and "bf16" in n else 1.0)

    def wait(n):
        if "bf16" in n:
            return 0.05 if "workers" in n else 0.15
        return 0.3

    doc = run_ladder("x", ["bf16", "workers"], device="cpu", measure=_fake(speed, wait))
    tries = [r for r in doc["rungs"] if r["rung"] == "+workers"]
    assert len(tries) == 2, [r["rung"] for r in doc["rungs"]]
    assert tries[0]["decision"].startswith("dropped") and tries[0]["stage"].startswith("feed first")
    assert tries[1]["decision"].startswith("kept") and tries[1]["stage"].startswith("feed re-checked")
    assert set(doc["selected"]) == {"bf16", "workers"}


def test_the_budget_bounds_the_whole_ladder_and_lists_what_was_not_tried():
    per_run = 0.15
    t0 = time.perf_counter()
    doc = run_ladder(
        "x",
        ["bf16", "fused_optimizer", "compile", "workers"],
        device="cpu",
        budget=2.0,
        measure=_fake(lambda n: 1.3 if "bf16" in n else 1.0, lambda n: 0.02, sleep=per_run),
    )
    wall = time.perf_counter() - t0
    assert wall <= 2.0 + 2 * per_run + 0.5, wall  # within about one run's length
    # what the budget cut is listed: not started (with the planner's arithmetic) or cut short
    assert doc["not_tried"] or doc["cut_short"]
    assert all(t["why"] == "budget" and t["predicted_s"] + t["reserve_s"] > t["left_s"] for t in doc["not_tried"])
    assert doc["rungs"][-1].get("final")  # the final comparison still fits


def test_a_ladder_the_budget_cut_short_does_not_say_that_nothing_helps():
    doc = run_ladder(
        "x",
        ["bf16", "fused_optimizer", "compile"],
        device="cpu",
        budget=1.0,
        measure=_fake(lambda n: 1.0, lambda n: 0.02, sleep=0.15),
    )
    assert doc["selected"] == [] and doc["not_tried"]
    assert doc["callbacks_line"].startswith("# no speedup helped measurably in the budget;")
    assert "a larger --budget" in doc["callbacks_line"]
    full = run_ladder("x", ["bf16"], device="cpu", measure=_fake(lambda n: 1.0, lambda n: 0.02))
    assert (
        not full["not_tried"] and full["callbacks_line"] == "# no speedup helped measurably on this model and machine"
    )


def test_log_lines_one_per_finished_run(capsys):
    lines = _RunLines()
    log = [{"spec": "none", "s": 2.5, "elapsed_s": 2.5, "throughput": {"value": 1000.0, "unit": "samples/s"}}]
    lines({"run_log": log, "budget_s": 80.0})
    log.append({"spec": "bf16", "s": 2.0, "elapsed_s": 4.5, "throughput": None})
    lines({"run_log": log, "budget_s": 80.0})
    lines({"run_log": log, "budget_s": 80.0})  # nothing new: nothing printed
    out = capsys.readouterr().out.splitlines()
    assert out == [
        "ladder: run 1 (none): 1,000 samples/s in 2.5 s; 2 s of the 80 s budget",
        "ladder: run 2 (bf16): failed in 2.0 s; 4 s of the 80 s budget",
    ]


def test_a_bundle_whose_process_fails_is_tried_one_at_a_time():
    from fastloop.drivers.subproc import ConfigurationFailed

    inner = _fake(lambda n: 1.5 if "bf16" in n else 1.0, lambda n: 0.02)

    def measure(target, spec, **kw):
        if "compile" in spec.split(","):
            raise ConfigurationFailed(f"configuration {spec!r} failed in its process: exit -9", -9)
        return inner(target, spec, **kw)

    doc = run_ladder("x", ["bf16", "compile"], device="cpu", measure=measure)
    by = [(r["rung"], r.get("rung_status"), r.get("decision", "")) for r in doc["rungs"]]
    bundle = next(r for r in doc["rungs"] if "compute bundle" in r["rung"])
    assert bundle["rung_status"] == "failed" and "exit -9" in bundle["rung_reason"]
    single = next(r for r in doc["rungs"] if r["rung"] == "+bf16")
    assert single["decision"].startswith("kept"), by
    assert next(r for r in doc["rungs"] if r["rung"] == "+compile")["rung_status"] == "failed"
    assert doc["selected"] == ["bf16"] and doc["rungs"][-1].get("final")
    assert doc["rungs"][0]["repeats"] >= 3  # the baseline row shows its topped-up runs


def test_ablation_keeps_a_member_whose_removal_looks_slower_even_when_not_significant():
    """A 5% loss on removal, measured with a noisy step, is not 'not missed'."""

    def speed(n):
        return (1.5 if "compile" in n else 1.0) * (1.05 if "bf16" in n else 1.0)

    rng = np.random.default_rng(3)
    inner = _fake(speed, lambda n: 0.02)

    def noisy(target, spec, **kw):
        doc = inner(target, spec, **kw)
        doc["step_s_all"] = [t * (1 + 0.08 * rng.standard_normal()) for t in doc["step_s_all"]]
        return doc

    doc = run_ladder("x", ["bf16", "compile"], device="cpu", measure=noisy, max_repeats=3)
    ablation = {r["ablation"]: r for r in doc["rungs"] if r.get("ablation")}
    ci = ablation["bf16"]["speedup_vs_prev"]
    if ci["ratio"] < 0.98:
        assert ablation["bf16"]["decision"].startswith("kept bf16") and "bf16" in doc["selected"]


def test_the_budget_holds_within_one_run_when_the_candidates_runs_are_slow():
    """A compiled bundle whose runs take 5x the baseline's: the ladder stops starting runs that
    would not fit (with the final comparison's first runs), instead of finishing the look."""
    inner = _fake(lambda n: 1.5 if "bf16" in n else 1.0, lambda n: 0.02)

    def measure(target, spec, **kw):
        time.sleep(0.5 if "compile" in spec else 0.1)
        return inner(target, spec, **kw)

    budget = 3.0
    t0 = time.perf_counter()
    doc = run_ladder("x", ["bf16", "compile"], device="cpu", budget=budget, measure=measure)
    wall = time.perf_counter() - t0
    assert wall <= budget + 0.5 + 0.6, wall  # one of the slowest runs past the budget at most, and slack
    assert doc["rungs"][-1].get("final")
    assert doc["not_tried"] or doc["cut_short"]


def test_the_search_reads_capabilities_not_names(monkeypatch):
    """A speedup the search has never heard of is grouped, ablated and advised by its ladder
    traits (replaces_loader, changes_workload, ablation_rank) and its advice_pattern, as a new
    speedup module would be: no list of names in the drivers to extend."""
    from fastloop.drivers.doctor import without_measured
    from fastloop.drivers.ladder.candidates import ablation_order, replaces_loader, split_groups
    from fastloop.speedups.base import REGISTRY, Speedup
    from fastloop.speedups.ladder_traits import LadderTraits

    class GpuFeed(Speedup):
        name, changes, ladder = "test_gpu_feed", "data", LadderTraits(feeds=True, replaces_loader=True)

    class Costly(Speedup):
        name, changes, ladder, advice_pattern = (
            "test_costly",
            "model",
            LadderTraits(ablation_rank=-1),
            r"costly kernels",
        )

    class Workload(Speedup):
        name, changes, ladder = "test_workload", "data", LadderTraits(changes_workload=True)

    for cls in (GpuFeed, Costly, Workload):
        monkeypatch.setitem(REGISTRY, cls.name, cls)
    feed, compute, rest = split_groups([GpuFeed(), Costly(), Workload(), REGISTRY["bf16"]()])
    assert [s.name for s in feed] == ["test_gpu_feed"] and [s.name for s in rest] == ["test_workload"]
    assert [s.name for s in compute] == ["test_costly", "bf16"]
    assert ablation_order(["tf32", "bf16", "test_costly"]) == [
        "test_costly",
        "bf16",
    ]  # rank -1 first; tf32 costs nothing
    assert replaces_loader({"test_gpu_feed"}) and not replaces_loader({"workers", "pin_memory"})
    d = without_measured({"recommendation": "try costly kernels, or bf16."}, {"test_costly": "0.98x"})
    assert d["advice_filtered"] == ["test_costly"]


def test_every_comparison_records_its_counterbalanced_run_order():
    """Each comparison's ``run_order`` (A its base, B the candidate) is the order the
    runs ran in, the rounds alternating (A B, then B A, ...); base runs counted again from an
    earlier comparison are said (``base_runs_reused``) and are not run again."""
    doc = run_ladder(
        "x",
        ["bf16", "fused_optimizer"],
        device="cpu",
        measure=_fake(lambda n: 1.3 if "bf16" in n else 1.0, lambda n: 0.0),
    )
    by = {r["rung"]: r["speedup_vs_prev"] for r in _measured(doc)}
    bundle = by["+bf16,fused_optimizer (compute bundle)"]
    # the baseline's bottleneck run counts again: A B, then B A, then B alone (A has 3)
    assert bundle["run_order"] == ["A", "B", "B", "A", "B"] and bundle["base_runs_reused"] == 1
    ablation = by["-bf16"]  # the bundle's 3 runs count again; one run of the candidate told enough
    assert ablation["run_order"] == ["B"] and ablation["base_runs_reused"] == 3
    assert [e["spec"] for e in doc["run_log"]] == [
        "none",
        "none",
        "bf16,fused_optimizer",
        "bf16,fused_optimizer",
        "none",
        "bf16,fused_optimizer",
        "fused_optimizer",
    ]


def test_two_configurations_that_tie_within_the_noise_are_said_to_tie_and_the_simpler_is_kept():
    """Where a comparison cannot tell two sets apart, the report says they tie and that
    the simpler one was kept (a second ladder choosing the other is then no contradiction)."""
    from fastloop.report.markdown import search_story

    rng = np.random.default_rng(5)

    def measure(target, spec, **kw):  # fused_optimizer: 1% at most, inside 4% run-to-run noise
        names = [] if spec == "none" else spec.split(",")
        mean = 0.010 / (1.01 if "fused_optimizer" in names else 1.0) * (1 + 0.04 * rng.standard_normal())
        return {
            "step_s_all": list(mean * (1 + 0.005 * rng.standard_normal(60))),
            "items_per_step": 16,
            "throughput": {"value": 16 / mean, "unit": "samples/s"},
            "data_wait_frac": 0.0,
            "step_s": {"mean": mean},
            "speedups": [{"name": n, "status": "applied", "reason": ""} for n in names],
            "loss": {"first": 1.0, "last": 0.5},
            "steps": 60,
            "warmup_steps": 5,
        }

    doc = run_ladder("x", ["fused_optimizer"], device="cpu", measure=measure)
    assert doc["selected"] == [] and doc["ties"], doc["rungs"][1]["decision"]
    tie = doc["ties"][0]
    assert tie["kept"] == "none" and tie["other"] == "fused_optimizer" and tie["ci_low"] < 1 < tie["ci_high"]
    assert "tie within the noise: the simpler, none, is kept" in doc["rungs"][1]["decision"]
    assert any(
        "Ties within the noise" in line and "`none` over `fused_optimizer`" in line for line in search_story(doc)
    )


def _vit_like(n):
    """Data-bound at first (the feed bundle 1.6x); then the compute bundle 2.2x, which the budget
    must reach before the feed bundle's ablation (a ViT's ladder on an H200, in miniature)."""
    return (1.6 if "workers" in n else 1.0) * (2.2 if {"bf16", "compile"} <= n else 1.0)


def _cpu_feed_bundle(monkeypatch):
    """pin_memory and prefetch apply only with CUDA: on this CPU, let the fake feed bundle have them."""
    from fastloop.speedups import REGISTRY

    for name in ("pin_memory", "prefetch"):
        monkeypatch.setattr(REGISTRY[name], "why_not", lambda self, ctx: None)


def test_the_compute_bundle_is_measured_before_the_feed_bundle_is_ablated(monkeypatch):
    _cpu_feed_bundle(monkeypatch)
    rungs = ["workers", "pin_memory", "prefetch", "bf16", "compile"]
    doc = run_ladder("x", rungs, device="cpu", measure=_fake(_vit_like, lambda n: 0.0 if "workers" in n else 0.5))
    names = [r["rung"] for r in doc["rungs"]]
    bundle = next(i for i, n in enumerate(names) if "compute bundle" in n)
    feed_ablations = [i for i, r in enumerate(doc["rungs"]) if r.get("ablation") in ("workers", "prefetch")]
    assert feed_ablations and bundle < min(feed_ablations), names
    assert doc["rungs"][bundle]["decision"].startswith("kept")
    assert "feed bundle ablated after the compute stack" in [s["stage"] for s in doc["stages"]]
    assert {"workers", "bf16", "compile"} <= set(doc["selected"])


def test_a_tight_budget_still_reaches_the_compute_bundle_on_a_data_bound_step(monkeypatch):
    """The budget fits the baseline, the feed bundle's and the compute bundle's comparisons and
    the final one, and perhaps not every ablation: the compute bundle is kept; each member is
    either ablated (decided at its first look where one run tells: clearly slower without it) or
    listed not tried."""
    _cpu_feed_bundle(monkeypatch)
    doc = run_ladder(
        "x",
        ["workers", "pin_memory", "prefetch", "bf16", "compile"],
        device="cpu",
        budget=1.8,
        measure=_fake(_vit_like, lambda n: 0.0 if "workers" in n else 0.5, sleep=0.1),
    )
    bundle = next(r for r in doc["rungs"] if "compute bundle" in r["rung"])
    assert bundle["decision"].startswith("kept"), bundle["decision"]
    assert {"bf16", "compile"} <= set(doc["selected"])
    ablated = {r["ablation"].split(":")[0]: r for r in doc["rungs"] if r.get("ablation")}
    untried = {t["name"].split(":")[0] for t in doc["not_tried"]}  # workers as sized: workers:N
    for member in ("compile", "bf16", "workers", "prefetch"):
        assert (member in ablated) != (f"ablation of {member}" in untried), (
            member,
            untried,
            [(r["rung"], r.get("decision")) for r in doc["rungs"]],
        )
    for member in ("compile", "bf16"):  # 0.46x without either: one run tells
        if member in ablated:
            assert ablated[member]["repeats"] == 1 and ablated[member]["decision"].startswith(f"kept {member}")


@pytest.mark.slow  # a CLI ladder on the wall clock: .ci/run's second step
def test_the_budget_bounds_the_commands_wall_time_from_its_start(tmp_path):
    """``fastloop ladder --budget S`` as a user times it: the imports before the ladder's own clock
    (``started_s``) and the last reports count too, so the command ends within one run of S."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root / "src"), str(root)])}
    budget = 14.0
    t0 = time.perf_counter()
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "fastloop.cli",
            "ladder",
            "tests/targets.py:tiny_mlp",
            "--device",
            "cpu",
            "--rungs",
            "fused_optimizer,bf16",
            "--budget",
            str(budget),
            "--out",
            str(tmp_path),
        ],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
    )
    wall = time.perf_counter() - t0
    assert proc.returncode == 0, proc.stderr[-2000:]
    doc = json.loads((tmp_path / "report.json").read_text())
    assert doc["budget_s"] == budget and doc["started_s"] > 0
    longest = max(e["s"] for e in doc["run_log"])
    assert wall <= budget + longest + 1.5, (wall, longest, doc["started_s"])


def test_a_final_comparison_the_budget_cut_pools_every_run_of_both():
    """A ViT's ladder on an H200: the final comparison, cut by the budget at 3 runs a side
    of a data-bound baseline spreading 15%, said 1.81x [0.61, 5.38] "n.s." for a set measured 6
    times before at 27 ms against a baseline at 40-56 ms. Pooled (Welch over every run of both),
    the same runs call it; a comparison that could call, or was not cut, stays as it was."""
    from fastloop.compare import Runs, compare
    from fastloop.drivers.ladder.state import pooled_final

    def runs(spec, ms):
        return Runs(spec, docs=[{"step_s_all": [m / 1000] * 60} for m in ms])

    base = runs("none", [49.6, 40.0, 56.3, 42.0, 46.6, 40.8])
    earlier = runs("workers,pin_memory", [26.9, 27.2, 27.1, 27.4, 27.4, 27.8])
    fresh_base, fresh_sel = runs("none", [38.0, 62.0, 41.0]), runs("workers,pin_memory", [27.9, 27.5, 26.9])
    cut = compare(fresh_base, fresh_sel, confidence=0.985)
    assert not cut["significant"]
    out = pooled_final({**cut, "budget": True}, base, [earlier], fresh_base, fresh_sel)
    assert out["significant"] and out["ratio"] > 1.4 and out["pooled_runs"] == {"baseline": 9, "selected": 9}
    assert out["method"].startswith("Welch") and out["interleaved"]["ratio"] == cut["ratio"]
    assert "cut by the budget" in out["verdict"]
    assert pooled_final(cut, base, [earlier], fresh_base, fresh_sel) is cut  # not cut: as it was
    called = {**compare(base, earlier), "budget": True}
    assert pooled_final(called, base, [earlier], fresh_base, fresh_sel) is called  # it could call: as it was


def test_a_feed_that_needs_in_memory_tensors_is_left_out_of_the_recheck_without_a_crash(monkeypatch):
    """On an H200 both default ViT ladders ended in an internal error (StopIteration) at the
    feed re-check, where the only feed left needed in-memory tensors and the dataset had none."""
    from fastloop.speedups.base import REGISTRY, Speedup
    from fastloop.speedups.ladder_traits import LadderTraits

    class Resident(Speedup):
        name, changes, order = "test_resident", "data", 9
        ladder = LadderTraits(feeds=True, replaces_loader=True, needs_in_memory_tensors=True)

    monkeypatch.setitem(REGISTRY, Resident.name, Resident)

    def speed(n):
        return (2.0 if "workers" in n else 1.0) * (1.5 if "bf16" in n else 1.0)

    doc = run_ladder(
        "x",
        ["test_resident", "workers", "bf16"],
        device="cpu",
        measure=_fake(speed, lambda n: 0.05 if "workers" in n else 0.55),
    )  # no in-memory dataset
    assert set(doc["selected"]) == {"workers", "bf16"}
    assert not any(r["rung"] == "+test_resident" for r in doc["rungs"])


def test_an_ablation_that_keeps_a_member_by_the_point_estimate_says_so():
    """Without channels_last the step is 4% slower, in runs that vary 4%: some seeds call it
    significant, others do not; a member kept without a significant loss says why it was kept."""

    def speed(n):
        return (1.6 if {"bf16", "compile"} <= n else 1.0) * (1.04 if "channels_last" in n else 1.0)

    decisions = []
    for seed in (0, 3, 4):
        rng = np.random.default_rng(seed)

        def measure(target, spec, rng=rng, **kw):
            names = [] if spec == "none" else [s.split(":")[0] for s in spec.split(",")]
            mean = 0.010 / speed(set(names))
            steps = list(mean * (1 + 0.04 * rng.standard_normal()) * (1 + 0.005 * rng.standard_normal(60)))
            return {
                "step_s_all": steps,
                "items_per_step": 16,
                "throughput": {"value": 16 / mean, "unit": "samples/s"},
                "data_wait_frac": 0.02,
                "step_s": {"mean": mean},
                "speedups": [{"name": n, "status": "applied", "reason": ""} for n in names],
                "loss": {"first": 1.0, "last": 0.5},
                "steps": 60,
                "warmup_steps": 5,
            }

        doc = run_ladder("x", ["bf16", "channels_last", "compile"], device="cpu", measure=measure)
        r = next(r for r in doc["rungs"] if r.get("ablation") == "channels_last")
        decisions.append((r["speedup_vs_prev"], r["decision"]))
    for ci, decision in decisions:
        assert decision.startswith("kept channels_last"), decision
        point_only = "kept as more than 2% slower without it at the point estimate" in decision
        assert point_only == (not ci["significant"]), decision
    assert any(not ci["significant"] for ci, _ in decisions) and any(ci["significant"] for ci, _ in decisions)


@pytest.mark.slow
def test_a_ladder_with_steps_30_on_a_data_bound_model_measures_and_selects_the_feed(tmp_path):
    """``--steps 30`` with three rungs on the sleepy fixture (workers well over 2x):
    the feed rung is measured and selected, and no rung is left 'not tried: budget' (a member of
    a bundle measured and not faster may be left untried alone, which the report says; so may a
    kept rung's sizes in the configuration, a refinement that the 80 s CPU budget may not fit
    after the rungs themselves)."""
    import json
    import subprocess
    import sys

    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "fastloop.cli",
            "ladder",
            "tests/targets.py:sleepy",
            "--device",
            "cpu",
            "--rungs",
            "bf16,workers,fused_optimizer",
            "--steps",
            "30",
            "--out",
            str(tmp_path),
            "--quiet",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    doc = json.loads((tmp_path / "report.json").read_text())
    assert any(s.split(":")[0] == "workers" for s in doc["selected"]), doc["selected"]  # pinned: workers:N
    rungs_untried = [
        t for t in doc["not_tried"] if t["why"] == "budget" and t["stage"] != "sizes measured in the configuration"
    ]
    assert rungs_untried == [], doc["not_tried"]
    measured = {n for r in doc["rungs"] for n in (r.get("members") or [r.get("rung", "").lstrip("+").split(" ")[0]])}
    assert {"workers", "bf16", "fused_optimizer"} <= measured | set(doc["selected"]), doc["rungs"]


def test_a_padding_to_a_few_shapes_is_not_measured_where_the_batches_keep_one_shape():
    """On an H100 an ImageFolder ResNet-50's ladder put pad_buckets in the compute bundle and said
    "the batches change shape" though every batch had one shape (its own check was waived by itself)."""
    one = {"steps": 40, "distinct": 1, "most_common_share": 1.0, "varying": "-"}
    base = _fake(lambda n: 1.5 if "bf16" in n else 1.0, lambda n: 0.02)

    def measure(target, spec, **kw):
        doc = base(target, spec, **kw)
        checks = {"pad_buckets": "the batches keep one shape apart from the batch dimension: nothing to pad"}
        return {**doc, "batch_shapes": one, "data_checks": checks, "model_checks": checks}

    doc = run_ladder("x", ["pad_buckets", "bf16", "fused_optimizer"], device="cpu", measure=measure)
    pad = next(r for r in doc["rungs"] if r["rung"] == "+pad_buckets")
    assert pad["rung_status"] == "skipped" and "nothing to pad" in pad["rung_reason"]
    assert not any("change shape" in s["action"] for s in doc["stages"])
    assert "pad_buckets" not in doc["selected"]


def _step_outruns_the_feed(n):
    """A ViT on an H100, in miniature: the fp32 step barely waits (10%); the compute
    bundle makes it 2x faster and then it waits 30%, which the feed fixes (1.4x)."""
    return (2.0 if {"bf16", "compile"} <= n else 1.0) * (1.4 if "workers" in n and "compile" in n else 1.0)


def _its_wait(n):
    if {"bf16", "compile"} <= n:
        return 0.02 if "workers" in n else 0.3
    return 0.1


def test_a_compute_bundle_whose_step_then_waits_for_data_is_ablated_after_the_feed():
    doc = run_ladder(
        "x", ["workers", "bf16", "compile"], device="cpu", measure=_fake(_step_outruns_the_feed, _its_wait)
    )
    rungs = doc["rungs"]
    feed = next(i for i, r in enumerate(rungs) if r["rung"] == "+workers")
    ablations = [i for i, r in enumerate(rungs) if r.get("ablation") in ("bf16", "compile")]
    assert ablations and feed < min(ablations), [r["rung"] for r in rungs]
    assert rungs[feed]["decision"].startswith("kept")
    stages = [(s["stage"], s["action"]) for s in doc["stages"]]
    assert any(
        "its ablation waits until the feed is checked: the faster step waits 30% for data" in a for _, a in stages
    )
    assert "compute bundle ablated after the feed" in [st for st, _ in stages]
    assert {"workers", "bf16", "compile"} <= set(doc["selected"])


def test_a_budget_that_fits_the_bundle_and_the_feed_measures_the_feed_before_any_ablation():
    """That ViT's ladder spent its 5 minutes on the compute bundle's ablation and left the feed
    that would have fixed the 28% wait 'not tried: budget': a budget short of the ablations (about
    14 runs of 0.1 s) leaves them out, never the feed."""
    doc = run_ladder(
        "x",
        ["workers", "bf16", "compile"],
        device="cpu",
        budget=1.4,
        measure=_fake(_step_outruns_the_feed, _its_wait, sleep=0.1),
    )
    assert not any(t["name"] == "workers" for t in doc["not_tried"]), doc["not_tried"]
    assert "workers" in doc["selected"], [(r["rung"], r.get("decision")) for r in doc["rungs"]]


def test_stored_images_augmented_on_the_gpu_go_in_with_the_compute_stack(monkeypatch):
    """Where the data checks let gpu_augment serve the stored images, the compute
    rungs are measured with it (the step never waits on the CPU augmentation), as gpu_resident is
    for fixed in-memory tensors; the stage says so."""
    from fastloop.speedups import REGISTRY

    monkeypatch.setattr(REGISTRY["gpu_augment"], "why_not", lambda self, ctx: None)
    doc = run_ladder(
        "x",
        ["gpu_augment", "workers", "bf16", "compile"],
        device="cpu",
        measure=_fake(
            lambda n: (2.0 if {"bf16", "compile"} <= n else 1.0) * (1.4 if "gpu_augment" in n else 1.0),
            lambda n: 0.0 if "gpu_augment" in n else 0.1,
        ),
    )
    bundle = next(r for r in doc["rungs"] if "compute bundle" in r["rung"])
    assert "gpu_augment" in bundle["members"] and bundle["decision"].startswith("kept")
    assert any(s["stage"] == "compute stack with the data on the GPU" for s in doc["stages"])
    assert "gpu_augment" in doc["selected"] and "workers" not in doc["selected"]
