"""Sizes measured where they run: the worker count the probe chose alone is
measured against the counts around it in the whole configuration, and the one that trains fastest
is kept (a smaller one also when it is not missed); the report lists each count measured there."""

from __future__ import annotations

import numpy as np

from fastloop.drivers.ladder import run_ladder
from fastloop.speedups import REGISTRY

RATES = {"0": 900.0, "1": 1500.0, "2": 2900.0, "4": 5600.0, "8": 9800.0, "16": 14300.0}


def _fake(train_rate: dict[int, float], seed: int = 0):
    """A data-bound module: without workers the step waits 50%; with N workers it trains at
    ``train_rate[N]`` (relative), as a U-Net whose 16 workers crowd the training process. A plain
    ``workers`` run sizes itself to 16 (the fastest alone), as the probe does."""
    rng = np.random.default_rng(seed)

    def measure(target, spec, **kw):
        names = [] if spec == "none" else spec.split(",")
        count = next((16 if n == "workers" else int(n.split(":")[1]) for n in names if n.split(":")[0] == "workers"), 0)
        speed = (train_rate[count] if count else 0.5) * (1.5 if "bf16" in names else 1.0)
        mean = 0.010 / speed
        steps = list(mean * (1 + 0.01 * rng.standard_normal()) * (1 + 0.005 * rng.standard_normal(60)))
        extra = {"num_workers": count, "loader_rates": dict(RATES)} if count else {}
        return {
            "step_s_all": steps,
            "items_per_step": 16,
            "throughput": {"value": 16 / mean, "unit": "samples/s"},
            "data_wait_frac": 0.5 if not count else 0.3 if count == 16 else 0.1,
            "step_s": {"mean": mean},
            "speedups": [{"name": n.split(":")[0], "status": "applied", "reason": ""} for n in names],
            "loss": {"first": 1.0, "last": 0.5},
            "steps": 60,
            "warmup_steps": 5,
            "extra": extra,
        }

    return measure


def _sized(doc):
    return [r for r in doc["rungs"] if r.get("sized")]


def test_a_count_that_trains_faster_in_the_configuration_replaces_the_one_chosen_alone():
    doc = run_ladder("x", ["workers", "bf16"], device="cpu", measure=_fake({16: 1.0, 8: 1.25, 4: 1.1}))
    rung = _sized(doc)[0]
    assert rung["rung"] == "workers:8 (in place of workers, which chose 16 alone)"
    assert rung["decision"].startswith("kept workers:8: 1.25x the 16 chosen alone, faster"), rung["decision"]
    assert "workers:8" in doc["selected"] and "workers" not in doc["selected"]
    stage = next(s for s in doc["stages"] if s["stage"] == "sizes measured in the configuration")
    assert stage["action"] == "workers chose 16 measured alone; measured in the configuration: workers:8"
    assert doc["rungs"][-1]["final"] and doc["rungs"][-1]["spec"].split(",").count("workers:8") == 1


def test_fewer_workers_not_missed_are_kept_and_more_that_are_slower_are_not():
    tie = run_ladder("x", ["workers", "bf16"], device="cpu", measure=_fake({16: 1.0, 8: 1.0, 4: 0.9}))
    assert "workers:8" in tie["selected"], [r.get("decision") for r in _sized(tie)]
    assert "fewer, not missed" in _sized(tie)[0]["decision"]
    slower = run_ladder("x", ["workers", "bf16"], device="cpu", measure=_fake({16: 1.0, 8: 0.8, 4: 0.7}))
    # the probe's 16 stays, pinned (the size the configuration was measured with), not re-probed
    assert "workers:16" in slower["selected"] and "workers" not in slower["selected"]
    assert _sized(slower)[0]["decision"].startswith("kept workers (16): workers:8 0.80x")


def test_the_size_kept_in_the_configuration_is_pinned_for_the_final_and_the_users_line():
    """A U-Net on an H100: sized in the configuration to 8, the final run's own probe chose
    16 and waited twice as long for data. The kept size is pinned, so the final comparison runs it."""
    probe_choices = iter([16, 8] + [16] * 200)  # the second run of plain ``workers`` probes 8 (noise)
    fake = _fake({16: 1.0, 8: 0.8, 4: 0.7})

    def measure(target, spec, **kw):
        doc = fake(target, spec, **kw)
        if "workers" in spec.split(","):
            doc["extra"]["num_workers"] = next(probe_choices)
        return doc

    doc = run_ladder("x", ["workers", "bf16"], device="cpu", measure=measure)
    assert doc["selected"] == ["workers:16", "bf16"], doc["selected"]
    final = doc["rungs"][-1]
    assert final["final"] and "workers:16" in final["spec"].split(",") and "workers" not in final["spec"].split(",")
    stage = [s["action"] for s in doc["stages"] if s["stage"] == "sizes measured in the configuration"]
    assert "workers pinned to workers:16: the size its runs in the configuration trained with" in stage, stage
    assert final["extra"]["num_workers"] == 16


def test_pinning_keeps_only_the_runs_that_trained_with_the_pinned_size():
    """The configuration's runs whose probe chose another size are not counted as the pinned
    configuration's runs; its run costs carry over for the budget."""
    from fastloop.compare import Runs
    from fastloop.drivers.ladder.budget import Budget
    from fastloop.drivers.ladder.moves import Moves
    from fastloop.drivers.ladder.sizing import Sizing
    from fastloop.drivers.ladder.state import LadderState

    budget = Budget(None)
    for cost, warm in ((3.0, 0.5), (3.2, 0.4)):
        budget.record("bf16,workers", cost, warm)
    state = LadderState(
        "x", steps=10, warmup=2, device="cpu", measure=_fake({}), budget=budget, max_repeats=5, mode="select"
    )
    docs = [{"extra": {"num_workers": n}, "i": i, "step_s_all": [0.01] * 5} for i, n in enumerate([8, 16, 8])]
    state.keep(["bf16", "workers"], Runs("bf16,workers", docs), vs_spec="bf16", vs_runs=Runs("bf16"), ci=None)
    sizing = Sizing(state, Moves(state))
    sizing.pin("workers", 8, "sizes measured in the configuration")
    assert state.selected == ["bf16", "workers:8"]
    assert [d["i"] for d in state.best().docs] == [0, 2] and state.best().spec == "bf16,workers:8"
    assert (
        budget.warm_costs("bf16,workers:8") == budget.warm_costs("bf16,workers")
        and budget.runs_of("bf16,workers:8") == 2
    )
    notes = [s["action"] for s in state.document()["stages"]]
    assert notes == ["workers pinned to workers:8: the size its runs in the configuration trained with"]
    sizing.pin("workers", 8, "again")  # already pinned: nothing changes
    assert state.selected == ["bf16", "workers:8"] and len(state.document()["stages"]) == 1


def test_the_sizes_around_the_probes_choice():
    w = REGISTRY["workers"].ladder.sized
    assert w.around({"num_workers": 4, "loader_rates": RATES}) == (4, [2, 8])
    assert w.around({"num_workers": 1, "loader_rates": RATES}) == (1, [2])  # 0 is no workers at all
    assert w.around({"loader_rates": RATES}) == (None, [])
    # the user's loader had 4 workers: 4 and fewer are not this speedup's to measure
    assert w.around({"num_workers": 8, "loader_own_workers": 4, "loader_rates": RATES}) == (8, [16])
    assert REGISTRY["bf16"].ladder.sized is None


def test_a_bundle_that_still_waits_for_data_is_ablated_after_the_workers_are_sized():
    """A U-Net's pattern: the feed fixed first (16 workers, the fastest alone), the compute
    bundle kept, the faster step still waiting 30% for data: the worker count is measured in the
    configuration before the bundle's members are taken out (taken out behind a wait, a member
    looks not missed)."""
    doc = run_ladder("x", ["workers", "bf16", "compile"], device="cpu", measure=_fake({16: 1.0, 8: 1.25, 4: 1.1}))
    names = [r["rung"] for r in doc["rungs"]]
    sized = next(i for i, r in enumerate(doc["rungs"]) if r.get("sized"))
    ablations = [i for i, r in enumerate(doc["rungs"]) if r.get("ablation") in ("bf16", "compile")]
    assert ablations and sized < min(ablations), names
    assert any(s["action"].startswith("its ablation waits until the feed is checked") for s in doc["stages"])
    assert "workers:8" in doc["selected"]


def _crowded(
    plain: dict[int, float] | None = None,
    pinned: float = 1.0,
    seed: int = 0,
    feeds_fast: dict[int, float] | None = None,
):
    """A U-Net on an H100: the user's loader has 4 workers. Without the compute stack 16
    workers (the probe's choice) feed fastest (``plain``: the feed rate by count; the baseline
    waits 40% by default); with it, the faster step's process needs cores, and 16 workers feed no
    faster than the user's 4, where 8 feed fastest (``pinned``: pinned memory's factor on the
    feed). Rates relative; the step's own rate is 1 plain, 2 with bf16."""
    rng = np.random.default_rng(seed)
    feeds = {False: plain or {4: 0.6, 8: 1.0, 16: 1.2}, True: feeds_fast or {4: 1.2, 8: 1.5, 16: 1.2}}

    def measure(target, spec, **kw):
        names = [] if spec == "none" else spec.split(",")
        sized = [n for n in names if n.split(":")[0] == "workers"]
        count = (16 if sized[0] == "workers" else int(sized[0].split(":")[1])) if sized else 4
        step = 2.0 if "bf16" in names else 1.0
        speed = min(step, feeds["bf16" in names][count] * (pinned if "pin_memory" in names else 1.0))
        mean = 0.010 / speed
        steps = list(mean * (1 + 0.01 * rng.standard_normal()) * (1 + 0.005 * rng.standard_normal(60)))
        extra = {"num_workers": count, "loader_own_workers": 4, "loader_rates": dict(RATES)} if sized else {}
        return {
            "step_s_all": steps,
            "items_per_step": 16,
            "throughput": {"value": 16 / mean, "unit": "samples/s"},
            "data_wait_frac": 1 - speed / step,
            "step_s": {"mean": mean},
            "speedups": [{"name": n.split(":")[0], "status": "applied", "reason": ""} for n in names],
            "loss": {"first": 1.0, "last": 0.5},
            "steps": 60,
            "warmup_steps": 5,
            "extra": extra,
        }

    return measure


def test_a_feed_bundle_kept_first_has_its_count_sized_before_it_is_ablated(monkeypatch):
    """The probe's 16 workers, no faster than the user's 4 once the compute stack runs, would be
    removed as not missed and no count measured in the configuration (a U-Net on an H100). Sized
    first, 8 is measured in their place and kept, and the ablation then measures the user's 4
    against 8: the report shows each count measured where it runs."""
    for name in ("pin_memory", "prefetch"):  # CUDA-only: on this CPU, let the fake feed bundle have them
        monkeypatch.setattr(REGISTRY[name], "why_not", lambda self, ctx: None)
    doc = run_ladder("x", ["workers", "pin_memory", "prefetch", "bf16", "compile"], device="cpu", measure=_crowded())
    rungs = doc["rungs"]
    sized = next(i for i, r in enumerate(rungs) if r.get("sized"))
    assert rungs[sized]["rung"] == "workers:8 (in place of workers, which chose 16 alone)", [r["rung"] for r in rungs]
    assert rungs[sized]["decision"].startswith("kept workers:8"), rungs[sized]["decision"]
    ablated = next(r for r in rungs if r.get("ablation") == "workers:8")
    assert rungs.index(ablated) > sized and ablated["decision"].startswith("kept workers:8"), ablated["decision"]
    assert "workers:8" in doc["selected"] and "workers" not in doc["selected"]
    assert sum(1 for r in rungs if r.get("sized")) == 1  # not sized a second time after the feed re-check


def test_a_feed_bundle_measured_after_the_compute_stack_is_sized_before_it_is_ablated(monkeypatch):
    """That U-Net exactly: the baseline waits 10%, so the compute stack comes first; its
    faster step waits 40%; the feed bundle is kept for its pinned memory, and its 16 workers are
    no faster than the user's 4. The count is measured in the configuration (8, kept) before the
    bundle is ablated."""
    for name in ("pin_memory", "prefetch"):
        monkeypatch.setattr(REGISTRY[name], "why_not", lambda self, ctx: None)
    doc = run_ladder(
        "x",
        ["workers", "pin_memory", "prefetch", "bf16", "compile"],
        device="cpu",
        measure=_crowded({4: 0.9, 8: 1.0, 16: 1.0}, pinned=1.2),
    )
    rungs, stages = doc["rungs"], [s["stage"] for s in doc["stages"]]
    assert "feed first (the baseline waits for data)" not in stages and "feed checked for the faster step" in stages
    sized = next(i for i, r in enumerate(rungs) if r.get("sized"))
    assert rungs[sized]["decision"].startswith("kept workers:8"), rungs[sized]["decision"]
    ablated = next(r for r in rungs if r.get("ablation") == "workers:8")
    assert rungs.index(ablated) > sized and ablated["decision"].startswith("kept workers:8"), ablated["decision"]
    assert {"workers:8", "pin_memory", "bf16"} <= set(doc["selected"])


def test_a_count_the_probe_kept_alone_is_measured_larger_in_the_configuration(monkeypatch):
    """A U-Net on an H100: in the feed bundle `workers` skipped itself (its probe alone:
    "8 workers would save the main process 9.9% of its time, under 10%"), so the user's 4 stayed,
    the bundle was kept for its pinned memory, and the pick still waited 20% for data. The larger
    counts the probe measured are now added in the configuration in turn: 8 trains faster and is
    kept, 16 does not and is not."""
    for name in ("pin_memory", "prefetch"):
        monkeypatch.setattr(REGISTRY[name], "why_not", lambda self, ctx: None)
    rng = np.random.default_rng(0)
    feeds = {False: {4: 0.9, 8: 1.0, 16: 1.0}, True: {4: 1.2, 8: 1.5, 16: 1.3}}

    def measure(target, spec, **kw):
        names = [] if spec == "none" else spec.split(",")
        sized = [n for n in names if n.startswith("workers:")]
        count = int(sized[0].split(":")[1]) if sized else 4
        step = 2.0 if "bf16" in names else 1.0
        speed = min(step, feeds["bf16" in names][count] * (1.2 if "pin_memory" in names else 1.0))
        mean = 0.010 / speed
        steps = list(mean * (1 + 0.01 * rng.standard_normal()) * (1 + 0.005 * rng.standard_normal(60)))
        probe = "workers" in names
        records = [
            {
                "name": n.split(":")[0],
                "status": "skipped" if n == "workers" else "applied",
                "reason": "8 workers would save the main process 9.9% of its time, under 10%" if n == "workers" else "",
            }
            for n in names
        ]
        return {
            "step_s_all": steps,
            "items_per_step": 16,
            "throughput": {"value": 16 / mean, "unit": "samples/s"},
            "data_wait_frac": 1 - speed / step,
            "step_s": {"mean": mean},
            "speedups": records,
            "loss": {"first": 1.0, "last": 0.5},
            "steps": 60,
            "warmup_steps": 5,
            "extra": {"loader_own_workers": 4, "loader_rates": dict(RATES)} if probe else {},
        }

    doc = run_ladder("x", ["workers", "pin_memory", "prefetch", "bf16", "compile"], device="cpu", measure=measure)
    sized = [r for r in doc["rungs"] if r.get("sized") == "workers"]
    assert [r["rung"] for r in sized] == [
        "+workers:8 (the probe alone kept the loader's own 4)",
        "workers:16 (in place of workers:8)",
    ], [r["rung"] for r in doc["rungs"]]
    assert sized[0]["decision"].startswith("kept") and sized[1]["decision"].startswith("kept workers:8: workers:16 0.8")
    assert sized[1]["spec"].split(",").count("workers:16") == 1 and "workers:8" not in sized[1]["spec"].split(",")
    stage = next(s for s in doc["stages"] if s["stage"] == "sizes measured in the configuration")
    assert stage["action"].startswith("workers kept the loader's own 4 measured alone; the step waits")
    assert "workers:8" in doc["selected"] and "workers:16" not in doc["selected"] and "pin_memory" in doc["selected"]


def test_a_feed_bundle_dropped_at_the_count_chosen_alone_is_measured_again_one_count_down(monkeypatch):
    """A U-Net on an H100: the compute stack first (the baseline waits 10%), its faster
    step waits for data; the feed bundle with the probe's 16 workers, which crowd the training
    process, trains no faster than the user's 4 and is dropped as a tie, so no count was measured
    where it runs. The bundle is now measured once more with 8 in place of 16, kept, and its count
    ablated against the user's 4."""
    for name in ("pin_memory", "prefetch"):
        monkeypatch.setattr(REGISTRY[name], "why_not", lambda self, ctx: None)
    doc = run_ladder(
        "x",
        ["workers", "pin_memory", "prefetch", "bf16", "compile"],
        device="cpu",
        measure=_crowded({4: 0.9, 8: 1.0, 16: 1.0}, feeds_fast={4: 1.0, 8: 1.6, 16: 1.0}),
    )
    rungs = doc["rungs"]
    labels = [r["rung"] for r in rungs]
    first = labels.index("+workers,pin_memory,prefetch (feed bundle)")
    assert rungs[first]["decision"].startswith("dropped"), rungs[first]["decision"]
    assert rungs[first]["decision"].endswith("; measured again with workers:8")
    assert not any(t["other"] == rungs[first]["spec"] for t in doc["ties"])  # no longer reported as a tie kept simpler
    again = rungs[first + 1]
    assert (
        again["rung"] == ("+workers,pin_memory,prefetch (feed bundle) with workers:8 (in place of the 16 chosen alone)")
        and again["sized"] == "workers"
    ), labels
    assert again["decision"].startswith("kept"), again["decision"]
    assert "workers:8" in again["spec"].split(",") and "workers" not in again["spec"].split(",")
    assert "workers:8" in doc["selected"] and "workers" not in doc["selected"]
    assert any(r.get("ablation") == "workers:8" for r in rungs[first + 2 :]), labels
    assert any("measured again with workers:8" in s["action"] for s in doc["stages"])


def test_a_feed_bundle_is_not_measured_again_where_the_count_is_not_what_held_it_back(monkeypatch):
    """Where 8 workers feed no faster than 16 in the configuration, the second measurement is
    made once and dropped too: no third, and the pick has no workers."""
    for name in ("pin_memory", "prefetch"):
        monkeypatch.setattr(REGISTRY[name], "why_not", lambda self, ctx: None)
    doc = run_ladder(
        "x",
        ["workers", "pin_memory", "prefetch", "bf16", "compile"],
        device="cpu",
        measure=_crowded({4: 0.9, 8: 1.0, 16: 1.0}, feeds_fast={4: 1.0, 8: 1.0, 16: 1.0}),
    )
    bundles = [r for r in doc["rungs"] if r["rung"].startswith("+workers,pin_memory,prefetch (feed bundle)")]
    assert len(bundles) == 2 and all(r["decision"].startswith("dropped") for r in bundles), [r["rung"] for r in bundles]
    assert not any(s.startswith("workers") for s in doc["selected"])


def test_the_feed_kept_after_the_compute_stack_is_ablated_with_it_costliest_first(monkeypatch):
    """Two U-Net ladders on an H100: the compute bundle's ablation waited for the feed; the
    feed bundle, kept and sized, was ablated at once (its count, prefetch), then the compute
    members, and the budget ran out at channels_last and bf16 both times. Now the feed kept after
    the compute stack is ablated together with the compute bundle, in the one order (compile,
    graphs, precision, layout, then processes and prefetch): what the budget leaves untried is the
    cheapest to keep."""
    from fastloop.drivers.ladder.candidates import ablation_order

    for name in ("pin_memory", "prefetch"):
        monkeypatch.setattr(REGISTRY[name], "why_not", lambda self, ctx: None)
    doc = run_ladder(
        "x",
        ["workers", "pin_memory", "prefetch", "bf16", "compile"],
        device="cpu",
        measure=_crowded({4: 0.9, 8: 1.0, 16: 1.0}, pinned=1.2),
    )
    rungs = doc["rungs"]
    ablated = [r["ablation"] for r in rungs if r.get("ablation")]
    assert ablated == ["compile", "bf16", "workers:8", "prefetch"] == ablation_order(ablated), ablated
    stage = next(s for s in doc["stages"] if s["stage"] == "compute bundle ablated after the feed")
    assert stage["action"] == "ablation: compile,bf16,workers:8,prefetch", stage
    sized = next(i for i, r in enumerate(rungs) if r.get("sized"))
    assert all(rungs.index(r) > sized for r in rungs if r.get("ablation"))  # the count sized first, as before
