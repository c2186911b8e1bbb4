"""Helpers shared by the GPU benchmarks: JSON output with the environment stamp, and the
interval of one side against another."""

from __future__ import annotations

import json
import os
import sys
from typing import Any

from fastloop.compare import Runs, compare
from fastloop.measure.env import env_stamp


def emit(name: str, result: dict) -> None:
    doc = {
        "benchmark": name,
        "env": env_stamp(),
        "command": " ".join([os.path.basename(sys.executable)] + sys.argv),
        **result,
    }
    text = json.dumps(doc, indent=2, default=str)
    print(text)
    out = os.environ.get("OUT")
    if out:
        with open(os.path.join(out, f"{name}.json"), "w") as f:
            f.write(text)


def side_ci(sides: dict[str, Runs], a_name: str, b_name: str) -> dict | None:
    """The run-level interval of side ``b_name`` over side ``a_name`` (None without runs), its
    verdict naming the sides: ``expert``, ``pick (bf16,cuda_graph)``."""
    a, b = sides[a_name], sides[b_name]

    def label(name: str, runs: Any) -> str:
        return name if runs.spec in ("none", name) else f"{name} ({runs.spec})"

    ci = compare(a, b, labels=(label(a_name, a), label(b_name, b)))
    return None if ci is None else {k: ci.get(k) for k in ("ratio", "ci_low", "ci_high", "significant", "verdict")}
