"""The zoo benchmark: on each ordinary module, the default ``fastloop ladder`` against an expert.

For each module of benchmarks/zoo/ (``FILE.py:make``, the module as its users write it, and
``FILE.py:expert``, an expert's by-hand configuration in plain Lightning):

1. ``fastloop ladder benchmarks/zoo/FILE.py:make --out DIR`` exactly as a user types it (no
   other flags), timed by the wall clock around the command;
2. then, interleaved in fresh processes (plain, expert, ladder's pick; ``--rounds`` rounds), the
   plain Trainer (``make`` with no speedup), the expert (``expert`` with no speedup: its settings
   are its own) and the ladder's selected set on ``make``, each measuring a 2 s window of steady
   steps with fastloop's own measurement (the same clock for all three);
3. the ratios pick/expert and expert/plain with run-level intervals, and the cuda_graph tier the
   pick reached.

Usage: ``python3 benchmarks/run.py zoo [--modules cifar_resnet,vit] [--rounds 3]``. Writes
``zoo_MODULE.json`` and the ladder's report folder under $OUT (or ``--out``); prints a table last.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from fastloop.compare import Runs, compare, merge_runs
from fastloop.drivers.subproc import ConfigurationFailed, run_in_subprocess

MODULES = ("cifar_resnet", "vit", "demo_transformer", "lstm_lm", "unet", "gpt_small")


def _ladder(module: str, out: Path) -> tuple[dict, float]:
    target = f"benchmarks/zoo/{module}.py:make"
    folder = out / f"ladder_{module}"
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "fastloop.cli", "ladder", target, "--out", str(folder)],
                          capture_output=True, text=True)
    wall = time.perf_counter() - t0
    sys.stdout.write(proc.stdout[-3000:])
    sys.stderr.write(proc.stderr[-3000:])
    doc = json.loads((folder / "report.json").read_text()) if (folder / "report.json").exists() else {}
    return doc, wall


def _measure(target: str, spec: str, runs: Runs) -> None:
    try:
        runs.docs.append(run_in_subprocess(target, spec, steps=30, warmup=5, device="cuda", measure_s=2.0,
                                           profile=False))
    except ConfigurationFailed as err:
        runs.failures.append(str(err)[-500:])


def _ci(a: Runs, b: Runs) -> dict | None:
    ci = compare(a, b)
    return None if ci is None else {k: ci.get(k) for k in ("ratio", "ci_low", "ci_high", "significant", "verdict")}


def bench_module(module: str, out: Path, rounds: int) -> dict:
    ladder, wall = _ladder(module, out)
    pick = ladder.get("selected_spec") or "none"
    make, expert = f"benchmarks/zoo/{module}.py:make", f"benchmarks/zoo/{module}.py:expert"
    sides = {"plain": Runs("none"), "expert": Runs("none"), "pick": Runs(pick)}
    for _ in range(rounds):
        _measure(make, "none", sides["plain"])
        _measure(expert, "none", sides["expert"])
        _measure(make, pick, sides["pick"])
    merged = {k: merge_runs(r) if r.docs else {} for k, r in sides.items()}
    tp = {k: (m.get("throughput") or {}).get("value") for k, m in merged.items()}
    rec = {r["name"]: r for r in (merged["pick"].get("speedups") or [])}
    graph = rec.get("cuda_graph")
    result = {"module": module, "ladder_wall_s": round(wall, 1), "ladder_clock_s": ladder.get("wall_s"),
              "ladder_runs": ladder.get("runs"), "selected": pick, "throughput": tp,
              "unit": (merged["plain"].get("throughput") or {}).get("unit"),
              "pick_vs_expert": _ci(sides["expert"], sides["pick"]), "expert_vs_plain": _ci(sides["plain"], sides["expert"]),
              "pick_vs_plain": _ci(sides["plain"], sides["pick"]),
              "cuda_graph": {"status": graph["status"], "reason": graph.get("reason"), "detail": graph.get("detail"),
                             "tier": (merged["pick"].get("extra") or {}).get("cuda_graph_tier")} if graph else None,
              "failures": {k: r.failures for k, r in sides.items() if r.failures},
              "stages": ladder.get("stages"), "not_tried": ladder.get("not_tried"), "rounds": rounds,
              "method": "interleaved fresh processes (plain, expert, pick) x rounds, 2 s windows of steady steps; "
                        "ratio = B/A throughput via run-level t-interval (fastloop.compare)"}
    (out / f"zoo_{module}.json").write_text(json.dumps(result, indent=2, default=str))
    return result


def wall_clock_check(module: str, spec: str, out: Path) -> dict:
    """One run of ``module`` with ``spec`` whose steps a clock outside fastloop also times
    (benchmarks/zoo/clocked.py): the report's throughput against items x steps / the outside
    clock's time of the same measured steps."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        clock = os.path.join(tmp, "clock.json")
        os.environ["ZOO_CLOCK_FILE"] = clock
        try:
            doc = run_in_subprocess(f"benchmarks/zoo/clocked.py:make", spec, steps=30, warmup=5, device="cuda",
                                    measure_s=2.0, profile=False)
        finally:
            os.environ.pop("ZOO_CLOCK_FILE", None)
        clock_doc = json.loads(Path(clock).read_text())
    t, t0 = clock_doc["batch_end_s"], clock_doc["batch_start_s"]
    w, n = doc["warmup_steps"], doc["steps"]
    outside_s = t[w + n - 1] - t0[w]  # start of the first measured step to the end of the last one
    items = doc.get("items_per_step") or 0
    outside = items * n / outside_s
    reported = doc["throughput"]["value"]
    result = {"module": module, "spec": spec, "reported": reported, "outside": outside,
              "ratio": reported / outside, "steps": n, "warmup_steps": w, "batch_ends_recorded": len(t),
              "clock": "time.perf_counter after torch.cuda.synchronize() in a plain Lightning callback's "
                       "on_train_batch_start (first measured step) and on_train_batch_end (last measured step)"}
    (out / "zoo_wall_clock.json").write_text(json.dumps(result, indent=2))
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--modules", default=",".join(MODULES))
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--out", default=os.environ.get("OUT", "zoo_out"))
    p.add_argument("--clock", default=None,
                   help="MODULE[:SPEC]: also check the report against an outside wall clock (default SPEC: the pick)")
    args = p.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = [bench_module(m, out, args.rounds) for m in args.modules.split(",") if m]
    if args.clock:
        module, _, spec = args.clock.partition(":")
        picked = next((r["selected"] for r in rows if r["module"] == module), "none")
        c = wall_clock_check(module, spec or picked, out)
        print(f"wall clock: {module} {c['spec']}: reported {c['reported']:,.0f} vs outside {c['outside']:,.0f} "
              f"items/s -> {c['ratio']:.3f}")
    print(f"{'module':18} {'plain':>10} {'expert':>10} {'pick':>10} {'pick/exp':>16} {'ladder s':>9}  selected")
    for r in rows:
        t, pe = r["throughput"], r["pick_vs_expert"] or {}
        span = f"{pe.get('ratio', 0):.2f} [{pe.get('ci_low') or 0:.2f},{pe.get('ci_high') or 0:.2f}]" if pe else "-"
        print(f"{r['module']:18} {t['plain'] or 0:>10,.0f} {t['expert'] or 0:>10,.0f} {t['pick'] or 0:>10,.0f} "
              f"{span:>16} {r['ladder_wall_s']:>9.0f}  {r['selected']}  graph={((r['cuda_graph'] or {}).get('tier'))}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
