"""The reports of ``fastloop fit`` and ``ab --fit`` (rendered from recorded documents), and the note
``run``, ``ladder`` and ``ab`` print about the share of the fit their step figures cover."""

from __future__ import annotations

import itertools
import json

import pytest

from fastloop.drivers.fit_share import fit_share, keep_fit_record
from fastloop.report import write_reports
from fastloop.report.fit import fit_figures

PHASES = {
    "startup": 6.0,
    "compile": 1.5,
    "train": 20.0,
    "validation": 2.0,
    "checkpoint": 0.4,
    "epoch_edges": 0.3,
    "host_syncs": 0.5,
    "other": 0.3,
}


def fit_doc(seed: int = 0, scale: float = 1.0, acc: tuple = (0.6, 0.8), target: str = "demo") -> dict:
    """A recorded fit document (the shape ``fastloop fit`` writes)."""
    phases = {k: v * scale for k, v in PHASES.items()}
    wall = sum(phases.values())
    steps = list(range(1, 65))
    return {
        "fastloop_version": "0.1.0",
        "kind": "fit",
        "target": target,
        "device": "cpu",
        "env": {"gpu": None, "torch": "2.x"},
        "wall_s": wall,
        "phases": phases,
        "epochs": [{"epoch": e, "phases": phases, "batches": 32, "samples": 1024} for e in (0, 1)],
        "outcome": {
            "train_loss": {
                "step": steps,
                "second": [6 + 0.3 * s for s in steps],
                "value": [1.4 - s / 100 for s in steps],
            },
            "validation": [
                {"index": i, "epoch": i, "step": 32 * (i + 1), "second": 15.0 + 12 * i, "metrics": {"val_acc": a}}
                for i, a in enumerate(acc)
            ],
            "until": None,
            "reached": None,
            "diverged": None,
        },
        "compiles": {"count": 2, "seconds": 1.5, "warm": 0, "cold": 2, "events": []},
        "step_only": {
            "steps": 64,
            "steady_steps": 60,
            "median_s": 0.3,
            "p25_s": 0.29,
            "p75_s": 0.31,
            "covers_frac": 0.62,
        },
        "speedups": [],
        "settings": {"seed": seed, "speedups_asked": "none", "length": {"max_epochs": 2}, "left_out": {}},
        "phase_check": {"other_frac": 0.01, "tolerance": 0.05, "within": True},
        "warnings": [],
        "failed": None,
    }


def _drawn_texts(fig) -> list:
    """The text artists a reader sees: every visible non-empty text, tick labels only where their
    tick lies inside the axis's view (matplotlib keeps labels for ticks outside it, undrawn)."""
    from matplotlib.text import Text

    ticks, drawn = set(), []
    for ax in fig.axes:
        for axis in (ax.xaxis, ax.yaxis):
            lo, hi = sorted(axis.get_view_interval())
            for tick in axis.get_major_ticks() + axis.get_minor_ticks():
                ticks.update({id(tick.label1), id(tick.label2)})
                span = (hi - lo) * 1e-9
                if lo - span <= tick.get_loc() <= hi + span:
                    drawn += [t for t in (tick.label1, tick.label2) if t.get_visible() and t.get_text().strip()]
    others = [t for t in fig.findobj(Text) if id(t) not in ticks and t.get_visible() and t.get_text().strip()]
    return drawn + others


def _overlaps(fig) -> list[tuple[str, str]]:
    """Pairs of drawn text boxes of ``fig`` that intersect (the figure drawn first: real sizes)."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    boxes = [(t.get_text(), t.get_window_extent(renderer)) for t in _drawn_texts(fig)]
    return [(a, b) for (a, ba), (b, bb) in itertools.combinations(boxes, 2) if ba.overlaps(bb)]


def _ab_doc() -> dict:
    from fastloop.drivers.ab_fit import ab_fit_doc
    from fastloop.drivers.fit import FitOptions

    runs = {
        "a": [fit_doc(i, 1.0, (0.6, 0.8 + 0.01 * i)) for i in range(3)],
        "b": [fit_doc(i, 0.7, (0.5, 0.6 + 0.01 * i)) for i in range(3)],
    }
    return {"target": "demo", "env": {}, **ab_fit_doc(FitOptions(target="demo"), "none", "workers", runs, [], 3, None)}


@pytest.mark.parametrize("make", [fit_doc, _ab_doc], ids=["fit", "ab-fit"])
def test_every_plot_has_data_and_no_text_overlaps_another(make):
    doc = make()
    figures = dict(fit_figures(doc))
    assert set(figures) == {"timeline", "curve-train_loss", "curve-val_acc"}
    for name, fig in figures.items():
        assert all(ax.has_data() for ax in fig.axes if ax.get_visible()), name
        assert _overlaps(fig) == [], name


def test_a_plot_is_drawn_only_where_it_has_data():
    doc = fit_doc()
    doc["outcome"]["validation"] = []
    assert [n for n, _ in fit_figures(doc)] == ["timeline", "curve-train_loss"]


def test_the_pages_say_the_phases_the_step_figure_and_the_verdicts(tmp_path):
    write_reports(fit_doc(), str(tmp_path / "fit"), None)
    md = (tmp_path / "fit" / "report.md").read_text()
    assert "| train | 20.00 | 64.5% |" in md and "the step figure covers 62% of this fit" in md
    assert "validation 2 (step 64, 27.0 s): val_acc 0.8" in md
    html = (tmp_path / "fit" / "report.html").read_text()
    assert html.count('<img class="plot"') == 3 and 'id="plot-timeline"' in html
    write_reports(_ab_doc(), str(tmp_path / "ab"), None)
    md = (tmp_path / "ab" / "report.md").read_text()
    assert "| whole fit | 31.00 s | 21.70 s | B (workers) is 1.43x faster than A (none)" in md
    assert "B does not learn the same as A: its val_acc is lower, worse" in md


def test_a_step_report_says_what_share_of_a_plain_fit_it_covers(tmp_path):
    run = {
        "kind": "run",
        "target": "demo",
        "device": "cpu",
        "extra": {"fit_parts": {"validates": True, "checkpoints": True}},
    }
    note = fit_share(run, str(tmp_path))["note"]
    assert "leave out what the fit of demo also does (validation, checkpoint saves" in note
    keep_fit_record(fit_doc(), str(tmp_path))
    measured = fit_share(run, str(tmp_path))
    assert measured["measured"].endswith("fit.json")
    assert "the steps took 65% of the wall clock (batches x the median step: 62%)" in measured["note"]
    assert "startup 19%" in measured["note"]
    other = fit_share({**run, "target": "gpt"}, str(tmp_path))  # a fit of another target is not quoted
    assert other["measured"] is None
    assert fit_share({**run, "extra": {"fit_parts": {"validates": False, "checkpoints": False}}}, None) is None


def test_run_writes_the_fit_share_note_beside_its_figures(tmp_path):
    from fastloop.cli import main

    target = "tests/targets.py:fit_tiny"
    keep_fit_record(fit_doc(target=target), str(tmp_path))
    argv = ["run", target, "--steps", "3", "--warmup", "1", "--device", "cpu", "--out", str(tmp_path), "--quiet"]
    assert main(argv) == 0
    doc = json.loads((tmp_path / "report.json").read_text())
    assert doc["fit_share"]["validates"] and doc["fit_share"]["measured"]
    assert "**The whole fit:** These step figures cover the training steps only" in (tmp_path / "report.md").read_text()
    assert json.loads((tmp_path / "fit.json").read_text())["kind"] == "fit"  # kept beside the run's report


def test_a_diverged_fit_is_named_and_left_out_of_every_verdict():
    from fastloop.drivers.ab_fit import ab_fit_doc
    from fastloop.drivers.fit import FitOptions

    runs = {"a": [fit_doc(i) for i in range(3)], "b": [fit_doc(i, 0.7, (0.6, 0.8)) for i in range(3)]}
    runs["b"][1]["outcome"]["diverged"] = {"step": 40, "why": "the loss was nan"}
    runs["b"][1]["outcome"]["validation"][-1]["metrics"]["val_acc"] = 0.0
    doc = ab_fit_doc(FitOptions(target="demo"), "none", "fp16", runs, [], 3, None)
    assert "B (seed 1) diverged at step 40: the loss was nan; left out of every verdict" in doc["verdicts"]
    acc = doc["outcome"][0]
    assert acc["b_final"] == [0.8, 0.8] and acc["a_final"] == [0.8, 0.8]  # seeds 0 and 2 only
    assert doc["time"]["wall"]["runs"] == 2


def test_a_fits_folder_in_out_is_fastloops_only_with_its_mark(tmp_path):
    from fastloop.errors import FastloopError
    from fastloop.report.files import check_out_dir

    (tmp_path / "fit_files").mkdir()
    with pytest.raises(FastloopError, match="already holds files fastloop did not write"):
        check_out_dir(str(tmp_path))
    (tmp_path / "fit_files" / ".fastloop-fit").write_text("written by fastloop fit")
    check_out_dir(str(tmp_path))


def test_the_time_to_the_target_is_a_verdict_or_says_who_never_reached_it():
    from fastloop.drivers.ab_fit import ab_fit_doc
    from fastloop.drivers.fit import FitOptions

    runs = {"a": [fit_doc(i) for i in range(3)], "b": [fit_doc(i, 0.7) for i in range(3)]}
    for i, fit in enumerate(runs["a"] + runs["b"]):
        fit["outcome"]["reached"] = {"step": 64, "second": 20.0 + i % 3 if i < 3 else 14.0 + i % 3, "validation_run": 1}
    base = FitOptions(target="demo", until="val_acc>=0.8")
    both = ab_fit_doc(base, "none", "workers", runs, [], 3, None)["time"]["to_target"]
    assert (
        both["verdict"].startswith("time to val_acc>=0.8: B (workers) is 1.")
        and "faster than A (none)" in both["verdict"]
    )
    for fit in runs["b"]:
        fit["outcome"]["reached"] = None
    never = ab_fit_doc(base, "none", "workers", runs, [], 3, None)
    assert never["time"]["to_target"]["verdict"] == "time to val_acc>=0.8: B never reached it (3 fits a side)"
    assert never["outcome"][0]["metric"] == "val_acc"  # the --until metric is the outcome's
