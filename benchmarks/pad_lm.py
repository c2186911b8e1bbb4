"""The causal LM on per-batch padded rows (benchmarks/zoo/causal_lm_padded.py), without and with
``pad_buckets``, each in a fresh process: the loss trajectories step by step (fp32, the same seed:
the padding is masked, so they agree within ``RTOL``), and throughput in real tokens/s (the module
counts its attention mask) for the plain run and for ``pad_buckets,bf16,compile,cuda_graph``.

Usage: ``python3 benchmarks/run.py pad-lm [--steps 60]``; writes ``pad_lm.json`` under $OUT.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from fastloop.drivers.subproc import run_in_subprocess

TARGET = "benchmarks/zoo/causal_lm_padded.py:make"
RTOL = 1e-3
"""Largest relative difference of a step's loss, padded against unpadded (fp32 on the GPU: other
shapes pick other kernels, whose summation orders differ; the differences compound over steps)."""


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--device", default="cuda")
    args = p.parse_args(argv)
    out = Path(os.environ.get("OUT", "pad_lm_out"))
    out.mkdir(parents=True, exist_ok=True)
    docs = {}
    for spec in ("none", "pad_buckets", "pad_buckets,bf16,compile,cuda_graph"):
        docs[spec] = run_in_subprocess(TARGET, spec, steps=args.steps, warmup=5, device=args.device, profile=False)
    a, b = docs["none"]["losses"], docs["pad_buckets"]["losses"]
    n = min(len(a), len(b))
    worst = max(abs(x - y) / abs(x) for x, y in zip(a[:n], b[:n]))
    result = {"target": TARGET, "steps_compared": n, "max_rel_loss_diff": worst, "rtol": RTOL, "agree": worst <= RTOL,
              "runs": {k: {"throughput": d["throughput"], "speedups": d["speedups"], "batch_shapes": d.get("batch_shapes"),
                           "step_s": d["step_s"], "losses": d["losses"]} for k, d in docs.items()}}
    (out / "pad_lm.json").write_text(json.dumps(result, indent=2, default=str))
    print(f"loss trajectory, {n} steps: max relative difference {worst:.2e} (tolerance {RTOL:g}): "
          f"{'agree' if worst <= RTOL else 'DIFFER'}")
    print("| configuration | real tokens/s | shapes | status |")
    print("| --- | --- | --- | --- |")
    for k, d in docs.items():
        st = ", ".join(f"{r['name']} {r['status']}" for r in d["speedups"]) or "-"
        print(f"| {k} | {d['throughput']['value']:,.0f} | {(d.get('batch_shapes') or {}).get('distinct')} | {st} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
