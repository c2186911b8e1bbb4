"""Helpers shared by the GPU benchmarks: JSON output with the environment stamp."""

from __future__ import annotations

import json
import os
import sys

from fastloop.measure.env import env_stamp


def emit(name: str, result: dict) -> None:
    doc = {"benchmark": name, "env": env_stamp(), "command": " ".join([os.path.basename(sys.executable)] + sys.argv), **result}
    text = json.dumps(doc, indent=2, default=str)
    print(text)
    out = os.environ.get("OUT")
    if out:
        with open(os.path.join(out, f"{name}.json"), "w") as f:
            f.write(text)
