"""The causal LM on per-batch padded rows (benchmarks/zoo/causal_lm_padded.py), without and with
``pad_buckets``, each in a fresh process: the loss trajectories step by step (fp32, the same seed:
the padding is masked, so they agree within ``RTOL``), and throughput in real tokens/s (the module
counts its attention mask) for the plain run and for ``pad_buckets,bf16,compile,cuda_graph``.

Then compile's shape rule, chosen by measurement: on rows with a long tail of lengths
(``make_long_tail``: pad_buckets makes 3 buckets), ``compile`` with ``shapes`` auto (torch's rule:
one recompile with dynamic sizes) against static (one graph per bucket), each with and without
cuda_graph, in real tokens/s with the compile time and graph counts.

Usage: ``python3 benchmarks/run.py pad-lm [--steps 60] [--no-shapes | --shapes-only]``; writes ``pad_lm.json``
under $OUT.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from fastloop.drivers.subproc import run_in_subprocess

TARGET = "benchmarks/zoo/causal_lm_padded.py:make"
TARGET_LONG_TAIL = "benchmarks/zoo/causal_lm_padded.py:make_long_tail"
SHAPE_RUNS = (
    "pad_buckets,bf16,compile",
    "pad_buckets,bf16,compile:shapes=static",
    "pad_buckets,bf16,compile,cuda_graph",
    "pad_buckets,bf16,compile:shapes=static,cuda_graph",
)
RTOL = 1e-3
"""Largest relative difference of a step's loss, padded against unpadded (fp32 on the GPU: other
shapes pick other kernels, whose summation orders differ; the differences compound over steps)."""


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--device", default="cuda")
    p.add_argument("--no-shapes", action="store_true", help="leave out compile's shape-rule comparison")
    p.add_argument("--shapes-only", action="store_true", help="only compile's shape-rule comparison")
    args = p.parse_args(argv)
    out = Path(os.environ.get("OUT", "pad_lm_out"))
    out.mkdir(parents=True, exist_ok=True)
    if args.shapes_only:
        (out / "pad_lm.json").write_text(json.dumps({"shapes": shape_rule(args)}, indent=2, default=str))
        return 0
    docs = {}
    for spec in ("none", "pad_buckets", "pad_buckets,bf16,compile,cuda_graph"):
        docs[spec] = run_in_subprocess(TARGET, spec, steps=args.steps, warmup=5, device=args.device, profile=False)
    a, b = docs["none"]["losses"], docs["pad_buckets"]["losses"]
    n = min(len(a), len(b))
    worst = max(abs(x - y) / abs(x) for x, y in zip(a[:n], b[:n]))
    result = {
        "target": TARGET,
        "steps_compared": n,
        "max_rel_loss_diff": worst,
        "rtol": RTOL,
        "agree": worst <= RTOL,
        "runs": {
            k: {
                "throughput": d["throughput"],
                "speedups": d["speedups"],
                "batch_shapes": d.get("batch_shapes"),
                "step_s": d["step_s"],
                "losses": d["losses"],
            }
            for k, d in docs.items()
        },
    }
    (out / "pad_lm.json").write_text(json.dumps(result, indent=2, default=str))
    print(
        f"loss trajectory, {n} steps: max relative difference {worst:.2e} (tolerance {RTOL:g}): "
        f"{'agree' if worst <= RTOL else 'DIFFER'}"
    )
    print("| configuration | real tokens/s | shapes | status |")
    print("| --- | --- | --- | --- |")
    for k, d in docs.items():
        st = ", ".join(f"{r['name']} {r['status']}" for r in d["speedups"]) or "-"
        print(f"| {k} | {d['throughput']['value']:,.0f} | {(d.get('batch_shapes') or {}).get('distinct')} | {st} |")
    if not args.no_shapes:
        result["shapes"] = shape_rule(args)
        (out / "pad_lm.json").write_text(json.dumps(result, indent=2, default=str))
    return 0


def shape_rule(args: argparse.Namespace) -> dict:
    """compile's ``shapes`` auto against static on several buckets: a table and the rows."""
    rows = {}
    for spec in SHAPE_RUNS:
        d = run_in_subprocess(TARGET_LONG_TAIL, spec, steps=args.steps, warmup=10, device=args.device, profile=False)
        comp = (d.get("extra") or {}).get("compile_counters")
        rows[spec] = {
            "tokens_s": d["throughput"]["value"],
            "step_s": d["step_s"],
            "compile_s": d.get("compile_s"),
            "compile_counters": comp,
            "batch_shapes": d.get("batch_shapes"),
            "speedups": [(r["name"], r["status"], r.get("reason")) for r in d["speedups"]],
        }
    print("\ncompile's shape rule on 3 buckets (make_long_tail):")
    print("| configuration | real tokens/s | step median ms | compile s | graphs |")
    print("| --- | --- | --- | --- | --- |")
    for k, r in rows.items():
        c = r["compile_counters"] or {}
        print(
            f"| {k} | {r['tokens_s']:,.0f} | {1e3 * r['step_s']['median']:.2f} | {r['compile_s'] or 0:.1f} | "
            f"{c.get('unique_graphs')} |"
        )
    return rows


if __name__ == "__main__":
    raise SystemExit(main())
