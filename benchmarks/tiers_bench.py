"""The tiers benchmark (issue 32): how far ``cuda_graph`` gets on ordinary code, and what it buys.

For each zoo module (benchmarks/zoo/MODULE.py:make, written as its users write it), two
configurations in fresh processes, interleaved round by round (every module's round r before any
module's round r+1, so a call cut short by ``--max-s`` leaves every module with the same rounds;
the pair's order alternates from round to round, A B then B A):

- ``compile``: the module's feed and precision (``BASE`` below) with ``compile``;
- ``cuda_graph``: the same with ``compile,cuda_graph``.

Each run measures a 2 s window of steady steps with fastloop's own clock. Per module: the tier
cuda_graph reached (``whole step``, ``forward+backward graphed``, ``eager``), why not the tier
above it (fastloop's record), any run that failed (its last lines: a traceback would show here),
and cuda_graph / compile alone as a throughput ratio with its run-level interval.

``--cifar-check`` adds issue 32's headline on the tutorial CIFAR ResNet-18: the plain Trainer
(``make`` with no speedup) and the by-hand ``torch.compile(mode="reduce-overhead")`` version
(``expert``: the data on the GPU, bf16-mixed, channels_last, TF32, each step marked), interleaved
with the two configurations above; the callbacks are exactly
``gpu_resident,bf16,channels_last,compile,cuda_graph``.

Usage (GPU machine, ``PYTHONPATH=src:.``)::

    python3 benchmarks/run.py tiers --modules cifar_resnet,vit --rounds 3 --cifar-check --max-s 540

Writes ``tiers.json`` under $OUT (rewritten after every round); prints a table last.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

from benchmarks._common import side_ci
from fastloop.compare import Runs, merge_runs
from fastloop.drivers.subproc import ConfigurationFailed, run_in_subprocess

BASE = {
    # the feed and the precision an ordinary user of each module would turn on first
    "cifar_resnet": "gpu_resident,bf16,channels_last",  # in-memory tensors
    "vit": "workers,pin_memory,tf32,bf16",  # per-sample CPU augmentation in the Dataset
    "demo_transformer": "gpu_resident,tf32,bf16",
    "lstm_lm": "gpu_resident,tf32,bf16",
    "unet": "gpu_resident,tf32,bf16,channels_last",
    "gpt_small": "gpu_resident,tf32,bf16,fused_optimizer",
}
MODULES = tuple(BASE)


def _measure(target: str, spec: str, runs: Runs, device: str = "cuda") -> float:
    t0 = time.perf_counter()
    try:
        runs.docs.append(
            run_in_subprocess(target, spec, steps=30, warmup=5, device=device, measure_s=2.0, profile=False)
        )
    except ConfigurationFailed as err:
        runs.failures.append(str(err)[-800:])
    return time.perf_counter() - t0


def _graph_record(runs: Runs) -> dict:
    """The tier of each cuda_graph run and fastloop's word on why not higher."""
    tiers, reasons, statuses = [], [], []
    for doc in runs.docs:
        extra = doc.get("extra") or {}
        tiers.append(extra.get("cuda_graph_tier"))
        rec = next((r for r in doc.get("speedups") or [] if r.get("name") == "cuda_graph"), {})
        statuses.append(rec.get("status"))
        why = extra.get("cuda_graph_why_not_whole") or rec.get("reason") or rec.get("detail")
        if why and why not in reasons:
            reasons.append(why)
    return {"tiers": tiers, "statuses": statuses, "why_not_higher": reasons}


def _span(c: dict) -> str:
    """``1.234 [1.10,1.38]``; the interval as ``n/a`` where one run a side gives none."""
    if not c.get("ratio"):
        return "-"
    if c.get("ci_low") is None or c.get("ci_high") is None:
        return f"{c['ratio']:.3f} [n/a]"
    return f"{c['ratio']:.3f} [{c['ci_low']:.2f},{c['ci_high']:.2f}]"


def summarize(module: str, sides: dict[str, Runs]) -> dict:
    merged = {k: merge_runs(r) if r.docs else {} for k, r in sides.items()}
    tp = {k: (m.get("throughput") or {}).get("value") for k, m in merged.items()}
    row = {
        "module": module,
        "base": BASE.get(module, ""),
        "specs": {k: r.spec for k, r in sides.items()},
        "throughput": tp,
        "unit": next(((m.get("throughput") or {}).get("unit") for m in merged.values() if m), None),
        "runs": {k: len(r.docs) for k, r in sides.items()},
        "failures": {k: r.failures for k, r in sides.items() if r.failures},
        "graph_vs_compile": side_ci(sides, "compile", "cuda_graph"),
        "cuda_graph": _graph_record(sides["cuda_graph"]),
    }
    if "plain" in sides:
        row["graph_vs_plain"] = side_ci(sides, "plain", "cuda_graph")
        row["graph_vs_by_hand"] = side_ci(sides, "by_hand", "cuda_graph")
    return row


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--modules", default=",".join(MODULES))
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument(
        "--cifar-check",
        action="store_true",
        help="also the plain Trainer and the by-hand reduce-overhead version of cifar_resnet",
    )
    p.add_argument("--max-s", type=float, default=540.0, help="start no new round after this many seconds")
    p.add_argument("--out", default=os.environ.get("OUT", "tiers_out"))
    p.add_argument("--device", default="cuda", help=argparse.SUPPRESS)  # cpu: a smoke test of the benchmark itself
    args = p.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    modules = [m for m in args.modules.split(",") if m]
    unknown = [m for m in modules if m not in BASE]
    if unknown:
        raise SystemExit(f"unknown module(s) {unknown}; known: {', '.join(MODULES)}")
    sides: dict[str, dict[str, Runs]] = {}
    for m in modules:
        base = BASE[m]
        sides[m] = {"compile": Runs(f"{base},compile"), "cuda_graph": Runs(f"{base},compile,cuda_graph")}
        if m == "cifar_resnet" and args.cifar_check:
            sides[m] = {"plain": Runs("none"), "by_hand": Runs("none"), **sides[m]}
    t_start, done, run_s = time.perf_counter(), 0, []
    for r in range(args.rounds):
        if r and time.perf_counter() - t_start + 1.2 * sum(run_s) / max(done, 1) > args.max_s:
            print(f"--max-s {args.max_s:.0f}: stopped after {done} round(s)", flush=True)
            break
        for m in modules:
            order = list(sides[m])
            if r % 2:
                order.reverse()  # A B, then B A: a drift between the first and second process cancels
            for k in order:
                target = f"benchmarks/zoo/{m}.py:{'expert' if k == 'by_hand' else 'make'}"
                s = _measure(target, sides[m][k].spec, sides[m][k], args.device)
                print(f"round {r + 1} {m:17} {k:10} {s:5.1f} s", flush=True)
        done += 1
        run_s.append(time.perf_counter() - t_start - sum(run_s))
        rows = [summarize(m, sides[m]) for m in modules]
        (out / "tiers.json").write_text(
            json.dumps(
                {
                    "rounds": done,
                    "rows": rows,
                    "method": (
                        "fresh processes, interleaved round by round, the pair's order alternating; "
                        "2 s windows of steady steps; ratio = cuda_graph / compile throughput, "
                        "run-level t-interval (fastloop.compare)"
                    ),
                },
                indent=2,
                default=str,
            )
        )
    print(f"\n{'module':17} {'compile':>10} {'cuda_graph':>10} {'graph/compile':>19}  tier (why not higher)")
    for row in rows:
        t, g = row["throughput"], row["graph_vs_compile"] or {}
        span = _span(g)
        tiers = sorted({str(x) for x in row["cuda_graph"]["tiers"]})
        why = "; ".join(row["cuda_graph"]["why_not_higher"])[:90]
        print(
            f"{row['module']:17} {t['compile'] or 0:>10,.0f} {t['cuda_graph'] or 0:>10,.0f} {span:>19}  "
            f"{','.join(tiers)} ({why}){' FAILURES' if row['failures'] else ''}"
        )
        if "graph_vs_plain" in row:
            for key, name in (("graph_vs_plain", "plain Trainer"), ("graph_vs_by_hand", "by-hand reduce-overhead")):
                c = row[key] or {}
                if c.get("ratio"):
                    print(
                        f"  cuda_graph set vs {name}: {_span(c)} "
                        f"({t['plain' if key == 'graph_vs_plain' else 'by_hand'] or 0:,.0f} {row['unit']})"
                    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
