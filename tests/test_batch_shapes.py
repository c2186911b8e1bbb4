"""Batches that change shape (text padded per batch): the run counts their shapes, and cuda_graph,
which replays one shape, is ruled out with the reason instead of measured."""

from __future__ import annotations

import torch

from fastloop.measure.shapes import GRAPH_MAX_SHAPES, ShapeTally, graph_shape_check, shape_key


def test_shape_key_reads_nested_batches():
    batch = {"tokens": torch.zeros(4, 9, dtype=torch.long), "extra": [torch.zeros(4), "meta"]}
    assert shape_key(batch) == ((4, 9), (4,))


def test_a_short_last_batch_or_a_few_buckets_do_not_rule_graphs_out():
    tally = ShapeTally()
    for _ in range(30):
        tally.add(torch.zeros(16, 32))
    tally.add(torch.zeros(7, 32))  # drop_last=False
    assert graph_shape_check(tally.summary()) is None
    buckets = ShapeTally()
    for i in range(40):
        buckets.add(torch.zeros(16, (32, 64, 128, 256)[i % 4]))  # four buckets: one graph each can pay
    assert buckets.summary()["distinct"] == 4 and graph_shape_check(buckets.summary()) is None


def test_text_padded_per_batch_rules_cuda_graph_out_with_the_reason():
    from fastloop.drivers.runner import run_configuration

    doc = run_configuration(
        "tests/targets.py:padded_text", "none", steps=24, warmup=2, device="cpu", steady_warmup=False
    )
    shapes = doc["batch_shapes"]
    assert shapes["distinct"] > GRAPH_MAX_SHAPES and shapes["most_common_share"] < 0.5
    assert shapes["varying"].startswith("input 0 dim 1: ")  # the sequence length; the batch size stays 8
    reason = doc["model_checks"]["cuda_graph"]
    assert reason.startswith("the batches change shape (") and "pad to one fixed length" in reason

    fixed = run_configuration(
        "tests/targets.py:padded_text",
        "none",
        steps=24,
        warmup=2,
        device="cpu",
        steady_warmup=False,
        target_kwargs={"fixed": 40},
    )
    assert fixed["batch_shapes"]["distinct"] == 1 and "cuda_graph" not in fixed["model_checks"]


def test_the_ladder_leaves_cuda_graph_out_of_the_compute_bundle_when_the_batches_change_shape(monkeypatch):
    from fastloop.drivers.ladder import run_ladder
    from fastloop.speedups import REGISTRY

    monkeypatch.setattr(REGISTRY["cuda_graph"], "why_not", lambda self, ctx: None)  # as on a GPU
    reason = graph_shape_check(
        {"steps": 40, "distinct": 30, "most_common_share": 0.1, "varying": "input 0 dim 1: 8-63"}
    )
    specs = []

    def measure(target, spec, **kw):
        specs.append(spec)
        names = set() if spec == "none" else set(spec.split(","))
        mean = 0.010 / (1.5 if "bf16" in names else 1.0)
        return {
            "step_s_all": [mean] * 40,
            "items_per_step": 16,
            "throughput": {"value": 16 / mean, "unit": "samples/s"},
            "data_wait_frac": 0.0,
            "step_s": {"mean": mean},
            "loss": {"first": 1.0, "last": 0.5},
            "speedups": [{"name": n, "status": "applied", "reason": ""} for n in names],
            "steps": 40,
            "warmup_steps": 5,
            "model_checks": {"cuda_graph": reason},
        }

    doc = run_ladder("x", ["bf16", "cuda_graph"], measure=measure, device="cpu")
    graph = next(r for r in doc["rungs"] if r["rung"] == "+cuda_graph")
    assert graph["rung_status"] == "skipped" and graph["rung_reason"] == f"not measured: {reason}"
    assert not any("cuda_graph" in s for s in specs) and "bf16" in doc["selected"]


def test_the_doctor_advises_compile_not_graphs_for_a_launch_bound_step_whose_batches_change_shape():
    from fastloop.drivers.doctor import _launch_fix, without_measured

    reason = graph_shape_check(
        {"steps": 40, "distinct": 30, "most_common_share": 0.1, "varying": "input 0 dim 1: 8-63"}
    )
    text = _launch_fix({"model_checks": {"cuda_graph": reason}})
    assert text.startswith("compile (fewer launches; a CUDA graph cannot help here: the batches change shape")
    # compile measured and not faster: nothing re-advises cuda_graph by name
    d = without_measured({"recommendation": text}, {"compile": "0.99x"})
    assert "cuda_graph" not in d["recommendation"] and d["advice_filtered"] == ["compile"]
    assert _launch_fix({}).startswith("cuda_graph (whole-step capture)")


def test_shapes_are_read_from_any_batch_without_rebuilding_it():
    from collections import UserDict

    class Encoding(UserDict):  # as a tokenizer returns: a mapping that is not a dict
        pass

    class Pair(dict):  # a dict subclass whose constructor takes other arguments
        def __init__(self, a, b):
            super().__init__(a=a, b=b)

    assert shape_key(Encoding(input_ids=torch.zeros(2, 5), mask=torch.zeros(2, 5))) == ((2, 5), (2, 5))
    assert shape_key(Pair(torch.zeros(3), torch.zeros(3, 4))) == ((3,), (3, 4))
    tally = ShapeTally()
    tally.add(object())  # nothing to read: counted as one shape, never an error
    assert tally.summary()["distinct"] == 1
