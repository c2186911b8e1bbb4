"""A/B says whether B trains the same as A: per-step losses of the first run of each side
(same seed, same batches), in the JSON, the Markdown and as a plot in the HTML."""

from __future__ import annotations

import pytest

from fastloop.ab import run_ab
from fastloop.compare import loss_agreement
from fastloop.report.html import render_html
from fastloop.report.markdown import render_markdown


def _fake(losses_b):
    def measure(target, spec, **kw):
        losses = [2.0, 1.5, 1.2, 1.0, 0.9, 0.8, 0.8, 0.8] if spec == "none" else losses_b
        return {"step_s_all": [0.01] * 5, "speedups": [], "losses": losses, "steps": 5, "warmup_steps": 3,
                "step_s": {"median": 0.01}, "throughput": {"value": 100.0, "unit": "samples/s"}, "items_per_step": 1,
                "data_wait_frac": 0.0}
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
