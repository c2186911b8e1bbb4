"""The compile-cache benchmark: a configuration's compile seconds cold against warm, each run a fresh
``fastloop run`` process, on each target of ``--targets`` (default: the ViT zoo module and the GPT
recipe) with ``--speedups`` (default ``bf16,compile``: put the ladder's pick here).

Per target, in a compile cache of its own (a temporary ``FASTLOOP_CACHE_DIR``, removed after):
one run fills the cache (its record must say ``cold``), then ``--rounds`` rounds of a cold run
(``--no-cache``: a fresh directory, the cache untouched) and a warm run (the cache), their order
reversed every other round. Each run's ``compile_s`` (the warm-up's cost beyond its steps) and its
record's ``compile_cache`` state, hits and misses are kept; the ratio is the warm median over the
cold median (goal: <= 0.40).

Usage: ``python3 benchmarks/run.py compile-cache [--targets gpt,benchmarks/zoo/vit.py:make]
[--speedups bf16,compile] [--rounds 2]``; a CPU smoke test: ``compile-cache --device cpu --targets
tests/targets.py:tiny_mlp --speedups compile --rounds 1``. Writes ``compile_cache.json`` under $OUT;
prints a table last.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile

from benchmarks._common import emit
from fastloop.drivers.subproc import run_in_subprocess

TARGETS = "benchmarks/zoo/vit.py:make,gpt"


def _run(target: str, speedups: str, args: argparse.Namespace, *, cache: bool) -> dict:
    doc = run_in_subprocess(
        target, speedups, steps=args.steps, warmup=args.warmup, device=args.device, profile=False, compile_cache=cache
    )
    rec = (doc.get("extra") or {}).get("compile_cache") or {}
    return {
        "cache": cache,
        "compile_s": doc.get("compile_s"),
        "process_s": (doc.get("timings") or {}).get("process_s"),
        "state": rec.get("state"),
        "hits": rec.get("hits"),
        "misses": rec.get("misses"),
        "size_bytes": rec.get("size_bytes"),
        "speedups": [(r["name"], r["status"]) for r in doc["speedups"]],
    }


def measure(target: str, args: argparse.Namespace) -> dict:
    """The fill run, then the rounds of cold and warm runs, in a cache of this target's own."""
    root = tempfile.mkdtemp(prefix="fastloop-compile-cache-bench-")
    saved = os.environ.get("FASTLOOP_CACHE_DIR")
    os.environ["FASTLOOP_CACHE_DIR"] = root  # the children's environment is this process's
    try:
        fill = _run(target, args.speedups, args, cache=True)
        runs = []
        for r in range(args.rounds):
            for cache in (False, True) if r % 2 == 0 else (True, False):
                runs.append(_run(target, args.speedups, args, cache=cache))
    finally:
        if saved is None:
            os.environ.pop("FASTLOOP_CACHE_DIR", None)
        else:
            os.environ["FASTLOOP_CACHE_DIR"] = saved
        shutil.rmtree(root, ignore_errors=True)
    cold = [x["compile_s"] for x in runs if not x["cache"] and x["compile_s"] is not None]
    warm = [x["compile_s"] for x in runs if x["cache"] and x["compile_s"] is not None]
    ratio = statistics.median(warm) / statistics.median(cold) if cold and warm and statistics.median(cold) else None
    return {
        "target": target,
        "speedups": args.speedups,
        "fill": fill,
        "runs": runs,
        "cold_s": cold,
        "warm_s": warm,
        "warm_over_cold": ratio,
        "states": {
            "cold": [x["state"] for x in runs if not x["cache"]],
            "warm": [x["state"] for x in runs if x["cache"]],
        },
        "pass": ratio is not None and ratio <= 0.40,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--targets", default=TARGETS, help="comma-separated targets (a recipe name or FILE.py:FUNCTION)")
    p.add_argument("--speedups", default="bf16,compile", help="the configuration (the ladder's pick)")
    p.add_argument("--rounds", type=int, default=2, help="rounds of a cold and a warm run")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    args = p.parse_args(argv)
    rows = [measure(t.strip(), args) for t in args.targets.split(",") if t.strip()]
    emit("compile_cache", {"rows": rows, "goal": "warm compile_s <= 40% of cold (medians)"})
    print(f"\ncompile seconds, cold (--no-cache) against warm (the cache), {args.speedups}, fresh processes:")
    print("| target | cold s (median, runs) | warm s (median, runs) | warm / cold | states cold / warm | fill run |")
    print("| --- | --- | --- | --- | --- | --- |")
    for r in rows:
        med = {k: statistics.median(r[k]) if r[k] else float("nan") for k in ("cold_s", "warm_s")}
        ratio = f"{r['warm_over_cold']:.2f}" if r["warm_over_cold"] is not None else "n/a"
        print(
            f"| {r['target']} | {med['cold_s']:.1f} ({len(r['cold_s'])}) | {med['warm_s']:.1f} ({len(r['warm_s'])}) | "
            f"{ratio} | {','.join(map(str, r['states']['cold']))} / {','.join(map(str, r['states']['warm']))} | "
            f"{r['fill']['state']}, {r['fill']['compile_s'] or 0:.1f} s |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
