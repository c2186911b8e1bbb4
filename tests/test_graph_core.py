"""cuda_graph written once: the capture core's rule for batch shapes (tests/test_pad_buckets.py
runs it on the GPU), the tier policy both adapters follow, and the one-off steps the step timer
leaves out (a graph captured for a shape first seen after warm-up)."""

from __future__ import annotations

import time

import pytest
import torch

from fastloop.measure.timer import StepTimer, one_off_step
from fastloop.speedups.cuda_graph.cuda_graph import TIERS, common_blocker, tier_below_whole
from fastloop.speedups.cuda_graph.graph_capture import StepGraphs


def test_a_new_shape_is_captured_at_its_second_step_up_to_the_cap():
    g = StepGraphs(max_graphs=2)
    a, b, c = (StepGraphs.key(torch.zeros(4, n)) for n in (8, 16, 24))
    assert g.route(a) == "eager"  # no graph yet: the adapter captures the first shape itself
    g.add(a, "graph a", 0.5)
    assert g.capture_s == 0.5 and g.route(a) == "replay"
    assert [g.route(b), g.route(b)] == ["eager", "capture"]
    g.add(b, "graph b", 0.2)
    assert g.route(b) == "replay" and g.late_captures == [0.2]
    assert [g.route(c), g.route(c), g.route(c)] == ["eager"] * 3  # past max_graphs: eager
    assert g.summary() == {"graphs": 2, "late_captures": 1, "late_capture_s": 0.2, "late_failed": None}


def test_a_shape_whose_capture_failed_is_never_retried():
    g = StepGraphs()
    a, b = StepGraphs.key(torch.zeros(2, 3)), StepGraphs.key(torch.zeros(2, 5))
    g.add(a, "graph a", 0.1)
    assert [g.route(b), g.route(b)] == ["eager", "capture"]
    g.refuse(b, "capture failed: x")
    assert [g.route(b) for _ in range(3)] == ["eager"] * 3 and g.summary()["late_failed"] == "capture failed: x"


def test_a_late_capture_is_left_out_of_the_step_statistics_and_reported():
    t = StepTimer("cpu", warmup=1)
    g = StepGraphs()
    for i in range(6):
        t.fetch_start()
        t.fetch_end()
        if i == 0:
            g.add(("first",), "graph", 0.01)  # the warm-up's capture: not a one-off step
        if i == 3:
            time.sleep(0.05)
            g.add(("late",), "graph", 0.05)
        time.sleep(0.002)
        t.step_end()
    r = t.result()
    assert r.steps == 4 and len(r.wait_s) == 4 and max(r.step_s) < 0.04
    assert [o["step"] for o in r.one_off] == [3] and r.one_off[0]["s"] >= 0.05 and "graph" in r.one_off[0]["why"]


def test_one_off_work_marks_only_the_step_under_way():
    t = StepTimer("cpu")
    for i in range(3):
        t.fetch_start()
        t.fetch_end()
        if i == 1:
            one_off_step("something once")
        t.step_end()
    assert [o["step"] for o in t.result().one_off] == [1] and t.result().steps == 2
    one_off_step("outside any timed run")  # a mark left before a new timer belongs to none of its steps
    t = StepTimer("cpu")
    t.fetch_start()
    t.fetch_end()
    t.step_end()
    assert t.result().one_off is None and t.result().steps == 1


@pytest.mark.parametrize(
    "mode,unsafe,children,user,want_tier,want_mode,status",
    [
        (None, None, True, False, TIERS[1], "reduce-overhead", "applied"),
        ("default", None, True, False, TIERS[1], "reduce-overhead", "applied"),  # compile's mode raised
        ("reduce-overhead", None, True, False, TIERS[1], None, "applied"),  # compile graphs it already
        (None, "2 processes with manual optimization", True, False, TIERS[2], "default", "fallback"),
        ("default", "2 processes with manual optimization", True, False, TIERS[2], None, "fallback"),
        (None, None, False, False, TIERS[3], None, "fallback"),
        (None, None, True, True, TIERS[3], None, "fallback"),
    ],
)
def test_the_tier_below_the_whole_step_is_one_policy(mode, unsafe, children, user, want_tier, want_mode, status):
    tier = tier_below_whole(
        "the step syncs", compiled_mode=mode, graphs_unsafe=unsafe, can_compile=children, user_compiled=user
    )
    assert (tier.name, tier.compile_mode, tier.status) == (want_tier, want_mode, status)
    assert "whole step: the step syncs" in tier.detail


def test_what_keeps_any_step_from_one_graph():
    assert common_blocker(cuda=False, scale_loss=False) == "no CUDA"
    assert "GradScaler" in common_blocker(cuda=True, scale_loss=True)
    assert common_blocker(cuda=True, scale_loss=False) is None


def test_compile_that_compiled_nothing_is_one_rule_for_both_adapters(monkeypatch):
    from fastloop.speedups.compile import compile as C

    monkeypatch.setattr(C, "compiled_graph_count", lambda: (3, 9))  # frames tried since, no new graph
    monkeypatch.setattr(C, "first_graph_break", lambda: "a data-dependent branch")
    before = (3, 5)
    assert "compiled no graph" in C.compile_fell_back(before, compile_mode="default", graphed_by_compile=False)
    assert "a data-dependent branch" in C.compile_fell_back(before, compile_mode=None, graphed_by_compile=True)
    assert C.compile_fell_back(before, compile_mode=None, graphed_by_compile=False) is None  # nothing compiled by it
    assert C.compile_fell_back(None, compile_mode="default", graphed_by_compile=False) is None  # not counted
    monkeypatch.setattr(C, "compiled_graph_count", lambda: (4, 9))  # a graph was compiled
    assert C.compile_fell_back(before, compile_mode="default", graphed_by_compile=False) is None
