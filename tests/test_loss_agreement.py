"""A/B says whether B trains the same as A: per-step losses of the first run of each side
(same seed, same batches), in the JSON, the Markdown and as a plot in the HTML."""

from __future__ import annotations

import pytest

from fastloop.compare import loss_agreement
from fastloop.drivers.ab import run_ab
from fastloop.report.html import render_html
from fastloop.report.markdown import render_markdown


def _fake(losses_b):
    def measure(target, spec, **kw):
        losses = [2.0, 1.5, 1.2, 1.0, 0.9, 0.8, 0.8, 0.8] if spec == "none" else losses_b
        return {
            "step_s_all": [0.01] * 5,
            "speedups": [],
            "losses": losses,
            "steps": 5,
            "warmup_steps": 3,
            "step_s": {"median": 0.01},
            "throughput": {"value": 100.0, "unit": "samples/s"},
            "items_per_step": 1,
            "data_wait_frac": 0.0,
        }

    return measure


def test_ab_reports_how_far_b_losses_are_from_a():
    b = [2.0, 1.5, 1.2, 1.0, 0.9, 0.8, 0.8, 0.88]  # the last step 10% apart
    doc = run_ab("x", "none", "bf16", repeats=1, measure=_fake(b))
    agr = doc["loss_agreement"]
    assert agr["steps"] == 8 and not agr["identical"]
    assert agr["max_rel_diff"] == pytest.approx(0.1)
    assert agr["tail_steps"] == 2 and agr["tail_rel_diff"] == pytest.approx(0.05)
    md = render_markdown(doc)
    assert "**Loss:** B vs A over 8 steps" in md and "+5%" in md and "largest per-step difference 10%" in md
    html = render_html(doc)
    assert 'id="plot-loss"' in html and "Loss:" in html


def test_identical_losses_are_called_bitwise_equal_and_gaps_are_skipped():
    a = [1.0, None, 0.5, float("nan")]
    assert loss_agreement(a, [1.0, 0.7, 0.5, 0.4])["identical"] is True  # None / NaN steps are not compared
    assert loss_agreement(a, [1.0, 0.7, 0.5, 0.4])["steps"] == 2
    assert loss_agreement([], [1.0]) is None and loss_agreement([None], [1.0]) is None
    doc = run_ab("x", "none", "fused_optimizer", repeats=1, measure=_fake([2.0, 1.5, 1.2, 1.0, 0.9, 0.8, 0.8, 0.8]))
    assert "equals A's at every one of 8 steps" in render_markdown(doc)


def test_ab_of_a_batch_size_change_compares_throughput_and_not_the_losses():
    """On an H200 B (the batch-size search's B122) trained 1.04x faster per token, but the A/B
    compared mean step times and said 'A is 7.31x faster', and compared losses of different batches."""

    def measure(target, spec, **kw):
        items = 122 if "batch_size" in spec else 16
        mean = 0.032 * items / 16 / (1.04 if items == 122 else 1.0)
        return {
            "step_s_all": [mean * (1 + 0.001 * (i % 3)) for i in range(20)],
            "items_per_step": items,
            "throughput": {"value": items / mean, "unit": "tokens/s"},
            "speedups": [],
            "data_wait_frac": 0.0,
            "loss": {"first": 10.0, "last": 5.0},
            "losses": [10.0 - 0.1 * i for i in range(20)],
        }

    doc = run_ab("x", "compile", "compile,batch_size", repeats=3, measure=measure)
    assert doc["verdict"].startswith("B (compile,batch_size) is 1.04x faster than A (compile)")
    assert "per item" in doc["verdict"] and "122 items per step, A on 16" in doc["verdict"]
    assert doc["speedup"]["per"] == "item" and doc["speedup"]["items_per_step"] == {"a": [16], "b": [122]}
    assert doc["loss_agreement"]["comparable"] is False
    assert abs(doc["b"]["throughput"]["value"] / doc["a"]["throughput"]["value"] - 1.04) < 0.01
    assert "not compared: B's steps hold 122 items and A's 16" in render_markdown(doc)
    assert "not compared: B&#x27;s steps hold 122" in render_html(
        doc
    ) or "not compared: B's steps hold 122" in render_html(doc)


def test_per_item_needs_both_sides_measured():
    from fastloop.compare import Runs, per_item

    b = Runs("b", docs=[{"items_per_step": 122, "step_s_all": [0.2]}, {"items_per_step": 120, "step_s_all": [0.2]}])
    assert not per_item(Runs("a"), b)  # A not measured yet: nothing to compare per item
    assert per_item(Runs("a", docs=[{"items_per_step": 16, "step_s_all": [0.03]}]), b)
    assert not per_item(Runs("a", docs=[{"items_per_step": None, "step_s_all": [0.03]}]), b)  # unknown: per step
