"""The staged ladder search on many random cases (fakes; no process is started): whatever the
speedups' capabilities (feeds, GPU feeds, in-memory-only feeds, the workload, ablation costs),
whatever their effects and the data wait, and whether the dataset is in memory, the search ends
without an error, decides every rung it measured, selects only what it tried, and its document
holds together. Two H200 ladders once ended in an internal error at a branch no hand-written
case reached; this walks the branches at random."""

from __future__ import annotations

import numpy as np
import pytest

from fastloop.drivers.ladder import run_ladder
from fastloop.drivers.subproc import ConfigurationFailed
from fastloop.speedups.base import REGISTRY, Speedup
from fastloop.speedups.ladder_traits import LadderTraits

KINDS = [  # capabilities a speedup may have: (feeds, replaces_loader, needs_in_memory_tensors, changes_workload, rank)
    (True, False, False, False, 9),  # a CPU feed (workers)
    (True, False, False, False, None),  # a copy feed (pin_memory)
    (True, True, True, False, None),  # the data on the GPU (gpu_resident)
    (True, True, False, False, None),  # a GPU loader (DALI)
    (False, False, False, False, 0),  # compute, costly (compile)
    (False, False, False, False, 5),  # compute (bf16)
    (False, False, False, False, None),  # compute, free (fused_optimizer)
    (False, False, False, True, None),  # the workload (batch_size)
]


def _register(monkeypatch, rng) -> list[str]:
    names = []
    for i, (feeds, replaces, in_memory, workload, rank) in enumerate(KINDS):
        if rng.random() < 0.3:
            continue
        cls = type(
            f"Fuzz{i}",
            (Speedup,),
            {
                "name": f"fuzz{i}",
                "changes": "data" if feeds else "step",
                "order": 10 + i,
                "ladder": LadderTraits(
                    feeds=feeds,
                    replaces_loader=replaces,
                    needs_in_memory_tensors=in_memory,
                    changes_workload=workload,
                    ablation_rank=rank,
                ),
            },
        )
        monkeypatch.setitem(REGISTRY, cls.name, cls)
        names.append(cls.name)
    return names


def _fake(rng, names, in_memory: bool):
    gain = {n: float(rng.choice([0.8, 1.0, 1.0, 1.05, 1.3, 2.0])) for n in names}
    pair = tuple(rng.choice(names, 2, replace=False)) if len(names) > 1 else ()
    base_wait = float(rng.choice([0.0, 0.1, 0.5, 0.8]))
    noise = np.random.default_rng(int(rng.integers(1 << 30)))
    broken = str(rng.choice(names)) if rng.random() < 0.3 else None

    def measure(target, spec, **kw):
        on = set() if spec == "none" else {s.split(":")[0] for s in spec.split(",")}
        speed = float(np.prod([gain[n] for n in on])) if on else 1.0
        if pair and set(pair) <= on:
            speed *= 1.5  # a pair that helps only together
        wait = base_wait * (0.2 if any(KINDS[int(n[4:])][0] for n in on) else 1.0)
        mean = 0.01 / speed
        steps = list(mean * (1 + 0.02 * noise.standard_normal()) * (1 + 0.01 * noise.standard_normal(40)))
        if broken in on:  # a speedup whose every configuration fails in its process
            raise ConfigurationFailed(f"configuration {spec!r} failed in its process: exit -9", -9)
        return {
            "step_s_all": steps,
            "items_per_step": 16,
            "throughput": {"value": 16 / mean, "unit": "samples/s"},
            "data_wait_frac": wait,
            "step_s": {"mean": mean},
            "steps": 40,
            "warmup_steps": 5,
            "speedups": [{"name": n, "status": "applied", "reason": ""} for n in on],
            "loss": {"first": 1.0, "last": 0.5},
            "extra": {"dataset": {"type": "TensorDataset" if in_memory else "Dataset", "in_memory_tensors": in_memory}},
        }

    return measure


@pytest.mark.parametrize("seed", range(150))
def test_the_staged_search_holds_together_on_random_cases(monkeypatch, seed):
    rng = np.random.default_rng(seed)
    names = _register(monkeypatch, rng)
    if not names:
        return
    budget = float(rng.choice([5.0, 60.0, 600.0]))
    doc = run_ladder("x", names, device="cpu", budget=budget, measure=_fake(rng, names, bool(rng.random() < 0.5)))
    tried = set()
    for r in doc["rungs"]:
        assert (
            r.get("decision") is not None
            or r["rung"] == "baseline"
            or r.get("final")
            or r.get("rung_status") in ("failed", "skipped")
        ), r
        tried.update(s.split(":")[0] for s in (r.get("members") or []))
        tried.update(s.split(":")[0] for s in r["rung"].lstrip("+-").split(" (")[0].split(","))
    assert set(doc["selected"]) <= set(names) and set(doc["selected"]) <= tried | {""}, (doc["selected"], tried)
    assert len(set(doc["selected"])) == len(doc["selected"])
    assert all(s in names for s in doc["selected"])
    assert doc["stages"][0]["stage"] == "baseline"
    assert all(item.get("why") for item in doc.get("not_tried") or [])
