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

import pytest

from tests.ladder_sim import (
    DEMO_COMMANDS,
    TRAIL_SEEDS,
    demo_document,
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
        "losses_not_finite",
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
@pytest.mark.parametrize("kind", list(DEMO_COMMANDS))
def test_the_demos_documents_keep_their_keys_and_types(tmp_path, kind):
    want = load_fixture("document_shapes.json")[kind]
    got = shape(demo_document(kind, tmp_path))
    assert shape_differences(want, got, optional=OPTIONAL, open_keys=OPEN) == []
