"""Simulated ladders for the characterization and golden tests: random speedups with known effects,
measured by a fake ``measure`` on a fake clock, so that a whole ladder (its budget included) decides
the same way on every machine and every run.

Each scenario is drawn from a seed: which speedups exist (fakes with random capabilities, and some of
the real feed and compute speedups), what each does to the step and to the data wait, which one
skips itself or breaks in its process, what a run costs (a compiled run more, a new compiled graph
once more), the budget, the mode and the base. :func:`run_scenario` returns the ladder's document.
"""

from __future__ import annotations

import copy
import json
import time
from pathlib import Path

import numpy as np

from fastloop.drivers.subproc import ConfigurationFailed
from fastloop.speedups.base import REGISTRY, Speedup
from fastloop.speedups.ladder_traits import LadderTraits

FIXTURES = Path(__file__).resolve().parent / "fixtures"

KINDS = [  # (feeds, replaces_loader, needs_in_memory_tensors, changes_workload, ablation_rank, compiles)
    (True, False, False, False, 9, False),  # a CPU feed
    (True, False, False, False, None, False),  # a copy feed
    (True, True, True, False, None, False),  # the data on the GPU
    (True, True, False, False, None, False),  # a GPU loader
    (False, False, False, False, 0, True),  # compute, costly and compiling
    (False, False, False, False, 5, False),  # compute, a precision
    (False, False, False, False, None, False),  # compute, free
    (False, False, False, True, None, False),  # the workload
]
REAL = ["workers", "pin_memory", "prefetch", "bf16", "channels_last", "compile", "fused_optimizer"]
RATES = {"0": 900.0, "1": 1500.0, "2": 2900.0, "4": 5600.0, "8": 9800.0, "16": 14300.0}


class FakeClock:
    """``time.perf_counter`` for a simulated ladder: it moves only when a fake run spends seconds."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def spend(self, seconds: float) -> None:
        self.now += seconds


def _register(monkeypatch, rng) -> list[str]:
    names = []
    for i, (feeds, replaces, in_memory, workload, rank, compiles) in enumerate(KINDS):
        if rng.random() < 0.4:
            continue
        cls = type(
            f"Sim{i}",
            (Speedup,),
            {
                "name": f"sim{i}",
                "changes": "data" if feeds else "model" if compiles else "step",
                "order": 10 + i,
                "ladder": LadderTraits(
                    feeds=feeds,
                    replaces_loader=replaces,
                    needs_in_memory_tensors=in_memory,
                    changes_workload=workload,
                    ablation_rank=rank,
                ),
                "compiles": compiles,
            },
        )
        monkeypatch.setitem(REGISTRY, cls.name, cls)
        names.append(cls.name)
    for name in REAL:
        if rng.random() < 0.45:
            names.append(name)
            monkeypatch.setattr(REGISTRY[name], "why_not", lambda self, ctx: None)
    return names


def _workers_count(on: dict[str, str]) -> int:
    """The worker count a run trains with: the probe's 16 unless pinned (``workers:N``), the user's 4 without."""
    if "workers" not in on:
        return 4
    return int(on["workers"]) if on["workers"] else 16


def scenario(seed: int, monkeypatch, clock: FakeClock) -> dict:
    """The ladder's arguments for scenario ``seed`` (its fake ``measure`` included)."""
    rng = np.random.default_rng(seed)
    names = _register(monkeypatch, rng)
    gain = {n: float(rng.choice([0.7, 0.97, 1.0, 1.0, 1.03, 1.2, 1.6])) for n in names}
    pair = tuple(rng.choice(names, 2, replace=False)) if len(names) > 1 else ()
    base_wait = float(rng.choice([0.0, 0.1, 0.3, 0.6]))
    crowd = {4: 1.0, 8: float(rng.choice([0.9, 1.0, 1.2])), 16: float(rng.choice([0.8, 1.0, 1.1]))}
    noise = np.random.default_rng(int(rng.integers(1 << 30)))
    broken = str(rng.choice(names)) if names and rng.random() < 0.2 else None
    lazy = str(rng.choice(names)) if names and rng.random() < 0.3 else None  # skips itself in its process
    in_memory = bool(rng.random() < 0.5)
    busy = float(rng.choice([0.5, 0.97])) if rng.random() < 0.3 else None
    no_conv = "channels_last" in names and rng.random() < 0.3
    compiled: set[frozenset[str]] = set()

    def measure(target, spec, **kw):
        on = {} if spec == "none" else {s.partition(":")[0]: s.partition(":")[2] for s in spec.split(",")}
        compiles = any(REGISTRY[n].compiles for n in on if n in REGISTRY)
        key = frozenset(n for n in on if n in REGISTRY and (REGISTRY[n].changes == "model" or REGISTRY[n].math_dtype))
        cold = compiles and key not in compiled
        if compiles:
            compiled.add(key)
        clock.spend(1.0 + (2.0 if compiles else 0.0) + (8.0 if cold else 0.0))
        if broken in on:
            raise ConfigurationFailed(f"configuration {spec!r} failed in its process: exit -9", -9)
        speed = float(np.prod([gain[n] for n in on if n != lazy])) if on else 1.0
        if pair and set(pair) <= set(on):
            speed *= 1.5
        feeding = [n for n in on if n in REGISTRY and REGISTRY[n].ladder.feeds and n != lazy]
        count = _workers_count(on)
        speed *= crowd.get(count, 1.0) if "workers" in on else 1.0
        wait = base_wait * (0.2 if feeding else 1.0) * (0.5 if count == 8 else 1.0)
        mean = 0.01 / speed
        steps = list(mean * (1 + 0.02 * noise.standard_normal()) * (1 + 0.01 * noise.standard_normal(40)))
        extra: dict = {"dataset": {"type": "TensorDataset" if in_memory else "Dataset", "in_memory_tensors": in_memory}}
        if "workers" in on:
            extra.update(num_workers=count, loader_own_workers=4, loader_rates=dict(RATES))
        doc = {
            "step_s_all": steps,
            "items_per_step": 16,
            "throughput": {"value": 16 / mean, "unit": "samples/s"},
            "data_wait_frac": wait,
            "host_wait_frac": wait / 2,
            "step_s": {"mean": mean},
            "steps": 40,
            "warmup_steps": 5,
            "warmup_overhead_s": 8.0 if cold else 0.5,
            "speedups": [
                {"name": n, "status": "skipped" if n == lazy else "applied", "reason": "not here" if n == lazy else ""}
                for n in on
            ],
            "loss": {"first": 1.0, "last": 0.5},
            "extra": extra,
            "model_checks": {"channels_last": "the model has no convolution"} if no_conv else {},
        }
        if busy is not None:
            doc["gpu_profile"] = {"gpu_busy_frac": busy, "profile_s": 0.1}
        return doc

    mode = str(rng.choice(["select"] * 6 + ["sequential", "cumulative"]))
    budget = [15.0, 40.0, 90.0, None][int(rng.integers(4))]
    base = None
    if len(names) > 2 and rng.random() < 0.15:
        base, names = [names[-1]], names[:-1]
    return {"rungs": names, "budget": budget, "mode": mode, "base": base, "measure": measure}


def run_scenario(seed: int, monkeypatch) -> dict | None:
    """The ladder's document for scenario ``seed`` on a fake clock (None: the scenario has no speedup)."""
    from fastloop.drivers.ladder import run_ladder

    clock = FakeClock()
    monkeypatch.setattr(time, "perf_counter", clock)
    kw = scenario(seed, monkeypatch, clock)
    if not kw["rungs"]:
        return None
    return run_ladder("x", kw.pop("rungs"), device="cpu", measure_s=None, **kw)


def trail(doc: dict) -> dict:
    """What a ladder decided, in order: its stages, each rung's label, status and decision, the
    selected set, what was not tried or cut short, the ties and the answer line."""
    keys = ("rung", "rung_status", "rung_reason", "decision", "stage", "members", "ablation", "sized", "inactive")
    return {
        "stages": [[s["stage"], s["configuration"], s["bottleneck"], s["action"]] for s in doc["stages"]],
        "rungs": [{k: r[k] for k in keys if r.get(k) not in (None, "")} for r in doc["rungs"]],
        "moves": doc["moves"],
        "selected": doc["selected"],
        "selected_spec": doc["selected_spec"],
        "not_tried": doc["not_tried"],
        "cut_short": doc["cut_short"],
        "ties": [[t["kept"], t["other"]] for t in doc["ties"]],
        "callbacks_line": doc["callbacks_line"],
        "runs": doc["runs"],
    }


def shape(value: object) -> object:
    """A document's keys and value types, recursively; a list by its first element.

    Example:
        >>> shape({"a": [{"b": 1.5, "c": None}], "d": "x", "e": [], "f": True})
        {'a': [{'b': 'number', 'c': 'null'}], 'd': 'str', 'e': [], 'f': 'bool'}
    """
    if isinstance(value, dict):
        return {k: shape(v) for k, v in sorted(value.items())}
    if isinstance(value, list):
        return [shape(value[0])] if value else []
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, (int, float)):
        return "number"
    return "null" if value is None else type(value).__name__


def shape_differences(
    want: object,
    got: object,
    path: str = "$",
    optional: frozenset[str] = frozenset(),
    open_keys: frozenset[str] = frozenset(),
) -> list[str]:
    """Where two shapes differ: a key one has and the other lacks (but the ``optional`` keys), or a
    type. A null or an empty list matches anything: a value can be missing in one run only. The
    dicts under ``open_keys`` are compared as dicts only (a speedup's own statistics, keyed by what
    the speedup did in that run).

    Example:
        >>> shape_differences({"a": "number", "b": "str"}, {"a": "null", "c": "str"})
        ['$: missing b', '$: unexpected c']
        >>> shape_differences({"extra": {"x": "number"}}, {"extra": {"y": "str"}}, open_keys=frozenset({"extra"}))
        []
    """
    if want in ("null", []) or got in ("null", []):
        return []
    if isinstance(want, dict) and isinstance(got, dict):
        out = [f"{path}: missing {k}" for k in want if k not in got and k not in optional]
        out += [f"{path}: unexpected {k}" for k in got if k not in want and k not in optional]
        for k in want.keys() & got.keys():
            if k in open_keys:
                out += [] if isinstance(want[k], dict) == isinstance(got[k], dict) else [f"{path}.{k}: not a dict"]
            else:
                out += shape_differences(want[k], got[k], f"{path}.{k}", optional, open_keys)
        return out
    if isinstance(want, list) and isinstance(got, list):
        return shape_differences(want[0], got[0], f"{path}[0]", optional, open_keys)
    return [] if want == got else [f"{path}: {want} became {got}"]


def load_fixture(name: str) -> dict:
    return json.loads((FIXTURES / name).read_text())


def run_template() -> dict:
    """A real ``fastloop run demo`` document (CPU), for a simulated ladder whose runs look real."""
    return copy.deepcopy(load_fixture("demo_run.json"))


def demo_like_ladder(monkeypatch) -> dict:
    """A ladder over the CPU's real rungs whose runs are the demo's own run document, changed by
    known effects (the feed first, a compute bundle kept and ablated, the worker count sized), on a
    fake clock: its document has the keys and types of a real ladder's, the same on every run."""
    from fastloop.drivers.ladder import run_ladder

    clock = FakeClock()
    monkeypatch.setattr(time, "perf_counter", clock)
    for name in ("pin_memory", "prefetch"):
        monkeypatch.setattr(REGISTRY[name], "why_not", lambda self, ctx: None)
    noise = np.random.default_rng(7)
    template = run_template()

    def measure(target, spec, **kw):
        on = {} if spec == "none" else {s.partition(":")[0]: s.partition(":")[2] for s in spec.split(",")}
        clock.spend(2.0 + (3.0 if "compile" in on else 0.0))
        count = _workers_count(on)
        speed = (1.6 if "workers" in on else 1.0) * (1.3 if {"bf16", "compile"} <= set(on) else 1.0)
        speed *= {4: 1.0, 8: 1.1, 16: 1.0}[count] if "workers" in on else 1.0
        mean = 0.4 / speed
        doc = copy.deepcopy(template)
        doc["step_s_all"] = list(mean * (1 + 0.02 * noise.standard_normal()) * (1 + 0.01 * noise.standard_normal(30)))
        doc["step_s"] = {**doc["step_s"], "mean": mean}
        doc["throughput"] = {**doc["throughput"], "value": 32 / mean}
        doc["data_wait_frac"] = doc["host_wait_frac"] = 0.02 if "workers" in on else 0.3
        doc["speedups"] = [{"name": n, "status": "applied", "reason": ""} for n in on]
        if "workers" in on:
            doc["extra"] = {**doc["extra"], "num_workers": count, "loader_own_workers": 0, "loader_rates": RATES}
        return doc

    return run_ladder(
        "demo",
        ["workers", "pin_memory", "prefetch", "bf16", "fused_optimizer", "compile"],
        device="cpu",
        budget=200.0,
        measure=measure,
    )


TRAIL_SEEDS = [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 14, 26, 27, 31, 39, 46, 51, 57, 64, 91]
"""Scenarios whose trails are pinned: together they reach every decision, stage and mode the
simulation reaches in its first 160 seeds (chosen by set cover over those features)."""


def trail_or_error(seed: int, monkeypatch) -> dict | None:
    """:func:`trail` of scenario ``seed``, or the error the ladder ended with (a failed baseline)."""
    try:
        doc = run_scenario(seed, monkeypatch)
    except Exception as err:  # what the ladder raised is part of what it decided
        return {"error": repr(err)}
    return None if doc is None else json.loads(json.dumps(trail(doc)))


def record_trails() -> None:
    """Write the pinned scenarios' trails to tests/fixtures/ladder_trails.json (a meant change only)."""
    import pytest

    out = {}
    for seed in TRAIL_SEEDS:
        with pytest.MonkeyPatch.context() as mp:
            out[str(seed)] = trail_or_error(seed, mp)
    (FIXTURES / "ladder_trails.json").write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")


DEMO_COMMANDS = {
    "run": ["run", "demo"],
    "ladder": ["ladder", "demo"],
    "ab": ["ab", "demo", "--a", "none", "--b", "workers", "--repeats", "3"],
}
"""The demo's commands whose documents' shapes tests/fixtures/document_shapes.json pins."""


def demo_document(kind: str, folder: Path) -> dict:
    """The JSON document of the demo's ``kind`` command (``DEMO_COMMANDS``), run on the CPU in a fresh process."""
    import subprocess
    import sys

    out = folder / f"{kind}.json"
    cmd = [sys.executable, "-m", "fastloop.cli", *DEMO_COMMANDS[kind], "--device", "cpu", "--quiet", "--json", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed: {proc.stderr[-2000:]}")
    return json.loads(out.read_text())


def merged_shape(old: object, new: object, optional: frozenset[str] = frozenset()) -> object:
    """``new``, a shape just recorded, keeping what ``old`` knew that this one run could not show: a
    type where ``new`` has a null or an empty list (a list with no warning in this run), and the
    ``optional`` keys this run did not have.

    Example:
        >>> merged_shape({"w": ["str"], "a": "number", "gone": "str"}, {"w": [], "a": "null", "b": "str"})
        {'a': 'number', 'b': 'str', 'w': ['str']}
    """
    if new in ("null", []) and old not in ("null", [], None):
        return old
    if isinstance(old, dict) and isinstance(new, dict):
        keys = set(new) | {k for k in old if k in optional}
        return {k: merged_shape(old.get(k), new.get(k, old.get(k)), optional) for k in sorted(keys)}
    if isinstance(old, list) and isinstance(new, list) and old and new:
        return [merged_shape(old[0], new[0], optional)]
    return new


def record_document_shapes(optional: frozenset[str] = frozenset()) -> None:
    """Write the demo's run, ladder and ab documents' shapes into tests/fixtures/document_shapes.json,
    merged with what was recorded before (:func:`merged_shape`; a meant change of the JSON contract
    only: read the diff)."""
    import tempfile

    path = FIXTURES / "document_shapes.json"
    shapes = json.loads(path.read_text())
    with tempfile.TemporaryDirectory() as folder:
        for kind in DEMO_COMMANDS:
            shapes[kind] = merged_shape(shapes.get(kind), shape(demo_document(kind, Path(folder))), optional)
    path.write_text(json.dumps(shapes, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":  # python -m tests.ladder_sim [shapes]
    import sys

    if sys.argv[1:] == ["shapes"]:
        from tests.test_ladder_golden import OPTIONAL

        record_document_shapes(OPTIONAL)
    else:
        record_trails()
