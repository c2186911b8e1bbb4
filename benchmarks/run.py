"""The one benchmark runner: ``python3 benchmarks/run.py NAME [ARGS...]`` on the GPU machine
(``PYTHONPATH=src:.``). Each named benchmark writes JSON under $OUT and prints a short table
last; its figures go into benchmarks/RESULTS.md with the date and this command.

Names:
- ``zoo``: the default ladder against an expert on ordinary modules (benchmarks/zoo_bench.py)
- ``vs-hand``: fastloop beside the same training written by hand (benchmarks/vs_handwritten.py)
- ``launch-bound``: the launch-bound MLP, eager against the whole-step graph
- ``imagenet-feed``: the ImageNet recipe's feed (torchvision workers against DALI)
- ``gpu-tests``: the GPU test suite (``pytest -m gpu``)
"""

from __future__ import annotations

import os
import runpy
import subprocess
import sys

SCRIPTS = {"zoo": "benchmarks/zoo_bench.py", "vs-hand": "benchmarks/vs_handwritten.py",
           "launch-bound": "benchmarks/launch_bound.py", "imagenet-feed": "benchmarks/imagenet_feed.py"}


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in (*SCRIPTS, "gpu-tests"):
        sys.stderr.write(f"usage: run.py NAME [ARGS...]; NAME is one of {', '.join([*SCRIPTS, 'gpu-tests'])}\n")
        return 2
    name, rest = argv[0], argv[1:]
    if name == "gpu-tests":
        return subprocess.call([sys.executable, "-m", "pytest", "-m", "gpu", "-q", "-p", "no:cacheprovider", *rest])
    sys.argv = [SCRIPTS[name], *rest]
    runpy.run_path(os.path.join(os.getcwd(), SCRIPTS[name]), run_name="__main__")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
