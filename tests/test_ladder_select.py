"""The selecting ladder on fakes with known effects: what hurts is dropped, what helps is kept,
the final measured set's CI holds the true combined ratio, the callbacks line is that set, and
the report says where the bottleneck went."""

from __future__ import annotations

import numpy as np

from fastloop.drivers.ladder import run_ladder

# true effect of each speedup on the mean step (multiplicative), and on data wait
EFFECT = {"workers": 0.8, "bf16": 1.25, "fused_optimizer": 1.0, "channels_last": 1.0}


def _fake(effects=EFFECT, base_s=0.010, wait=None, seed=0):
    rng = np.random.default_rng(seed)

    def measure(target, spec, **kw):
        names = [] if spec == "none" else [s.split(":")[0] for s in spec.split(",")]
        mean = base_s / np.prod([effects[n] for n in names]) if names else base_s
        steps = list(mean * (1 + 0.02 * rng.standard_normal()) * (1 + 0.01 * rng.standard_normal(30)))
        frac = wait(names) if wait else 0.0
        status = {n: "applied" for n in names}
        if "channels_last" in names:
            status["channels_last"] = "skipped"
        return {
            "step_s_all": steps,
            "items_per_step": 16,
            "throughput": {"value": 16 / mean, "unit": "samples/s"},
            "data_wait_frac": frac,
            "speedups": [
                {
                    "name": n,
                    "status": status[n],
                    "reason": "model has no Conv2d layers" if status[n] == "skipped" else "",
                }
                for n in names
            ],
            "loss": {"first": 1.0, "last": 0.5},
            "steps": 30,
            "warmup_steps": 5,
            "step_s": {},
        }

    return measure


def test_hurting_dropped_helping_kept_and_final_measured():
    doc = run_ladder(
        "x", ["workers", "bf16", "fused_optimizer", "channels_last"], measure=_fake(), device="cpu", mode="sequential"
    )
    by = {r["rung"]: r for r in doc["rungs"]}
    assert by["+workers"]["decision"].startswith("dropped")
    assert by["+bf16"]["decision"].startswith("kept") and by["+bf16"]["vs_spec"] == "none"
    assert by["+fused_optimizer"]["vs_spec"] == "bf16"  # tried on top of the best so far
    assert by["+fused_optimizer"]["decision"].startswith("dropped")
    cl = by["+channels_last"]  # skipped inside its process: no ratio, dropped
    assert cl["rung_status"] == "skipped" and cl["speedup_vs_prev"] is None
    assert doc["selected"] == ["bf16"]
    final = doc["rungs"][-1]
    assert final["final"] and final["spec"] == "bf16"
    ci = final["speedup_vs_baseline"]
    assert ci["ci_low"] <= 1.25 <= ci["ci_high"] and ci["significant"]
    assert doc["callbacks_line"] == 'Trainer(..., callbacks=fastloop.lightning.callbacks("bf16"))'
    # every run is in the run log, in order, with its configuration and seconds
    assert len(doc["run_log"]) == doc["runs"] > 0
    assert doc["run_log"][0]["spec"] == "none" and all(r["s"] >= 0 for r in doc["run_log"])
    assert {r["spec"] for r in doc["run_log"]} >= {"none", "bf16", "workers", "bf16,fused_optimizer"}


def test_two_kept_speedups_are_measured_together_against_the_baseline():
    effects = {"workers": 1.3, "bf16": 1.25, "fused_optimizer": 1.0}
    doc = run_ladder(
        "x", ["workers", "bf16", "fused_optimizer"], measure=_fake(effects), device="cpu", mode="sequential"
    )
    assert doc["selected"] == ["workers", "bf16"]
    final = doc["rungs"][-1]
    # measured afresh against the baseline, interleaved; 1.6x is clear after the first look (3 a side)
    assert final["spec"] == "workers,bf16" and final["repeats"] == 3
    ci = final["speedup_vs_baseline"]
    assert ci["ci_low"] <= 1.3 * 1.25 <= ci["ci_high"]
    assert 'callbacks("workers,bf16")' in doc["callbacks_line"]


def test_the_report_says_when_the_bottleneck_moves():
    # bf16 makes compute 2x faster; the loader stays the same, so the step becomes data-bound
    def wait(names):
        return 0.6 if "bf16" in names else 0.05

    effects = {"bf16": 1.5, "fused_optimizer": 1.0}
    doc = run_ladder(
        "x", ["bf16", "fused_optimizer"], measure=_fake(effects, wait=wait), device="cpu", mode="sequential"
    )
    base, bf16 = doc["rungs"][0], doc["rungs"][1]
    assert base["bottleneck"]["bottleneck"] != "data-bound"
    assert bf16["bottleneck"]["bottleneck"] == "data-bound"
    move = bf16["bottleneck_moved"]
    assert move.startswith("after bf16: data-bound") and "loader delivers" in move
    assert doc["moves"] == [move]
    from fastloop.report.markdown import render_markdown

    md = render_markdown({"kind": "ladder", "target": "x", "env": {}, **doc})
    assert "Bottleneck moved" in md and "data-bound" in md


def test_cumulative_mode_keeps_everything():
    doc = run_ladder("x", ["workers", "bf16"], measure=_fake(), device="cpu", mode="cumulative", max_repeats=3)
    assert doc["selected"] == ["workers", "bf16"]
    assert doc["rungs"][-1]["spec"] == "workers,bf16"


def test_a_failed_configuration_keeps_the_others(tmp_path):
    from fastloop.drivers.subproc import ConfigurationFailed

    inner = _fake()
    updates = []

    def measure(target, spec, **kw):
        if "fused_optimizer" in spec:
            raise ConfigurationFailed(f"configuration {spec!r} failed in its process: killed", -9)
        return inner(target, spec, **kw)

    doc = run_ladder(
        "x",
        ["bf16", "fused_optimizer", "workers"],
        measure=measure,
        device="cpu",
        on_update=updates.append,
        mode="sequential",
    )
    by = {r["rung"]: r for r in doc["rungs"]}
    assert by["+fused_optimizer"]["rung_status"] == "failed" and "killed" in by["+fused_optimizer"]["rung_reason"]
    assert by["+bf16"]["decision"].startswith("kept") and by["+workers"]["decision"].startswith("dropped")
    assert len(updates) > 10  # a document after every run
    # every partial document renders
    from fastloop.report import write_reports

    for u in updates[::7]:
        write_reports(
            {"kind": "ladder", "target": "x", "env": {}, "fastloop_version": "t", **u}, str(tmp_path / "r"), None
        )


def test_a_base_set_is_the_baseline_and_every_rung_builds_on_it():
    effects = {"tf32": 2.0, "workers": 0.8, "bf16": 1.25, "fused_optimizer": 1.0}
    doc = run_ladder(
        "x",
        ["workers", "bf16", "fused_optimizer"],
        measure=_fake(effects),
        device="cpu",
        base="tf32",
        mode="sequential",
    )
    by = {r["rung"]: r for r in doc["rungs"]}
    assert by["baseline (tf32)"]["spec"] == "tf32"
    assert by["+workers"]["vs_spec"] == "tf32" and by["+workers"]["decision"].startswith("dropped")
    assert by["+bf16"]["vs_spec"] == "tf32" and by["+fused_optimizer"]["vs_spec"] == "tf32,bf16"
    assert doc["base"] == ["tf32"] and doc["selected"] == ["bf16"]
    final = doc["rungs"][-1]
    assert final["spec"] == "tf32,bf16"
    ci = final["speedup_vs_baseline"]  # against the base set, not plain training: 1.25, not 2.5
    assert ci["ci_low"] <= 1.25 <= ci["ci_high"]
    assert 'callbacks("tf32,bf16")' in doc["callbacks_line"]


def test_a_rung_that_is_already_in_the_base_is_refused():
    import pytest

    from fastloop.errors import FastloopError

    with pytest.raises(FastloopError, match="already in --base"):
        run_ladder(
            "x",
            ["bf16", "tf32"],
            measure=_fake({"tf32": 1.0, "bf16": 1.0}),
            device="cpu",
            base="tf32",
            mode="sequential",
        )


def _with_profile(busy, wait, effects):
    inner = _fake(effects)

    def measure(target, spec, **kw):
        doc = inner(target, spec, **kw)
        doc["gpu_profile"] = {"gpu_busy_frac": busy, "profiled_steps": 3}
        doc["data_wait_frac"] = wait
        return doc

    return measure


def test_default_ladder_feeds_the_fast_step_last_and_skips_a_feed_that_cannot_help():
    effects = {"workers": 1.0, "bf16": 1.25, "fused_optimizer": 1.0}
    # the demo recipe's rungs are workers, bf16, fused_optimizer: data is tried last
    doc = run_ladder("demo", None, measure=_with_profile(0.98, 0.004, effects), device="cpu", mode="sequential")
    names = [r["rung"] for r in doc["rungs"] if r["rung"].startswith("+")]
    assert names == ["+bf16", "+fused_optimizer", "+workers"]
    w = next(r for r in doc["rungs"] if r["rung"] == "+workers")
    assert w["rung_status"] == "skipped" and "busy 98%" in w["rung_reason"] and "at most 1.020x" in w["rung_reason"]
    assert "step_s" not in w and "speedup_vs_prev" not in w  # not measured, no ratio
    # a GPU that idles: the feed is measured
    doc = run_ladder("demo", None, measure=_with_profile(0.6, 0.004, effects), device="cpu", mode="sequential")
    w = next(r for r in doc["rungs"] if r["rung"] == "+workers")
    assert w["rung_status"] == "applied" and w["speedup_vs_prev"] is not None
    # explicit rungs keep their order, and the cumulative story is not reordered
    doc = run_ladder(
        "demo", ["workers", "bf16"], measure=_with_profile(0.98, 0.004, effects), device="cpu", mode="sequential"
    )
    assert [r["rung"] for r in doc["rungs"]][1:3] == ["+workers", "+bf16"]


def test_a_rung_the_model_rules_out_is_not_measured():
    inner = _fake({"bf16": 1.25, "channels_last": 1.0, "fused_optimizer": 1.0})
    calls = []

    def measure(target, spec, **kw):
        calls.append(spec)
        doc = inner(target, spec, **kw)
        doc["model_checks"] = {"channels_last": "model has no Conv2d layers"}
        return doc

    doc = run_ladder(
        "x", ["bf16", "channels_last", "fused_optimizer"], measure=measure, device="cpu", mode="sequential"
    )
    cl = next(r for r in doc["rungs"] if r["rung"] == "+channels_last")
    assert cl["rung_status"] == "skipped" and cl["rung_reason"] == "not measured: model has no Conv2d layers"
    assert "step_s" not in cl and not any("channels_last" in c for c in calls)


def test_runs_record_which_speedups_the_model_rules_out():
    from fastloop.drivers.runner import run_configuration

    doc = run_configuration("tests/targets.py:tiny_mlp", "none", steps=2, warmup=1, device="cpu", steady_warmup=False)
    assert doc["model_checks"]["channels_last"] == "model has no Conv2d layers"
    assert "fused_loss" in doc["model_checks"] and "bf16" not in doc["model_checks"]


def test_a_batch_size_rung_is_measured_per_item_even_when_the_gpu_is_busy():
    """batch_size changes the loader but also the step's work: the feed rule must not skip it,
    and its longer step (more items) is compared per item, not per step (on an H200 the rule
    skipped it; an A/B called B122 '7.31x slower' by step time while it trained 1.04x faster)."""
    rng = np.random.default_rng(1)

    def measure(target, spec, **kw):
        big = "batch_size" in spec
        items = 128 if big else 16
        mean = 0.010 * items / 16 / (1.2 if big else 1.0)  # 8x the work per step, 1.2x the throughput
        steps = list(mean * (1 + 0.01 * rng.standard_normal(30)))
        return {
            "step_s_all": steps,
            "items_per_step": items,
            "throughput": {"value": items / mean, "unit": "samples/s"},
            "data_wait_frac": 0.001,
            "gpu_profile": {"gpu_busy_frac": 0.99},
            "speedups": [{"name": n, "status": "applied", "reason": ""} for n in spec.split(",") if n != "none"],
            "loss": {"first": 1.0, "last": 0.5},
            "steps": 30,
            "warmup_steps": 5,
            "step_s": {},
        }

    doc = run_ladder("x", ["bf16", "batch_size"], measure=measure, device="cpu", mode="sequential")
    by = {r["rung"]: r for r in doc["rungs"]}
    assert by["+bf16"]["decision"].startswith("dropped")  # the baseline (GPU busy 99%) is the best so far
    bs = by["+batch_size"]
    assert bs["rung_status"] == "applied" and bs["decision"].startswith("kept: 1.2")
    assert "per item" in bs["decision"] and bs["speedup_vs_prev"]["per"] == "item"
    assert doc["selected"] == ["batch_size"]
    assert abs(bs["throughput"]["value"] / by["baseline"]["throughput"]["value"] - 1.2) < 0.05


def test_a_recipes_own_rungs_come_after_the_general_compute_rungs():
    """On an H200 fp8 was tried before compile (registry order) and measured 2.86x slower
    eager, where it is not meant to run."""
    from fastloop.drivers.ladder import DEFAULT_RUNGS, select_order
    from fastloop.drivers.targets import recipe_rungs
    from fastloop.speedups.base import resolve

    RECIPE_RUNGS = {n: recipe_rungs(n)[1] for n in ("gpt", "imagenet")}

    order = [s.name for s in select_order(resolve(DEFAULT_RUNGS + RECIPE_RUNGS["gpt"]), set(RECIPE_RUNGS["gpt"]))]
    assert order.index("fp8") > order.index("compile") and order.index("fused_loss") > order.index("cuda_graph")
    assert order[-5:] == ["workers", "pad_buckets", "pin_memory", "prefetch", "dali"]  # the data rungs last
    assert sorted(order) == sorted(DEFAULT_RUNGS + RECIPE_RUNGS["gpt"])


def test_a_candidate_that_skips_itself_is_run_once():
    """channels_last skips itself in its process (the fake has no conv): further runs would only
    measure the base again, so the ladder runs it once and goes on; the base keeps its runs."""
    calls = []
    inner = _fake()

    def measure(target, spec, **kw):
        calls.append(spec)
        return inner(target, spec, **kw)

    doc = run_ladder("x", ["bf16", "channels_last"], measure=measure, device="cpu", mode="sequential")
    cl = next(r for r in doc["rungs"] if r["rung"] == "+channels_last")
    assert cl["rung_status"] == "skipped" and cl["repeats"] == 1 and cl["speedup_vs_prev"] is None
    assert calls.count("bf16,channels_last") == 1
    assert doc["selected"] == ["bf16"] and doc["rungs"][-1]["speedup_vs_baseline"]["significant"]


def test_the_report_says_which_runs_measure_s_cut_and_keeps_skip_reasons_in_one_place():
    from fastloop.report.markdown import render_markdown

    def measure(target, spec, **kw):  # a slow baseline cut to 10 of 30 steps, a fast candidate not cut
        slow = spec == "none"
        doc = _fake({"bf16": 3.0, "channels_last": 1.0})(target, spec, **kw)
        doc.update(steps=10 if slow else 30, steps_planned=30, measure_s=3.0, warmup_steps=7)
        doc["step_s_all"] = doc["step_s_all"][: doc["steps"]]
        return doc

    doc = run_ladder("x", ["bf16", "channels_last"], measure=measure, device="cpu", mode="sequential")
    md = render_markdown({"kind": "ladder", "target": "x", "env": {}, **doc})
    assert "Measured 10-30 steps after 7 warm-up." in md
    assert "Runs whose 30 steps would have taken over 3 s measured fewer (--measure-s)." in md
    row = next(line for line in md.splitlines() if line.startswith("| +channels_last"))
    assert row.startswith("| +channels_last (skipped) |") and row.count("model has no Conv2d layers") == 1


def test_partial_updates_refresh_the_html_only_every_few_seconds(tmp_path):
    """During a ladder report.json/md follow every run; report.html (plots) at most every
    HTML_EVERY_S seconds; the final write refreshes all three."""
    from fastloop.report import write_reports

    out = tmp_path / "r"
    first = {
        "kind": "ladder",
        "target": "x",
        "env": {},
        "fastloop_version": "t",
        **run_ladder("x", ["bf16"], measure=_fake(), device="cpu", mode="sequential"),
    }
    write_reports(first, str(out), None)
    html_before = (out / "report.html").read_text()
    later = {**first, "partial": True, "runs": first["runs"] + 1}
    written = write_reports(later, str(out), None, html=False)
    assert written == [str(out / "report.json"), str(out / "report.md")]
    assert (out / "report.html").read_text() == html_before and "In progress" in (out / "report.md").read_text()
    write_reports(later, str(out), None)
    assert (out / "report.html").read_text() != html_before


def test_run_ladder_passes_measure_s_to_its_fresh_process_runs(monkeypatch):
    import fastloop.drivers.ladder.run as ladder_mod  # where run_ladder finds its process runner

    seen = []
    fake = _fake()

    def recording(target, spec, **kw):
        seen.append(kw.get("measure_s"))
        return fake(target, spec, **kw)

    monkeypatch.setattr(ladder_mod, "run_in_subprocess", recording)
    run_ladder("x", ["bf16"], device="cpu", mode="sequential")
    assert seen and set(seen) == {1.0}  # the CPU default
    seen.clear()
    run_ladder("x", ["bf16"], device="cpu", measure_s=None, mode="sequential")
    assert seen and set(seen) == {None}


def test_a_clearly_slower_candidate_is_dropped_after_one_run_and_a_close_or_helpful_one_is_not():
    """On an H200 fp8 (0.93x) and the fused loss (0.63x) each cost three fresh processes of
    15-26 s in the GPT ladder. A candidate whose first run is clearly slower than the best
    configuration's runs is now dropped after that run; one within the noise, or faster, gets
    the full comparison (an early look can drop, never keep)."""
    effects = {"workers": 1.25, "bf16": 0.6, "fused_optimizer": 0.995, "compile": 1.3}
    calls = []
    inner = _fake(effects)

    def measure(target, spec, **kw):
        calls.append(spec)
        return inner(target, spec, **kw)

    doc = run_ladder(
        "x", ["workers", "bf16", "fused_optimizer", "compile"], measure=measure, device="cpu", mode="sequential"
    )
    by = {r["rung"]: r for r in doc["rungs"]}
    b = by["+bf16"]
    assert calls.count("workers,bf16") == 1 and b["runs_per_side"] == 1 and b["repeats"] == 1
    assert (
        b["decision"].startswith("dropped after one run: workers,bf16 is slower than workers:")
        and "prediction interval" in b["decision"]
    )
    ci = b["speedup_vs_prev"]
    assert ci["runs"] == 1 and ci["ci_high"] < 1 and ci["ratio"] < 0.98
    assert calls.count("workers,fused_optimizer") >= 3 and by["+fused_optimizer"]["decision"].startswith("dropped: ")
    assert calls.count("workers,compile") >= 3 and by["+compile"]["decision"].startswith("kept")
    assert doc["selected"] == ["workers", "compile"]
    # three looks share the 3% (Bonferroni): each comparison on reused runs is at 99%
    assert abs(by["+fused_optimizer"]["speedup_vs_prev"]["confidence"] - 0.99) < 1e-9
    assert "first run is a look too" in doc["method"]
    # the first comparison (no runs of its base yet) and the cumulative story never stop after one run
    doc = run_ladder("x", ["bf16", "fused_optimizer"], measure=_fake(effects), device="cpu", mode="sequential")
    assert doc["rungs"][1]["runs_per_side"] >= 3
    doc = run_ladder("x", ["workers", "bf16"], measure=_fake(effects), device="cpu", mode="cumulative")
    assert all(r["runs_per_side"] >= 3 for r in doc["rungs"] if r["rung"].startswith("+"))


def test_one_run_interval_holds_its_false_drop_rate_under_the_null():
    """The prediction interval of one run against three: with equal spread and no effect, a run
    is called slower at most (1 - confidence) / 2 of the time (here 0.5%); it sees a 10% loss."""
    from fastloop.measure.stats import one_run_ci

    rng = np.random.default_rng(7)
    slower = 0
    for _ in range(2000):
        runs = [list(0.01 * (1 + 0.02 * rng.standard_normal()) * np.ones(10)) for _ in range(4)]
        ci = one_run_ci(runs[:3], runs[3], confidence=0.99)
        slower += ci.significant and ci.ratio < 1
    assert slower / 2000 < 0.01
    seen = sum(
        one_run_ci(
            [list(0.01 * (1 + 0.002 * rng.standard_normal()) * np.ones(10)) for _ in range(3)],
            list(0.011 * np.ones(10)),
            confidence=0.99,
        ).significant
        for _ in range(200)
    )
    assert seen > 190


def test_a_feed_is_not_measured_when_neither_clock_spends_much_getting_batches():
    """GPT on the H200: GPU busy 93% (under the 95% rule) but data wait 0.3%: workers,
    pin_memory and prefetch each cost a ~12 s run to learn they could not help. A feed can give
    back at most the GPU's idle time while the batch comes, or the host's time getting it."""
    effects = {"workers": 1.0, "bf16": 1.25, "fused_optimizer": 1.0}

    def with_host(host):
        inner = _with_profile(0.93, 0.003, effects)

        def measure(target, spec, **kw):
            doc = inner(target, spec, **kw)
            doc["host_wait_frac"] = host
            return doc

        return measure

    doc = run_ladder("demo", None, measure=with_host(0.01), device="cpu", mode="sequential")
    w = next(r for r in doc["rungs"] if r["rung"] == "+workers")
    assert w["rung_status"] == "skipped" and "1.0% of its step's host time" in w["rung_reason"]
    assert "waits for them 0.3%" in w["rung_reason"] and "at most 1.010x" in w["rung_reason"]
    assert "step_s" not in w
    doc = run_ladder(
        "demo", None, measure=with_host(0.2), device="cpu", mode="sequential"
    )  # a host-bound loader: measured
    w = next(r for r in doc["rungs"] if r["rung"] == "+workers")
    assert w["rung_status"] == "applied" and w["speedup_vs_prev"] is not None


def test_the_timer_reports_the_hosts_share_getting_batches():
    import time

    from fastloop.measure.timer import StepTimer

    t = StepTimer("cpu", warmup=1)
    for _ in range(6):
        t.fetch_start()
        time.sleep(0.004)
        t.fetch_end()
        time.sleep(0.012)
        t.step_end()
    r = t.result()
    assert r.host_wait_frac == r.data_wait_frac and 0.15 < r.host_wait_frac < 0.4


def _quiet(effects, run_noise):
    """A fake whose fresh runs differ by ``run_noise`` (relative) around the true effect."""
    rng = np.random.default_rng(3)

    def measure(target, spec, **kw):
        names = [] if spec == "none" else spec.split(",")
        mean = 0.010 / np.prod([effects[n] for n in names]) if names else 0.010
        steps = list(mean * (1 + run_noise * rng.standard_normal()) * np.ones(30))
        return {
            "step_s_all": steps,
            "items_per_step": 16,
            "throughput": {"value": 16 / mean, "unit": "samples/s"},
            "data_wait_frac": 0.0,
            "speedups": [{"name": n, "status": "applied", "reason": ""} for n in names],
            "loss": {"first": 1.0, "last": 0.5},
            "steps": 30,
            "warmup_steps": 5,
            "step_s": {},
        }

    return measure


def test_a_comparison_stops_once_the_candidate_can_be_at_most_one_percent_faster():
    """On an H200 workers on the compiled GPT step (1.00x) ran up to 6 processes a side. With
    quiet runs the interval excludes a 1% gain after 3 a side: dropped there. With noisy runs it
    does not, and the comparison goes on to max_repeats (the rule cannot cut a real gain short)."""
    effects = {"bf16": 1.5, "workers": 1.0}
    calls: list[str] = []
    inner = _quiet(effects, 0.0005)

    def measure(target, spec, **kw):
        calls.append(spec)
        return inner(target, spec, **kw)

    doc = run_ladder("x", ["bf16", "workers"], measure=measure, device="cpu", max_repeats=6, mode="sequential")
    w = {r["rung"]: r for r in doc["rungs"]}["+workers"]
    assert w["runs_per_side"] == 3 and calls.count("workers") == 3  # a feed: tried first here
    assert w["speedup_vs_prev"]["ci_high"] < 1.01 and w["speedup_vs_prev"]["futile"]
    assert "at most" in w["decision"] and "no more runs after 3 a side" in w["decision"]
    assert doc["selected"] == ["bf16"]
    noisy = run_ladder(
        "x", ["bf16", "workers"], measure=_quiet(effects, 0.03), device="cpu", max_repeats=6, mode="sequential"
    )
    w = {r["rung"]: r for r in noisy["rungs"]}["+workers"]
    assert w["runs_per_side"] == 6 and not w["speedup_vs_prev"].get("futile")
    # the cumulative story measures its rungs to the end: no futility stop there
    cum = run_ladder("x", ["bf16", "workers"], measure=_quiet(effects, 0.0005), device="cpu", mode="cumulative")
    assert not {r["rung"]: r for r in cum["rungs"]}["+workers"]["speedup_vs_prev"].get("futile")


def test_a_copy_speedup_is_weighed_against_the_copy_alone(monkeypatch):
    """GPT on the H200: the loader took 1.5 ms of host time a batch (4.9% of the
    compiled step), the copy to the device a small part of it, and the GPU waited 0.2%. The copy
    speedup then ran 11 runs to learn ~1.00x. Workers and prefetch (whose thread builds the next
    batches off the step's path) can give back the loader's time and are measured;
    pin_memory only the copy's, and is not."""
    from fastloop.speedups.pin_memory import PinMemory
    from fastloop.speedups.prefetch import Prefetch

    for cls in (PinMemory, Prefetch):  # the fake measures nothing: let them be tried on this CPU
        monkeypatch.setattr(cls, "needs_cuda", False)
    effects = {"workers": 1.0, "pin_memory": 1.0, "prefetch": 1.0, "bf16": 1.25, "fused_optimizer": 1.0}
    inner = _with_profile(0.93, 0.002, effects)

    def measure(target, spec, **kw):
        doc = inner(target, spec, **kw)
        doc.update(host_wait_frac=0.049, host_fetch_s=0.0015, host_copy_s=0.00008)
        return doc

    doc = run_ladder(
        "demo",
        ["bf16", "fused_optimizer", "workers", "pin_memory", "prefetch"],
        measure=measure,
        device="cpu",
        mode="sequential",
    )
    by = {r["rung"]: r for r in doc["rungs"]}
    for name in ("+workers", "+prefetch"):
        assert by[name]["rung_status"] == "applied" and by[name]["speedup_vs_prev"] is not None, by[name]
    for name in ("+pin_memory",):
        r = by[name]
        assert r["rung_status"] == "skipped" and "copying batches to the device" in r["rung_reason"], r
        assert (
            "0.3% of its step's host time" in r["rung_reason"]
            and "a faster copy could gain at most" in r["rung_reason"]
        )

    # without the copy's own time the whole fetch counts (4.9% > 2%): measured
    def whole(target, spec, **kw):
        doc = inner(target, spec, **kw)
        doc.update(host_wait_frac=0.049)
        return doc

    doc = run_ladder("demo", ["bf16", "pin_memory"], measure=whole, device="cpu", mode="sequential")
    assert next(r for r in doc["rungs"] if r["rung"] == "+pin_memory")["rung_status"] == "applied"


def test_the_report_lists_what_the_selected_sets_speedups_changed_not_a_dropped_rungs():
    """A U-Net's report listed ``workers: 8 worker processes`` under a pick without workers
    (the line came from a rung measured and dropped)."""
    from fastloop.report.markdown import render_markdown

    inner = _fake()  # workers hurts there (dropped), bf16 helps (kept)

    def measure(target, spec, **kw):
        doc = inner(target, spec, **kw)
        for rec in doc["speedups"]:
            rec["detail"] = {"workers": "8 worker processes", "bf16": "Trainer precision 32-true -> bf16-mixed"}[
                rec["name"]
            ]
        return doc

    doc = run_ladder("x", ["workers", "bf16"], measure=measure, device="cpu", mode="sequential")
    assert doc["selected"] == ["bf16"]
    md = render_markdown({"kind": "ladder", "target": "x", "env": {}, **doc})
    changed = md.split("What the applied speedups changed:")[1]
    assert "`bf16`: Trainer precision 32-true -> bf16-mixed" in changed and "worker processes" not in changed, changed


def test_a_sequential_ladder_whose_budget_ends_before_a_candidates_first_run_lists_it_not_tried(monkeypatch):
    """A sequential (or cumulative) comparison the budget stops before the candidate's first run
    ended the ladder in an IndexError; the candidate is now listed not tried (budget, with the
    arithmetic), and the ladder ends with its final comparison as usual. Each run costs 1 s on a
    fake clock: the baseline and bf16 take 6 s, and the next candidate's first run would not fit
    in 6.5 s."""
    import time

    from tests.ladder_sim import FakeClock

    clock = FakeClock()
    monkeypatch.setattr(time, "perf_counter", clock)
    inner = _fake({"bf16": 1.25, "fused_optimizer": 1.0, "workers": 1.0})

    def measure(target, spec, **kw):
        clock.spend(1.0)
        return inner(target, spec, **kw)

    for mode in ("sequential", "cumulative"):
        doc = run_ladder("x", ["bf16", "fused_optimizer"], measure=measure, device="cpu", mode=mode, budget=6.5)
        assert [r["rung"] for r in doc["rungs"]] == ["baseline", "+bf16", "selected: bf16"], doc["rungs"]
        assert [t["name"] for t in doc["not_tried"]] == ["fused_optimizer"] and doc["not_tried"][0]["why"] == "budget"
        assert doc["selected"] == ["bf16"] and doc["rungs"][-1]["final"]
