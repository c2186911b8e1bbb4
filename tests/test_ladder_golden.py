"""What the ladder decides, and the shape of the documents its readers depend on, pinned.

- **Decisions**: for seeded simulated ladders (tests/ladder_sim.py: random speedups with known
  effects, a fake clock for the budget; the staged, sequential and cumulative searches) the
  stages, each rung's label, status and decision, the selected set and what was not tried are
  the ones recorded in tests/fixtures/ladder_trails.json. When a change to the search is meant,
  record them again (``python -m tests.ladder_sim``) and read the diff.
- **Documents**: the keys and value types (recursively, a list by its first element) of the
  demo's ``run``, ``ladder`` and ``ab`` documents, and of a simulated ladder whose runs are the
  demo's own run document, are those in tests/fixtures/document_shapes.json: the reports, the
  HTML and anyone reading the JSON see the same document.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.ladder_sim import (
    TRAIL_SEEDS,
    demo_like_ladder,
    load_fixture,
    shape,
    shape_differences,
    trail_or_error,
)

OPTIONAL = frozenset(
    {
        "window_short",
        "failures",
        "loss_finite",
        "startup_s",
        "cold_compile_s",
        "interrupted",
        "advice",
        "advice_filtered",
        "loop_line",
        "predicted_s",
        "reserve_s",
        "left_s",
    }
)
"""Keys a real run has or lacks by what happened in it: a short window, a failed run, a cold compile,
the doctor's advice clauses (by the bottleneck), the plain-loop line (only for a set kept), the
budget's arithmetic (only in a "not tried" entry the budget left out)."""
OPEN = frozenset({"extra", "data_checks", "built_checks", "model_checks"})
"""Dicts keyed by what the speedups did or checked in that run (``extra``: their own statistics)."""


@pytest.mark.parametrize("seed", TRAIL_SEEDS)
def test_the_ladder_decides_as_recorded(monkeypatch, seed):
    want = load_fixture("ladder_trails.json")[str(seed)]
    got = trail_or_error(seed, monkeypatch)
    assert got == want


def test_a_simulated_ladders_document_keeps_its_keys_and_types(monkeypatch):
    doc = json.loads(json.dumps(demo_like_ladder(monkeypatch)))  # as the report writer serializes it
    fixture = load_fixture("document_shapes.json")
    assert shape_differences(fixture["ladder_simulated"], shape(doc)) == []
    assert [shape(r) for r in doc["rungs"]] == fixture["ladder_simulated_rungs"]


def test_the_shape_comparison_sees_a_key_and_a_type_change():
    want = load_fixture("document_shapes.json")["ladder"]
    assert shape_differences(want, want) == []
    renamed = {**want, "picked": want["selected"]}
    del renamed["selected"]
    assert shape_differences(want, renamed) == ["$: missing selected", "$: unexpected picked"]
    retyped = {**want, "rungs": [{**want["rungs"][0], "repeats": "str"}]}
    assert shape_differences(want, retyped) == ["$.rungs[0].repeats: number became str"]


@pytest.mark.slow
@pytest.mark.parametrize(
    "command",
    [
        ["run", "demo"],
        ["ladder", "demo"],
        ["ab", "demo", "--a", "none", "--b", "workers", "--repeats", "3"],
    ],
    ids=["run", "ladder", "ab"],
)
def test_the_demos_documents_keep_their_keys_and_types(tmp_path, command):
    out = tmp_path / "doc.json"
    cmd = [sys.executable, "-m", "fastloop.cli", *command, "--device", "cpu", "--quiet", "--json", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-2000:]
    want = load_fixture("document_shapes.json")[command[0]]
    got = shape(json.loads(out.read_text()))
    assert shape_differences(want, got, optional=OPTIONAL, open_keys=OPEN) == []
