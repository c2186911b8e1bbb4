"""The tiers and zoo benchmarks' bookkeeping (benchmarks/tiers_bench.py, benchmarks/zoo_bench.py):
the tier and its reason come from fastloop's own record, the ratio points the right way, runs are
interleaved round by round with the order reversed every other round, and a call cut by
``--max-s`` leaves every module with the same number of runs. No GPU: the measurement is faked."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from fastloop.compare import Runs

ROOT = Path(__file__).resolve().parents[1]


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _doc(step_s: float, tier: str | None = None, why: str | None = None) -> dict:
    extra = {"cuda_graph_tier": tier} if tier else {}
    if why:
        extra["cuda_graph_why_not_whole"] = why
    recs = [{"name": "cuda_graph", "status": "applied", "detail": f"{tier} (whole step: {why})"}] if tier else []
    return {
        "step_s_all": [step_s * (1 + 0.01 * i) for i in range(20)],
        "items_per_step": 256,
        "throughput": {"value": 256 / step_s, "unit": "samples/s"},
        "extra": extra,
        "speedups": recs,
    }


def test_tiers_summary_reads_the_tier_and_why_from_the_record_and_the_ratio_is_graph_over_compile():
    bench = _load("tiers_bench")
    why = "OneCycleLR cycles SGD's momentum every step"
    sides = {
        "compile": Runs("x,compile", docs=[_doc(0.010 * (1 + 0.02 * k)) for k in range(3)]),
        "cuda_graph": Runs(
            "x,compile,cuda_graph",
            docs=[_doc(0.005 * (1 + 0.02 * k), "forward+backward graphed", why) for k in range(3)],
        ),
    }
    row = bench.summarize("cifar_resnet", sides)
    assert row["cuda_graph"]["tiers"] == ["forward+backward graphed"] * 3
    assert row["cuda_graph"]["why_not_higher"] == [why]  # said once, not once per run
    assert row["graph_vs_compile"]["ratio"] == pytest.approx(2.0, rel=0.02)  # the graph side is twice as fast
    assert row["graph_vs_compile"]["significant"] is True
    assert row["failures"] == {}


def test_tiers_summary_keeps_a_failed_run_and_the_span_says_when_there_is_no_interval():
    bench = _load("tiers_bench")
    sides = {
        "compile": Runs("c", docs=[_doc(0.01)]),
        "cuda_graph": Runs("g", docs=[_doc(0.01, "eager", "no CUDA")], failures=["Traceback ... RuntimeError"]),
    }
    row = bench.summarize("lstm_lm", sides)
    assert row["failures"] == {"cuda_graph": ["Traceback ... RuntimeError"]}
    assert bench._span({"ratio": 1.1, "ci_low": 0.0, "ci_high": None}) == "1.100 [n/a]"
    assert bench._span({"ratio": 1.1, "ci_low": 1.01, "ci_high": 1.2}) == "1.100 [1.01,1.20]"


def test_zoo_compares_round_by_round_with_the_order_reversed_and_stops_evenly(tmp_path, monkeypatch):
    bench = _load("zoo_bench")
    calls: list[tuple[str, str]] = []
    clock = [0.0]

    def fake_measure(target, spec, runs):
        module, kind = Path(target.split(":")[0]).stem, target.split(":")[1]
        calls.append((module, "expert" if kind == "expert" else ("plain" if spec == "none" else "pick")))
        clock[0] += 10.0  # every run takes 10 s of the fake clock
        runs.docs.append(_doc(0.01 if spec == "none" else 0.005))

    monkeypatch.setattr(bench, "_measure", fake_measure)
    monkeypatch.setattr(bench.time, "perf_counter", lambda: clock[0])
    ladders = {
        m: {"module": m, "ladder_wall_s": 200.0, "ladder_runs": 20, "selected": "bf16,compile"}
        for m in ("lstm_lm", "unet")
    }
    rows = bench.compare_phase(ladders, tmp_path, rounds=5, max_s=140.0)
    # a round is 6 runs (60 s); a round starts only if 1.2x the longest round still fits: 60 + 72 <= 140, 120 + 72 > 140
    assert [c for c in calls[:6]] == [
        ("lstm_lm", "plain"),
        ("lstm_lm", "expert"),
        ("lstm_lm", "pick"),
        ("unet", "plain"),
        ("unet", "expert"),
        ("unet", "pick"),
    ]
    assert calls[6:9] == [("lstm_lm", "pick"), ("lstm_lm", "expert"), ("lstm_lm", "plain")]
    assert len(calls) == 12
    assert all(r["runs"] == {"plain": 2, "expert": 2, "pick": 2} for r in rows)
    saved = json.loads((tmp_path / "zoo_unet.json").read_text())
    assert saved["rounds"] == 2 and saved["selected"] == "bf16,compile"
    assert saved["pick_vs_plain"]["ratio"] == pytest.approx(2.0, rel=0.02)


def test_zoo_measures_an_earlier_pick_beside_and_reports_each_sides_data_wait(tmp_path, monkeypatch):
    """``--before MODULE=SPEC``: a fourth side, interleaved like the others, compared with the pick;
    each side's data wait in the row (the feed must-shows: data wait before and now)."""
    bench = _load("zoo_bench")
    calls: list[tuple[str, str]] = []

    def fake_measure(target, spec, runs):
        calls.append((Path(target.split(":")[0]).stem, spec))
        doc = _doc({"none": 0.01, "workers": 0.008, "gpu_augment,bf16": 0.004}.get(spec, 0.01))
        doc["data_wait_frac"] = 0.3 if spec in ("none", "workers") else 0.02
        runs.docs.append(doc)

    monkeypatch.setattr(bench, "_measure", fake_measure)
    monkeypatch.setitem(bench.BEFORE, "vit_v2aug", "workers")
    ladders = {
        "vit_v2aug": {"module": "vit_v2aug", "ladder_wall_s": 200.0, "ladder_runs": 20, "selected": "gpu_augment,bf16"}
    }
    (row,) = bench.compare_phase(ladders, tmp_path, rounds=2, max_s=1e9)
    assert [s for _, s in calls[:4]] == ["none", "none", "gpu_augment,bf16", "workers"]  # plain, expert, pick, before
    assert [s for _, s in calls[4:]] == ["workers", "gpu_augment,bf16", "none", "none"]  # reversed
    assert row["before"] == "workers" and row["pick_vs_before"]["ratio"] == pytest.approx(2.0, rel=0.02)
    assert row["data_wait"]["before"] == pytest.approx(0.3) and row["data_wait"]["pick"] == pytest.approx(0.02)
    # each run's own figures kept, so a side that ran slower than the ladder's runs can be looked into
    assert [r["data_wait"] for r in row["per_run"]["before"]] == [0.3, 0.3] and len(row["per_run"]["pick"]) == 2
    assert row["per_run"]["pick"][0]["throughput"] == pytest.approx(256 / 0.004)  # the run's own, not the merge


def test_a_zoo_modules_data_is_prepared_before_anything_is_timed(monkeypatch, tmp_path):
    """resnet50_folder generates its JPEG folder once (``prepare``), with a lock, before the ladder."""
    bench = _load("zoo_bench")
    monkeypatch.setenv("ZOO_JPEG_DIR", str(tmp_path / "jpegs"))
    monkeypatch.setenv("ZOO_JPEG_N", "20")
    bench._prepare("resnet50_folder")
    files = sorted((tmp_path / "jpegs").rglob("*.jpg"))
    assert len(files) == 20 and (tmp_path / "jpegs" / ".complete").read_text() == "20"
    stamp = files[0].stat().st_mtime
    bench._prepare("resnet50_folder")  # once only
    assert files[0].stat().st_mtime == stamp
    bench._prepare("cifar_resnet")  # a module with no data to prepare: nothing happens


def test_the_zoo_table_prints_no_interval_where_a_side_had_too_few_runs():
    """The table once printed 2.81 [0.01,635.45] for two runs a side and pick/before [0.00,0.00]
    for one: numbers that read as an interval and are none."""
    from fastloop.compare import compare

    zoo = _load("zoo_bench")
    ci = compare(Runs("a", docs=[_doc(0.010), _doc(0.011)]), Runs("b", docs=[_doc(0.005), _doc(0.0052)]))
    assert "too few runs" in ci["verdict"] and zoo._span(ci) == f"{ci['ratio']:.2f} [n/a: too few runs]"
    ci3 = compare(
        Runs("a", docs=[_doc(0.010), _doc(0.011), _doc(0.0105)]),
        Runs("b", docs=[_doc(0.005), _doc(0.0052), _doc(0.0051)]),
    )
    assert "too few" not in ci3["verdict"]
    assert zoo._span(ci3) == f"{ci3['ratio']:.2f} [{ci3['ci_low']:.2f},{ci3['ci_high']:.2f}]"
    assert zoo._span({}) == "-"
