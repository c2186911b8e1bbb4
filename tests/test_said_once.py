"""Each thing said once. A warning that holds for several configurations is printed
once with the configurations it concerns (terminal, report.md, report.html); the JSON keeps
every occurrence. And the README's main job asks the user to measure nothing more."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from fastloop.report import write_reports
from fastloop.report.terminal import make_console, print_document

ROOT = Path(__file__).resolve().parents[1]
PROG_BAR = (
    "self.log of train_loss with prog_bar=True reads it to the host after every step (Lightning's "
    "progress bar); log it without prog_bar=True on a GPU"
)


def _ladder_doc() -> dict:
    rungs = [
        {"rung": name, "spec": name, "speedups": [], "warnings": [PROG_BAR] * 5}
        for name in ("baseline", "+bf16", "+compile", "selected: bf16,compile")
    ]
    return {"kind": "ladder", "target": "x.py:make", "env": {}, "rungs": rungs, "selected": []}


def test_a_warning_of_every_configuration_is_printed_once_with_them(tmp_path):
    doc = _ladder_doc()
    write_reports(doc, str(tmp_path / "rep"), None)
    md = (tmp_path / "rep" / "report.md").read_text()
    html = (tmp_path / "rep" / "report.html").read_text()
    assert md.count(PROG_BAR) == 1 and html.count("prog_bar=True reads it") == 1
    assert "(baseline, +bf16, +compile, selected: bf16,compile)" in md
    saved = json.loads((tmp_path / "rep" / "report.json").read_text())
    assert sum(len(r["warnings"]) for r in saved["rungs"]) == 20  # every occurrence kept in the JSON
    console = make_console()
    with console.capture() as cap:
        print_document(doc, console)
    printed = " ".join(cap.get().split())  # rich wraps long lines
    assert printed.count("prog_bar=True reads it") == 1 and "(baseline, +bf16, +compile" in printed


def test_what_a_speedup_changed_is_said_once_as_the_selected_configuration_has_it(tmp_path):
    """The H200 ViT ladder listed ``workers: 16 worker processes (measured fastest: ...)`` four
    times, once per configuration with other loader figures: one line, the selected one's."""
    doc = _ladder_doc()
    for k, rung in enumerate(doc["rungs"]):
        rung["speedups"] = [
            {
                "name": "workers",
                "status": "applied",
                "reason": "",
                "detail": f"16 worker processes (measured fastest: {120 + k},000 samples/s)",
            }
        ]
    write_reports(doc, str(tmp_path / "rep"), None)
    md = (tmp_path / "rep" / "report.md").read_text()
    assert md.count("- `workers`: 16 worker processes") == 1
    assert "- `workers`: 16 worker processes (measured fastest: 123,000 samples/s)" in md


@pytest.fixture(scope="module")
def main_job(tmp_path_factory) -> tuple[subprocess.CompletedProcess, Path]:
    """``fastloop ladder demo --out DIR`` as the README runs it (once for the tests below), its
    output not a terminal: the process and its report folder."""
    rep = tmp_path_factory.mktemp("main_job") / "rep"
    p = subprocess.run(
        [sys.executable, "-m", "fastloop.cli", "ladder", "demo", "--out", str(rep)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    return p, rep


@pytest.mark.slow  # the README's main job end to end (an 80 s ladder): .ci/run's second step
def test_the_readmes_main_job_says_each_thing_once_and_asks_for_nothing_more(main_job):
    """One line per run, then the summary: no line is printed twice, and nothing asks to 'measure
    more steps'."""
    p, rep = main_job
    assert p.returncode == 0, p.stderr[-2000:]
    out = p.stdout + p.stderr
    assert "measure more steps" not in out
    warnings = [ln for ln in out.splitlines() if "warning" in ln.lower()]
    assert len(warnings) == len(set(warnings)), warnings
    md = (rep / "report.md").read_text()
    listed = (
        [ln for ln in md.split("Warnings:", 1)[-1].splitlines() if ln.startswith("- ")] if "Warnings:" in md else []
    )
    assert len(listed) == len(set(listed)) and "measure more steps" not in md


@pytest.mark.slow  # the README's main job end to end (an 80 s ladder): .ci/run's second step
def test_the_readmes_main_job_checks_its_pick_within_its_budget(main_job):
    """The demo's pick (workers) checked against the baseline before it is printed: the same
    weights, the same batches, every step's loss bit-identical (the tolerance of a feed: exact),
    its cost reserved in the 80 s budget; the report shows it with its tolerance."""
    p, rep = main_job
    assert p.returncode == 0, p.stderr[-2000:]
    doc = json.loads((rep / "report.json").read_text())
    assert doc["selected"], f"the main job kept nothing, so nothing was checked: {doc['callbacks_line']}"
    check = doc["check"]
    assert check["pick_spec"] == doc["selected_spec"], check
    assert check["passed"] is True and check["max_deviation"] == 0.0, check["verdict"]
    assert check["tolerance"]["rel"] == 0.0 and "bit-identical" in check["tolerance"]["basis"]
    assert check["batches"]["same"] is True and check["steps"] >= 50
    assert 0 < check["seconds"] and check["predicted_s"] > 0
    ran = doc["started_s"] + doc["wall_s"]
    assert ran <= doc["budget_s"] + max(e["s"] for e in doc["run_log"]), (ran, check["seconds"])
    md = (rep / "report.md").read_text()
    assert "**Check** (does the pick train as the baseline?): passed: " in md and "- tolerance: 0 of the loss" in md
    assert "check: passed: " in p.stdout
