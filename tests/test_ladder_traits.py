"""The ladder's traits of a speedup are one value, ``Speedup.ladder``: a speedup class cannot set them
as attributes of its own (they would be ignored), and a run never reads them."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from fastloop.speedups import REGISTRY, Speedup
from fastloop.speedups.ladder_traits import MOVED_TO_LADDER, LadderTraits

SRC = Path(__file__).resolve().parents[1] / "src" / "fastloop"


@pytest.mark.parametrize("attribute", ["feeds", "ablation_rank", "in_default_ladder", "sized_stat"])
def test_a_ladder_trait_set_as_a_class_attribute_is_refused(attribute):
    with pytest.raises(TypeError, match=rf"Stray: {attribute} belong in its ladder traits, e\.g\. ladder = "):
        type("Stray", (Speedup,), {"name": "stray", "changes": "data", attribute: True})


def test_a_speedup_with_its_traits_in_one_value_is_read_by_the_ladder(monkeypatch):
    from fastloop.drivers.ladder.candidates import ablation_order, split_groups

    class Feed(Speedup):
        name, changes, ladder = "test_trait_feed", "data", LadderTraits(feeds=True, ablation_rank=3)

    monkeypatch.setitem(REGISTRY, Feed.name, Feed)
    feed, compute, rest = split_groups([Feed(), REGISTRY["bf16"]()])
    assert [s.name for s in feed] == ["test_trait_feed"] and [s.name for s in compute] == ["bf16"] and rest == []
    assert ablation_order(["test_trait_feed", "bf16"]) == ["test_trait_feed", "bf16"]  # rank 3 before bf16's 5


def test_speedup_keeps_only_what_a_run_needs_and_every_speedup_has_its_traits():
    assert not MOVED_TO_LADDER & set(vars(Speedup))
    assert all(isinstance(cls.ladder, LadderTraits) for cls in REGISTRY.values())


def test_a_run_never_reads_the_ladder_traits():
    """The adapters, the Run interface and the runner apply a speedup the same way whether the
    ladder tried it or a user named it."""
    run_side = [*(SRC / "adapters").rglob("*.py"), SRC / "speedups" / "run.py", SRC / "drivers" / "runner.py"]
    readers = [str(p.relative_to(SRC)) for p in run_side if re.search(r"\.ladder\.", p.read_text())]
    assert readers == []
