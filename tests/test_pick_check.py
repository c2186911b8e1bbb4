"""The check of a pick (fastloop.drivers.pick_check): a paired run of the baseline and the pick from
the same weights on the same batches, their per-step losses within a tolerance derived from what
the pick changes; a pick whose losses part is refused with the step and the speedup that parts
them, and the ladder falls back; ``ab --check`` runs the same check."""

from __future__ import annotations

import json
import math
import time

import pytest
import torch

from fastloop.drivers.ab import run_ab
from fastloop.drivers.ladder import run_ladder
from fastloop.drivers.pick_check import (
    BAND_FACTOR,
    MIN_STEPS,
    NOT_FINITE_DEVIATION,
    REORDERED_TOL,
    PickCheck,
    compare_losses,
    tolerance_for,
)
from fastloop.report.format import check_lines
from fastloop.report.html import render_html
from fastloop.report.markdown import render_markdown
from fastloop.speedups import REGISTRY, resolve

BASE = [2.0 * 0.97**i for i in range(60)]


def _paired(losses_of, *, reads="fixed", weights=None, digests=None, calls=None):
    """A measure whose paired runs return ``losses_of(spec)`` (and a record of each call)."""

    def measure(target, spec, **kw):
        if calls is not None:
            calls.append((spec, kw))
        losses = losses_of(spec)
        return {
            "losses": losses,
            "items_per_step": 16,
            "paired": {
                "seed": kw.get("seed"),
                "initial_weights_digest": weights(spec) if weights else "w0",
                "batch_digests": digests(spec) if digests else [f"batch{i}" for i in range(len(losses))],
                "dataset_reads": reads,
            },
        }

    return measure


def _parting_at(step: int, by: float = 0.05):
    return [x if i < step else x * (1 + by) for i, x in enumerate(BASE)]


# -- the tolerance -------------------------------------------------------------------------------


def test_the_tolerance_is_derived_from_what_each_member_changes():
    exact = tolerance_for("workers:2,pin_memory")
    assert (exact.rel, exact.kind) == (0.0, "exact") and "bit-identical" in exact.basis
    assert tolerance_for("workers,compile").rel == REORDERED_TOL
    bf16 = tolerance_for("workers,compile,bf16")
    assert bf16.rel == BAND_FACTOR * 2.0**-7 and bf16.kind == "band" and "bf16" in bf16.basis
    assert set(bf16.members) == {"workers", "compile", "bf16"}
    assert tolerance_for("fp16").rel == pytest.approx(2 * 2.0**-10)
    assert tolerance_for("tf32").rel == pytest.approx(2 * 2.0**-10)
    assert tolerance_for("fp8").rel == pytest.approx(0.25)
    # the padding's band is its own checked tolerance, never below what reordering needs
    assert tolerance_for("pad_buckets:rtol=0.01").rel == pytest.approx(0.02)
    assert tolerance_for("pad_buckets").rel == REORDERED_TOL
    assert tolerance_for("none").rel == 0.0


def test_every_registered_speedup_says_what_it_changes_in_training():
    for name, cls in REGISTRY.items():
        s = resolve(name)[0]
        assert cls.trains in ("exact", "reordered", "band", "own_draws", "workload"), name
        assert (s.band() is not None and s.band() > 0) == (cls.trains == "band"), name


def _train(model_fn, batches, *, steps=200, autocast=False, channels_last=False, fused=False):
    torch.manual_seed(0)
    model = model_fn()
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, **({"fused": True} if fused else {"foreach": False}))
    losses = []
    for i in range(steps):
        x, y = batches[i % len(batches)]
        if channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def test_the_tolerances_hold_what_rounding_does_in_200_steps_on_a_cpu():
    """What the tolerances are derived from, measured: 200 steps of bf16 autocast, of a fused AdamW
    and of channels_last convolutions, each against fp32 eager from the same weights on the same
    batches, stay inside their tolerance (and are not zero: the tolerance is needed)."""
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(1)
    mlp = lambda: torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.GELU(), torch.nn.Linear(64, 4))  # noqa: E731
    rows = [(torch.randn(32, 64, generator=g), torch.randint(0, 4, (32,), generator=g)) for _ in range(8)]
    cnn = lambda: torch.nn.Sequential(  # noqa: E731
        torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.Linear(8 * 64, 4)
    )
    images = [(torch.randn(8, 3, 8, 8, generator=g), torch.randint(0, 4, (8,), generator=g)) for _ in range(8)]
    fp32 = _train(mlp, rows)
    for spec, other in (
        ("bf16", _train(mlp, rows, autocast=True)),
        ("fused_optimizer", _train(mlp, rows, fused=True)),
        ("channels_last", _train(cnn, images, channels_last=True)),
    ):
        base = _train(cnn, images) if spec == "channels_last" else fp32
        found = compare_losses(base, other, tolerance_for(spec).rel)
        assert found["passed"] and found["max_deviation"] > 0, (spec, found)


def test_losses_part_at_the_first_step_past_the_tolerance_relative_to_the_loss():
    a = [2.0, 1.0, 0.1, 0.01, 0.01]
    # a loss near zero is measured against a tenth of the first loss, not against itself
    assert compare_losses(a, [2.0, 1.0, 0.1, 0.02, 0.01], 0.06)["passed"]
    found = compare_losses(a, [2.0, 1.0, 0.1, 0.05, 0.2], 0.06)
    assert found["first_parting_step"] == 3 and found["max_deviation_step"] == 4 and not found["passed"]
    # a step that neither side has a finite loss for is not compared; one side without a loss parts there
    assert compare_losses([1.0, None, float("nan")], [1.0, None, float("nan")], 0.0)["steps"] == 1
    assert compare_losses([1.0, 0.5], [1.0, None], 0.5)["first_parting_step"] == 1
    assert compare_losses([1.0, 0.5], [1.0, 0.5 + 1e-9], 0.0)["first_parting_step"] == 1  # exact is exact


# -- the check -----------------------------------------------------------------------------------


def test_a_pick_that_trains_as_the_baseline_passes_and_says_its_tolerance():
    calls = []
    check = PickCheck("t", _paired(lambda spec: BASE, calls=calls), device="cpu", steps=60).run("none", "workers:2")
    assert check["passed"] is True and check["max_deviation"] == 0 and check["steps"] == 60
    assert check["tolerance"]["rel"] == 0 and "bit-identical" in check["tolerance"]["basis"]
    assert check["batches"] == {"same": True, "first_difference": None}
    assert [spec for spec, _ in calls] == ["none", "workers:2"]
    assert all(kw["seed"] == 0 and kw["steps"] == 60 and kw["warmup"] == 0 for _, kw in calls)
    assert check["verdict"].startswith("passed: workers:2 trained as the baseline for 60 steps")


def test_a_pick_whose_losses_part_is_refused_with_the_step_and_the_speedup_that_parts_them():
    calls = []

    def losses(spec):
        return _parting_at(7) if "workers" in spec else [x * (1 + 1e-3) for x in BASE] if "bf16" in spec else BASE

    costs = {"bf16": 1.0, "workers:2": 5.0}  # without workers the run is cheaper: it goes first
    check = PickCheck(
        "t",
        _paired(losses, calls=calls),
        device="cpu",
        steps=60,
        cost=lambda spec: costs.get(spec, 10.0),
    ).run("none", "workers:2,bf16")
    assert check["passed"] is False and check["first_parting_step"] == 7
    assert check["culprit"] == "workers:2" and check["fallback"] == "bf16"
    assert check["floor"] == {"measured": True, "max_deviation": 0.0, "reproducible": True}
    assert [b["removed"] for b in check["bisect"]] == ["workers:2"] and check["bisect"][0]["passed"]
    assert [spec for spec, _ in calls] == ["none", "workers:2,bf16", "none", "bf16"]
    assert "at step 7" in check["verdict"] and "taking out workers:2 closes the gap" in check["verdict"]
    lines = check_lines({"check": check})
    assert lines[0] == check["verdict"] and any(line.startswith("without workers:2 (bf16): agrees") for line in lines)


def test_one_member_that_parts_the_losses_is_named_without_another_run():
    calls = []
    check = PickCheck(
        "t", _paired(lambda s: _parting_at(3) if s != "none" else BASE, calls=calls), device="cpu", steps=60
    )
    found = check.run("none", "channels_last")
    assert found["culprit"] == "channels_last" and found["fallback"] == "none"
    assert [spec for spec, _ in calls] == ["none", "channels_last", "none"]  # the baseline repeated, no bisect


def test_a_baseline_that_does_not_reproduce_itself_widens_the_tolerance_to_its_spread():
    runs = iter([BASE, [x * (1 + 2e-6) for x in BASE], [x * (1 + 1e-6) for x in BASE]])
    check = PickCheck("t", _paired(lambda spec: next(runs)), device="cpu", steps=60).run("none", "workers")
    assert check["passed"] is True and check["floor"]["reproducible"] is False
    assert check["tolerance"]["rel"] == pytest.approx(10 * 1e-6, rel=1e-3)
    assert "does not reproduce itself" in check["tolerance"]["basis"]


def test_what_draws_its_own_numbers_is_on_both_sides_and_the_rest_is_compared():
    calls = []
    check = PickCheck("t", _paired(lambda spec: BASE, calls=calls), device="cpu", steps=60)
    found = check.run("none", "gpu_augment,bf16")
    assert calls[0][0] == "gpu_augment" and found["compared"] == {"baseline": "gpu_augment", "pick": "gpu_augment,bf16"}
    assert found["on_both_sides"][0]["spec"] == "gpu_augment" and found["tolerance"]["members"].keys() == {"bf16"}


def test_workers_join_both_sides_only_where_the_dataset_draws_from_the_global_generators():
    runs = {"global_draws": ["none", "workers:2", "workers:2,bf16"], "own_state": ["none", "workers:2,bf16"]}
    for reads, specs in runs.items():
        calls = []
        found = PickCheck("t", _paired(lambda spec: BASE, reads=reads, calls=calls), device="cpu", steps=60).run(
            "none", "workers:2,bf16"
        )
        assert [spec for spec, _ in calls] == specs, reads
        assert [b["spec"] for b in found["on_both_sides"]] == (["workers:2"] if reads == "global_draws" else [])
        assert found["passed"] is True and set(found["tolerance"]["members"]) == set(specs[-1].split(",")) - {
            "workers:2" if reads == "global_draws" else ""
        }
    alone = PickCheck("t", _paired(lambda spec: BASE, reads="global_draws"), device="cpu", steps=60).run(
        "none", "workers"
    )
    assert alone["passed"] is None and "nothing is compared step by step" in alone["not_checked"]


def test_runs_that_do_not_start_from_the_same_weights_are_not_checked():
    found = PickCheck("t", _paired(lambda spec: _parting_at(0), weights=lambda spec: spec), device="cpu", steps=60).run(
        "none", "compile"
    )
    assert found["passed"] is None and "did not start from the same weights" in found["not_checked"]


def test_a_pick_whose_loss_went_nan_is_refused_in_strict_json_with_the_reason():
    """One side's loss NaN where the other's is finite parts the sides there: the deviation is null
    (strict JSON has no Infinity) with the reason, in the check, its bisection and its report lines;
    a repeated baseline that goes NaN widens nothing."""
    diverged = [x if i < 5 else float("nan") for i, x in enumerate(BASE)]
    runs = iter([BASE, diverged, diverged])  # the baseline, the pick, the baseline again
    check = PickCheck("t", _paired(lambda spec: next(runs)), device="cpu", steps=60).run("none", "channels_last")
    strict = json.loads(json.dumps(check, allow_nan=False))  # raises on an Infinity left in the check
    assert strict["passed"] is False and strict["first_parting_step"] == 5 and strict["max_deviation"] is None
    assert strict["max_deviation_why"] == NOT_FINITE_DEVIATION
    assert strict["floor"]["reproducible"] is False and NOT_FINITE_DEVIATION in strict["floor"]["why"]
    assert strict["tolerance"]["rel"] == tolerance_for("channels_last").rel  # not widened by an infinite spread
    assert "widened" not in strict["tolerance"]["basis"]
    assert "largest deviation not finite" in strict["verdict"]
    assert any("only one side had a finite loss" in line for line in check_lines({"check": strict}))


def test_the_budget_ends_the_search_for_the_cause_and_says_so():
    check = PickCheck(
        "t",
        _paired(lambda spec: BASE if spec == "none" else _parting_at(2)),
        device="cpu",
        steps=60,
        fits=lambda spec: spec == "none",
    ).run("none", "workers,bf16")
    assert check["passed"] is False and check["culprit"] is None and check["fallback"] == "none"
    assert check["bisect_note"].startswith("not found within the budget")


# -- in the ladder and in ab ----------------------------------------------------------------------


def _ladder_measure(parts: str | None, overhead: float | None = None):
    """Workers and bf16 each make the step 2x faster; the paired runs of configurations holding
    ``parts`` part from the baseline's losses at step 4. With ``overhead``, a run takes that many
    seconds plus its steps (5 warm-up and 60 measured, or a paired run's) at its mean step."""
    import numpy as np

    rng = np.random.default_rng(1)

    def measure(target, spec, **kw):
        names = [] if spec == "none" else [s.split(":")[0] for s in spec.split(",")]
        mean = 0.004 / ((2.0 if "workers" in names else 1.0) * (2.0 if "bf16" in names else 1.0))
        if overhead is not None:
            time.sleep(overhead + mean * (kw["steps"] if kw.get("seed") is not None else 65))
        steps = list(mean * (1 + 0.01 * rng.standard_normal()) * (1 + 0.005 * rng.standard_normal(60)))
        doc = {
            "step_s_all": steps,
            "items_per_step": 16,
            "throughput": {"value": 16 / mean, "unit": "samples/s"},
            "data_wait_frac": 0.0 if "workers" in names else 0.5,
            "step_s": {"mean": mean},
            "warmup_overhead_s": 0.01,
            "speedups": [{"name": n, "status": "applied", "reason": ""} for n in names],
            "loss": {"first": 1.0, "last": 0.5},
            "losses": BASE,
            "steps": 60,
            "warmup_steps": 5,
        }
        if kw.get("seed") is not None:  # a paired run of the check
            doc["losses"] = _parting_at(4) if parts in names else BASE
            doc["paired"] = {"initial_weights_digest": "w", "batch_digests": [], "dataset_reads": "fixed"}
        return doc

    return measure


def test_the_ladder_refuses_a_pick_whose_losses_part_and_falls_back_to_what_passed():
    doc = run_ladder("x", ["workers:2", "bf16"], device="cpu", budget=None, measure=_ladder_measure("bf16"))
    check = doc["check"]
    assert check["pick_spec"] == "workers:2,bf16" and check["passed"] is False
    assert check["first_parting_step"] == 4 and check["culprit"] == "bf16" and check["fallback"] == "workers:2"
    assert doc["selected"] == ["workers:2"] and doc["selected_spec"] == "workers:2"
    final = doc["rungs"][-1]
    assert final["final"] and final["spec"] == "workers:2" and "workers:2" in doc["callbacks_line"]
    md = render_markdown({**doc, "env": {}})
    assert "**Check** (does the pick train as the baseline?): refused: workers:2,bf16's losses part" in md
    assert "tolerance: 0.0156 of the loss per step" in md


def test_the_sequential_ladder_checks_its_pick_too():
    doc = run_ladder(
        "x", ["workers:2", "bf16"], device="cpu", budget=None, measure=_ladder_measure("bf16"), mode="sequential"
    )
    assert doc["check"]["culprit"] == "bf16" and doc["selected"] == ["workers:2"]
    assert doc["rungs"][-1]["final"] and doc["rungs"][-1]["spec"] == "workers:2"


def test_a_refused_pick_of_one_speedup_leaves_the_baseline_and_says_why():
    doc = run_ladder("x", ["workers:2"], device="cpu", budget=None, measure=_ladder_measure("workers"))
    assert doc["check"]["culprit"] == "workers:2" and doc["selected"] == []
    assert doc["callbacks_line"].startswith("# the pick (workers:2) trained differently from the baseline")


def test_the_ladder_checks_a_pick_that_trains_the_same_within_its_budget():
    """The check's two paired runs are reserved before the final comparison: the ladder, its check
    included, ends within a run of its budget, and the report shows the check and its tolerance."""
    budget = 9.0
    t0 = time.perf_counter()
    doc = run_ladder("x", ["workers:2", "bf16"], device="cpu", budget=budget, measure=_ladder_measure(None, 0.2))
    wall = time.perf_counter() - t0
    check = doc["check"]
    assert check["passed"] is True and check["tolerance"]["rel"] == BAND_FACTOR * 2.0**-7
    # reserved: 0.2 s + 50 steps of 4 ms (the baseline) and 0.2 s + 50 of 1 ms (the pick)
    assert check["predicted_s"] == pytest.approx(0.65, abs=0.15) and check["seconds"] >= 0.6
    assert MIN_STEPS <= check["steps"] and "steps a side" in check["steps_basis"]
    assert wall <= budget + 0.5, wall
    assert "Check" in render_html({**doc, "env": {}}) and "id='check'" in render_html({**doc, "env": {}})


def test_a_ladder_whose_runs_record_no_losses_says_the_check_did_not_run():
    def measure(target, spec, **kw):
        doc = _ladder_measure(None)(target, spec, **kw)
        doc.pop("losses")
        return doc

    doc = run_ladder("x", ["workers:2"], device="cpu", budget=None, measure=measure)
    assert doc["check"]["passed"] is None and doc["selected"] == ["workers:2"]
    assert doc["check"]["verdict"] == "not checked: the ladder's runs record no per-step losses"


def test_ab_check_runs_the_same_check_between_a_and_b():
    doc = run_ab("x", "none", "bf16", repeats=3, measure=_ladder_measure("bf16"), check=True)
    check = doc["check"]
    assert check["passed"] is False and check["culprit"] == "bf16" and "fallback" not in check
    assert check["tolerance"]["rel"] == BAND_FACTOR * 2.0**-7 and check["first_parting_step"] == 4
    assert "**Check**" in render_markdown({**doc, "env": {}}) and "falls back" not in check["verdict"]
    assert run_ab("x", "none", "bf16", repeats=3, measure=_ladder_measure("bf16")).get("check") is None


# -- real runs, each a fresh process -------------------------------------------------------------


@pytest.mark.slow  # a CLI process end to end: .ci/run's second step
def test_workers_on_a_dataset_that_ignores_its_index_is_refused_where_its_batches_part():
    """Each worker process copies the dataset's reader at the same position: the second batch is
    the first again. The check sees the batches part at step 1 and the losses with them."""
    from fastloop.drivers.subproc import run_in_subprocess

    found = PickCheck("tests/check_targets.py:cursor_records", run_in_subprocess, device="cpu", steps=MIN_STEPS).run(
        "none", "workers:2"
    )
    assert found["passed"] is False, found["verdict"]
    assert found["first_parting_step"] == 1 and found["batches"]["first_difference"] == 1
    assert found["culprit"] == "workers:2" and found["floor"]["reproducible"] is True
    assert "its batches differ from the baseline's from step 1" in found["verdict"]


@pytest.mark.slow  # a CLI process end to end: .ci/run's second step
def test_channels_last_under_strided_code_that_assumes_nchw_is_refused_on_the_same_batches():
    from fastloop.drivers.subproc import run_in_subprocess

    found = PickCheck("tests/check_targets.py:strided_pool_cnn", run_in_subprocess, device="cpu", steps=MIN_STEPS).run(
        "none", "channels_last"
    )
    assert found["passed"] is False and found["first_parting_step"] == 0, found["verdict"]
    assert found["batches"]["same"] is True and found["culprit"] == "channels_last"
    assert found["max_deviation"] > 10 * REORDERED_TOL


@pytest.mark.slow  # a CLI process end to end: .ci/run's second step
def test_ab_check_from_the_command_line_passes_workers_on_an_indexed_dataset(tmp_path):
    """A shuffled loader with its own generator, 32 batches an epoch: the check's 100 steps cross
    three epoch edges, where persistent workers must shuffle as the plain loader does."""
    from fastloop.cli import main

    out = tmp_path / "ab.json"
    rc = main(
        [
            "ab",
            "tests/check_targets.py:indexed_records",
            "--a",
            "none",
            "--b",
            "workers:2",
            "--repeats",
            "1",
            "--steps",
            "10",
            "--device",
            "cpu",
            "--check",
            "--quiet",
            "--json",
            str(out),
        ]
    )
    assert rc == 0
    check = json.loads(out.read_text())["check"]
    assert check["passed"] is True and check["max_deviation"] == 0.0 and check["steps"] >= 100, check["verdict"]
    assert check["batches"]["same"] is True and math.isclose(check["tolerance"]["rel"], 0.0)


def _seeded_loader():
    from torch.utils.data import DataLoader, TensorDataset

    g = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(12, 4, generator=g), torch.randint(0, 2, (12,), generator=g))
    return DataLoader(data, batch_size=4, shuffle=True, generator=torch.Generator().manual_seed(0))


def test_workers_keep_a_seeded_loaders_order_in_every_epoch():
    """Found by the check (``ab --check`` of workers on ``indexed_records`` parted at step 32, the
    second epoch). A shuffled loader with its own generator draws from it, at every fresh iterator,
    its workers' base seed and then the permutation; a ``RandomSampler`` asked past its last index
    draws one permutation more. Lightning stops a plain loader at its length; persistent workers
    reuse their iterator (no base seed drawn) and fetch indices ahead (past the last). Both are
    undone: the epochs, consumed as Lightning and FastLoop consume them, come in the same order."""
    import itertools

    from fastloop.speedups.workers import apply_workers

    plain, workers = _seeded_loader(), apply_workers(_seeded_loader(), num_workers=1)
    for epoch in range(3):
        got = [[b[1].tolist() for b in itertools.islice(loader, len(loader))] for loader in (plain, workers)]
        assert got[0] == got[1], epoch


def test_fastloop_with_workers_trains_a_seeded_loaders_epochs_as_without():
    from fastloop.loop import FastLoop

    def losses(speedups: str) -> list[float]:
        torch.manual_seed(0)
        model = torch.nn.Linear(4, 2)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        loop = FastLoop(model, opt, _seeded_loader(), loss_fn=torch.nn.functional.cross_entropy, speedups=speedups)
        return [float(x) for x in loop.train(steps=9).losses]  # three epochs of three batches

    assert losses("none") == losses("workers:1")


@pytest.mark.gpu
@pytest.mark.parametrize("pick", ["cuda_graph", "compile", "bf16", "tf32,bf16,fused_optimizer,compile"])
def test_the_checks_tolerance_passes_the_gpu_compute_stack_on_a_module_with_dropout(pick):
    """On the GPU, each compute pick trains a module with dropout and a StepLR schedule as eager
    does, within its tolerance: the masks are drawn as eager draws them (seeded; compiled code
    through Inductor's fallback_random), and the schedule is followed."""
    from fastloop.drivers.subproc import run_in_subprocess

    found = PickCheck("tests/check_targets.py:dropout_mlp", run_in_subprocess, device="cuda", steps=MIN_STEPS).run(
        "none", pick
    )
    assert found["passed"] is True, found["verdict"]
