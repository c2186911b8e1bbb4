"""The GPU-busy arithmetic and what the ladder, the doctor and the report make of a profile
(the profile itself needs CUDA: tests/test_gpu.py)."""

from __future__ import annotations

import pytest
import torch

from fastloop.drivers.doctor import diagnose
from fastloop.drivers.ladder.rung import breakdown
from fastloop.measure.gpu_busy import busy_span, summarize_trace
from fastloop.report.html import render_html


def test_busy_is_the_union_of_overlapping_intervals_over_the_span():
    assert busy_span([]) == (0.0, 0.0)
    assert busy_span([(10, 20), (0, 5), (15, 30), (40, 50)]) == (35.0, 50.0)  # [0,5] [10,30] [40,50]
    assert busy_span([(0, 100), (10, 20)]) == (100.0, 100.0)  # nested


def test_trace_summary_counts_syncing_host_calls_per_step():
    s = summarize_trace(
        [(0, 600), (1000, 1600)],
        ["cudaLaunchKernel", "cudaStreamSynchronize", "cudaMemcpy", "cudaStreamSynchronize", "cudaMemcpyAsync"],
        steps=2,
    )
    assert s["gpu_busy_frac"] == pytest.approx(1200 / 1600)
    assert s["gpu_busy_ms_per_step"] == pytest.approx(0.6) and s["span_ms_per_step"] == pytest.approx(0.8)
    assert s["sync_calls"] == {"cudaStreamSynchronize": 2, "cudaMemcpy": 1} and s["host_syncs_per_step"] == 1.5


def _cfg(busy, wait=0.0, syncs=0.0):
    return {
        "data_wait_frac": wait,
        "step_s": {"median": 0.010, "mean": 0.010},
        "peak_mem_bytes": None,
        "mfu": None,
        "speedups": [{"name": "bf16", "status": "applied"}],
        "gpu_profile": {
            "gpu_busy_frac": busy,
            "profiled_steps": 3,
            "host_syncs_per_step": syncs,
            "sync_calls": {"cudaStreamSynchronize": 3} if syncs else {},
        },
    }


def test_doctor_calls_a_mostly_idle_gpu_host_bound_and_names_the_syncs():
    d = diagnose(_cfg(0.4, syncs=1.0))
    assert d["bottleneck"] == "host-bound"
    assert "busy 40%" in d["evidence"] and "idle 60%" in d["evidence"] and "1.0 times per step" in d["evidence"]
    assert d["recommendation"].startswith("remove the per-step host syncs")
    assert diagnose(_cfg(0.4))["recommendation"].startswith("cuda_graph")
    assert diagnose(_cfg(0.97))["bottleneck"] != "host-bound"
    assert diagnose(_cfg(0.5, wait=0.45))["bottleneck"] == "data-bound"  # the wait explains the idle time


def test_ladder_breakdown_and_html_split_the_step_three_ways():
    cfg = _cfg(0.5, wait=0.2)
    b = breakdown(cfg)
    assert b["gpu_busy_s"] == pytest.approx(0.005) and b["data_wait_s"] == pytest.approx(0.002)
    assert b["host_idle_s"] == pytest.approx(0.003)
    assert "host_idle_s" not in breakdown({**cfg, "gpu_profile": None})  # CPU: no profile, no split
    doc = {"kind": "run", "target": "x", **cfg, "throughput": {"value": 1.0, "unit": "samples/s"}}
    assert 'id="plot-breakdown"' in render_html(doc)


def test_doctor_names_the_line_that_synchronizes_when_the_profile_found_it():
    cfg = _cfg(0.4, syncs=2.0)
    cfg["gpu_profile"]["sync_sites"] = [
        {
            "site": "model.py:41 in forward (inside torch/nn/modules/transformer.py:380 _detect_is_causal_mask)",
            "per_step": 1.0,
        },
        {"site": "outside your code", "per_step": 1.0},
    ]
    evidence = diagnose(cfg)["evidence"]
    assert (
        "it synchronizes at model.py:41 in forward (inside torch/nn/modules/transformer.py:380 "
        "_detect_is_causal_mask) (1 a step)"
    ) in evidence and "outside your code" not in evidence
    assert "synchronizes at" not in diagnose(_cfg(0.4, syncs=2.0))["evidence"]  # no sites: nothing claimed


def test_doctor_names_prog_bar_logging_as_a_sync():
    cfg = _cfg(0.5, syncs=1.0)
    cfg["extra"] = {"prog_bar_keys": ["train_loss"]}
    assert "self.log of train_loss with prog_bar=True" in diagnose(cfg)["recommendation"]


def test_busy_is_a_share_of_the_measured_step_not_of_a_gappy_profiled_span():
    """On an H200 ResNet-50's profiled steps spanned 49.4 ms against a measured 37.3 ms (a gap
    in the profiled window); the GPU worked 36.3 ms a step. busy / span said 74% (host-bound);
    per measured step it is 97%, beside the same steps' data wait."""
    from fastloop.measure.gpu_busy import per_measured_step

    raw = summarize_trace([(0, 36_300), (60_000, 96_300), (120_000, 156_300)], ["cudaLaunchKernel"], 3)
    assert raw["gpu_busy_frac"] == pytest.approx(108_900 / 156_300)
    p = per_measured_step(raw, 0.0373)
    assert p["gpu_busy_frac"] == pytest.approx(36.3 / 37.3) and p["span_busy_frac"] == raw["gpu_busy_frac"]
    assert per_measured_step(raw, 0.030)["gpu_busy_frac"] == 1.0  # capped: never above the whole step
    assert per_measured_step(None, 0.03) is None and per_measured_step({"error": "x"}, 0.03) == {"error": "x"}


def test_a_host_bound_step_fed_on_the_gpu_and_graphed_in_part_gets_advice_that_applies():
    """A ViT: gpu_augment serves the batches on the GPU and the graph holds forward and
    backward only. The advice named pin_memory (nothing to pin) and cuda_graph (on already), and
    the ladder's filtering then cut it to those two names; it now says what keeps the step out."""
    from fastloop.drivers.doctor import without_measured

    why = "OneCycleLR cycles AdamW's betas every step (cycle_momentum=True), which a graph would bake in"
    cfg = _cfg(0.49, wait=0.07, syncs=2.7)
    cfg["speedups"] = [
        {"name": "gpu_augment", "status": "applied"},
        {"name": "bf16", "status": "applied"},
        {"name": "cuda_graph", "status": "applied", "detail": f"forward+backward graphed (whole step: {why})"},
    ]
    cfg["extra"] = {
        "cuda_graph_tier": "forward+backward graphed",
        "cuda_graph_why_not_whole": why,
    }  # as both adapters record it
    d = diagnose(cfg)
    assert d["bottleneck"] == "host-bound"
    rec = d["recommendation"]
    assert rec.startswith("remove the per-step host syncs first") and why in rec, rec
    assert "pin_memory" not in rec and "cuda_graph" not in rec and "graph holds only forward+backward" in rec
    assert without_measured(d, {"compile": "0.98x, no significant difference"}) == d  # nothing named, prose kept
    # fed from the CPU and graphed whole: pinned batches still, and no graph advised (it holds the whole step)
    plain = diagnose(
        {
            **cfg,
            "speedups": [
                {
                    "name": "cuda_graph",
                    "status": "applied",
                    "detail": "whole step (forward, backward, optimizer) captured in 0.03 s",
                }
            ],
            "extra": {"cuda_graph_tier": "whole step"},
        }
    )
    assert "pin_memory for batches" in plain["recommendation"] and "cuda_graph" not in plain["recommendation"]
    assert "already replays as one CUDA graph" in plain["recommendation"], plain
    assert "then the whole step already" not in plain["recommendation"]  # said as its own clause


def test_a_short_step_graphed_whole_is_not_called_launch_bound_and_its_wait_is_the_feed(monkeypatch):
    """A U-Net's pick (on one H100): the whole step one graph (compile, cuda_graph), 4.07 ms
    a step, MFU unknown, 18% data wait. It was called launch-bound with the advice "cuda_graph
    (whole-step capture) or compile", both on already. A whole step replayed as one graph launches
    nothing one by one: the wait (>= 10% there) is what is left, and the GPU paths that the loader's
    data check rules out (a hand-written __getitem__: no transform to translate) are not advised."""
    import types

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # the launch-bound rule is the GPU's
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: types.SimpleNamespace(total_memory=80 * 2**30))
    graphed = [{"name": n, "status": "applied"} for n in ("bf16", "compile", "cuda_graph", "pin_memory")]
    checks = {
        "gpu_augment": "the dataset has no transform to run on the GPU",
        "dali": "the dataset is PairedCrops, not an ImageFolder/DatasetFolder of image files",
    }
    cfg = {
        "data_wait_frac": 0.18,
        "step_s": {"median": 0.00407, "mean": 0.0042},
        "peak_mem_bytes": 7e8,
        "mfu": None,
        "speedups": graphed,
        "extra": {"cuda_graph_tier": "whole step"},
        "model_checks": checks,
    }
    d = diagnose(cfg)
    assert d["bottleneck"] == "data-bound", d
    assert "no transform to run on the GPU" in d["recommendation"]
    assert (
        "dali" not in d["recommendation"]
        and "gpu_augment" not in d["recommendation"]
        and "cuda_graph" not in d["recommendation"]
    )
    assert [n for n, _ in d["advice"]] == ["workers", "prefetch", None]  # the CPU feed's own fixes not applied yet
    # a U-Net ladder on an H100: its pick had pin_memory and prefetch, and workers measured not faster;
    # the filtered advice read "Next: pin_memory" (the prose "pinned memory" matched its name) and lost the rest
    from fastloop.drivers.doctor import without_measured

    pick = diagnose({**cfg, "speedups": graphed + [{"name": "prefetch", "status": "applied"}]})
    out = without_measured(pick, {"workers": "without it 1.04x [0.94, 1.16], no significant difference"})
    rec = out["recommendation"]
    assert out["advice_filtered"] == ["workers"] and "pin_memory" not in rec and "prefetch" not in rec, rec
    assert (
        rec.startswith("this loader's data cannot be decoded or augmented on the GPU") and "cache decoded data" in rec
    )
    assert rec.endswith("not advised again: workers (without it 1.04x [0.94, 1.16], no significant difference).")
    # the same step with a partial graph (forward+backward) under 10% wait is still launch-bound, with the reason
    part = {
        **cfg,
        "data_wait_frac": 0.05,
        "extra": {"cuda_graph_tier": "forward+backward graphed", "cuda_graph_why_not_whole": "the optimizer is LBFGS"},
    }
    d2 = diagnose(part)
    assert d2["bottleneck"] == "launch-bound" and "the optimizer is LBFGS" in d2["recommendation"], d2
    # whole, below 10%: neither launch-bound nor data-bound
    assert diagnose({**cfg, "data_wait_frac": 0.05})["bottleneck"] not in ("launch-bound", "data-bound")


def test_the_advice_of_a_custom_collate_run_never_names_what_the_same_run_refused():
    """A held-out run: in-memory token rows padded by a custom collate_fn, the pick
    pad_buckets,tf32,bf16,fused_optimizer,cuda_graph waiting 19% for data with a prog_bar value
    read every step. The report said "Next: gpu_resident" while its own records said gpu_resident
    skipped (custom collate_fn); now the advice is the background feed and the sync."""
    from fastloop.drivers.doctor import diagnose

    applied = ["pad_buckets", "tf32", "bf16", "fused_optimizer", "cuda_graph"]
    cfg = {
        "data_wait_frac": 0.19,
        "step_s": {"median": 0.0081, "mean": 0.0081},
        "items_per_step": 64,
        "peak_mem_bytes": 2**30,
        "host_fetch_s": 0.00129,
        "speedups": [{"name": n, "status": "applied", "reason": ""} for n in applied]
        + [
            {"name": "gpu_resident", "status": "skipped", "reason": "the loader has a custom collate_fn"},
            {"name": "workers", "status": "skipped", "reason": "worker processes deliver less than the main process"},
        ],
        "extra": {
            "dataset": {"in_memory_tensors": True, "bytes": 5 * 2**20, "type": "Rows"},
            "cuda_graph_tier": "whole step",
            "prog_bar_keys": ["train_loss"],
        },
    }
    d = diagnose(cfg)
    names = [n for n, _ in d["advice"]]
    assert d["bottleneck"] == "data-bound" and "gpu_resident" not in names and "workers" not in names, d
    assert "prefetch" in names and "background thread" in d["recommendation"], d
    assert "train_loss without prog_bar=True" in d["recommendation"], d
    assert "gpu_resident" not in d["recommendation"] and "workers (" not in d["recommendation"]
