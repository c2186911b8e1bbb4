"""What the whole-step graph's guard costs per replay, on the host: a module of 100 parameters in
51 modules, its fused AdamW prepared for capture, and a batch dict of three tensors and a string.

Each replay of a captured step first runs, on the host and without a device sync: the batch's key
(:func:`~fastloop.speedups.cuda_graph.graph_capture.batch_key`: its structure, names and non-tensor leaves),
the param groups' identity (:meth:`~fastloop.speedups.cuda_graph.captured_step.PreparedOptimizer.stale`), the
step's state (:class:`~fastloop.speedups.cuda_graph.graph_guard.StepState`: groups, requires_grad, module
scalars), the lr tensors' sync and the baked hyperparameters
(:class:`~fastloop.speedups.cuda_graph.graph_guard.Baked`). This times each part and their sum (the median
of repeats, microseconds per replay), beside the key and the guard the engine had before (the
tensors' shapes in order, the hyperparameters of the groups captured).

Usage: ``python3 benchmarks/run.py graph-guard`` (a GPU if there is one, else the CPU; JSON under $OUT).
"""

from __future__ import annotations

import statistics
import sys
import timeit

import torch

from fastloop.speedups.cuda_graph.captured_step import prepare_for_capture
from fastloop.speedups.cuda_graph.graph_capture import batch_key, shapes_of
from fastloop.speedups.cuda_graph.graph_guard import Baked, StepState

LAYERS, WIDTH, BATCH, SEQ = 50, 64, 16, 128
REPEATS, NUMBER = 7, 2000


def _setup(device: str) -> tuple:
    model = torch.nn.Sequential(*(torch.nn.Linear(WIDTH, WIDTH) for _ in range(LAYERS))).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    prepared = prepare_for_capture(opt)
    batch = {
        "input_ids": torch.zeros(BATCH, SEQ, dtype=torch.long, device=device),
        "attention_mask": torch.ones(BATCH, SEQ, dtype=torch.long, device=device),
        "labels": torch.zeros(BATCH, SEQ, dtype=torch.long, device=device),
        "task": "lm",
    }
    return model, opt, prepared, batch


def _us(fn) -> float:
    """The median of REPEATS timings of NUMBER calls, in microseconds per call."""
    return statistics.median(timeit.repeat(fn, number=NUMBER, repeat=REPEATS)) / NUMBER * 1e6


def measure(device: str) -> dict:
    model, opt, prepared, batch = _setup(device)
    state = StepState(opt, model)
    baked = Baked(opt, followed=[lr.tensor for lr in prepared.lr_pairs])
    last = state.now()
    parts = {
        "batch_key": lambda: batch_key(batch),
        "groups_stale": prepared.stale,
        "step_state": lambda: state.now() == last,
        "lr_sync": prepared.sync,
        "baked": baked.changed,
    }
    got = {name: _us(fn) for name, fn in parts.items()}

    def guard() -> None:
        batch_key(batch)
        prepared.stale()
        _ = state.now() == last
        prepared.sync()
        baked.changed()

    got["guard"] = _us(guard)
    old_baked = [(k, v) for g in opt.param_groups for k, v in g.items() if k not in ("params", "lr")]

    def before() -> None:  # the key and the check of hyperparameters the engine had before
        tuple(shapes_of(batch))
        prepared.sync()
        for k, v in old_baked:
            _ = opt.param_groups[0].get(k) == v

    got["guard_before"] = _us(before)
    return {
        "device": device,
        "parameters": sum(1 for _ in model.parameters()),
        "modules": sum(1 for _ in model.modules()),
        "us_per_replay": {k: round(v, 2) for k, v in got.items()},
    }


def main(argv: list[str]) -> int:
    from benchmarks._common import emit

    device = "cuda" if torch.cuda.is_available() else "cpu"
    result = measure(device)
    emit("graph_guard", result)
    print(f"\n{result['parameters']} parameters, {result['modules']} modules, a batch dict of 3 tensors and a string")
    for k, v in result["us_per_replay"].items():
        print(f"{k:14} {v:8.2f} us per replay")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
