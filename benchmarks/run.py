"""The one benchmark runner: ``python3 benchmarks/run.py NAME [ARGS...]`` on the GPU machine
(``PYTHONPATH=src:.``). Each named benchmark writes JSON under $OUT and prints a short table
last; its figures go into benchmarks/RESULTS.md (one table per benchmark, dated rows, the command).

Benchmarks:
- ``zoo``: the default ladder against an expert on ordinary modules (benchmarks/zoo_bench.py)
- ``vs-hand``: fastloop beside the same training written by hand: GPT-2 124M B16/B32, ResNet-50
  B256, the launch-bound MLP (benchmarks/vs_handwritten.py)
- ``launch-bound``: the launch-bound MLP, eager against the whole-step graph
- ``imagenet-feed``: the ImageNet recipe's feed (torchvision workers against DALI)
- ``noise``: can the statistics be trusted here: A vs A trials, the noise study they give, the
  simulation fed with it, two default ladders on one module (benchmarks/noise_bench.py)
- ``tiers``: how far cuda_graph gets on each zoo module (its tier and why not higher), against
  compile alone; the CIFAR ResNet-18 against a plain Trainer and by-hand reduce-overhead
  (benchmarks/tiers_bench.py)
- ``pad-lm``: a causal LM on per-batch padded rows, without and with pad_buckets: the loss
  trajectories and real tokens/s (benchmarks/pad_lm.py)
- ``gpt-ladder``: ``fastloop ladder gpt`` (the GPT-2 recipe's default ladder), report under $OUT
- ``graph-schedules``: the whole-step graph beside eager, both adapters, in every case where the
  step's Python reads something that changes mid-run (schedulers, a CPU-tensor lr, param groups
  added, requires_grad, module modes and attributes, accumulation, the batch's strings and key
  order, a host generator, a resumed fit): the tier, the cause and the parameters after the run
  (benchmarks/graph_schedules.py)
- ``checkpoint``: how long a save blocks training, synchronous against ``async_checkpoint``, on a
  model of 512 MB, and whether the two files are equal (benchmarks/checkpoint_bench.py)
- ``compile-cache``: a configuration's compile seconds cold (``--no-cache``) against warm (the
  compile cache), fresh processes, on the ViT zoo module and the GPT recipe (benchmarks/compile_cache_bench.py)
- ``gpu-tests``: the GPU test suite (``pytest -m gpu``)

Probes (where a step's time goes; their output explains a benchmark's figure):
``gpt-profile``, ``host-profile``, ``dali-trace``, ``h2d-feed``, ``loader-throughput``,
``timer-overhead``, ``liger-fusions``, ``augment-host`` (gpu_augment's host time per batch, fused
against the ops one by one), ``graph-guard`` (the whole-step graph's guard per replay, on the host).

Example:
    ``python3 benchmarks/run.py zoo --modules cifar_resnet --rounds 3``
"""

from __future__ import annotations

import os
import runpy
import subprocess
import sys

SCRIPTS = {
    "zoo": "benchmarks/zoo_bench.py",
    "vs-hand": "benchmarks/vs_handwritten.py",
    "launch-bound": "benchmarks/launch_bound.py",
    "imagenet-feed": "benchmarks/imagenet_feed.py",
    "noise": "benchmarks/noise_bench.py",
    "tiers": "benchmarks/tiers_bench.py",
    "pad-lm": "benchmarks/pad_lm.py",
    "graph-schedules": "benchmarks/graph_schedules.py",
    "checkpoint": "benchmarks/checkpoint_bench.py",
    "compile-cache": "benchmarks/compile_cache_bench.py",
}
PROBES = {
    "gpt-profile": "benchmarks/gpt_profile.py",
    "host-profile": "benchmarks/host_profile.py",
    "dali-trace": "benchmarks/dali_trace.py",
    "h2d-feed": "benchmarks/h2d_feed.py",
    "loader-throughput": "benchmarks/loader_throughput.py",
    "timer-overhead": "benchmarks/timer_overhead.py",
    "liger-fusions": "benchmarks/liger_fusions.py",
    "augment-host": "benchmarks/augment_host.py",
    "graph-guard": "benchmarks/graph_guard.py",
}
COMMANDS = ("gpt-ladder", "gpu-tests")


def main(argv: list[str]) -> int:
    names = [*SCRIPTS, *COMMANDS, *PROBES]
    if not argv or argv[0] not in names:
        sys.stderr.write(f"usage: run.py NAME [ARGS...]; NAME is one of {', '.join(names)}\n")
        return 2
    name, rest = argv[0], argv[1:]
    if name == "gpu-tests":
        return subprocess.call([sys.executable, "-m", "pytest", "-m", "gpu", "-q", "-p", "no:cacheprovider", *rest])
    if name == "gpt-ladder":
        out = os.path.join(os.environ.get("OUT", "."), "gpt_ladder")
        return subprocess.call([sys.executable, "-m", "fastloop.cli", "ladder", "gpt", "--out", out, *rest])
    script = {**SCRIPTS, **PROBES}[name]
    sys.argv = [script, *rest]
    runpy.run_path(os.path.join(os.getcwd(), script), run_name="__main__")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
