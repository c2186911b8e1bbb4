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

Step 2 runs every module's round r before any module's round r+1, the order of the three
reversed every other round; ``--max-s`` starts no new round after that many seconds, so a call
cut short leaves every module with the same number of runs.

The two steps can run in separate device calls (one call is at most 10 minutes; one ladder takes
up to 5): ``--only ladder`` writes each module's ``ladder_MODULE.json`` (pick, wall time, stages),
and ``--only compare --from DIR`` measures the picks read from those files.

Usage: ``python3 benchmarks/run.py zoo [--modules cifar_resnet,vit] [--rounds 3]``, or
``zoo --modules lstm_lm,unet --only ladder`` then ``zoo --modules lstm_lm,unet --only compare --from
DIR --rounds 4 --max-s 500`` (DIR: the ladder phase's output folder). Writes ``ladder_MODULE.json``,
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

from benchmarks._common import side_ci
from fastloop.compare import Runs, merge_runs
from fastloop.drivers.subproc import ConfigurationFailed, run_in_subprocess

MODULES = (
    "cifar_resnet",
    "vit",
    "demo_transformer",
    "lstm_lm",
    "unet",
    "gpt_small",
    "bert_padded",
    "vit_v2aug",
    "resnet50_folder",
    "unet_paired",
    "bert_collate",
    "audio_padded",
)


def _prepare(module: str) -> None:
    """A module's data made once before anything is timed (the JPEG folder of resnet50_folder)."""
    import importlib

    prep = getattr(importlib.import_module(f"benchmarks.zoo.{module}"), "prepare", None)
    if prep is not None:
        t0 = time.perf_counter()
        prep()
        print(f"{module}: data prepared in {time.perf_counter() - t0:.1f} s", flush=True)


def _ladder(module: str, out: Path) -> tuple[dict, float, int]:
    target = f"benchmarks/zoo/{module}.py:make"
    folder = out / f"ladder_{module}"
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "fastloop.cli", "ladder", target, "--out", str(folder)], capture_output=True, text=True
    )
    wall = time.perf_counter() - t0
    sys.stdout.write(proc.stdout[-3000:])
    sys.stderr.write(proc.stderr[-3000:])
    doc = json.loads((folder / "report.json").read_text()) if (folder / "report.json").exists() else {}
    return doc, wall, proc.returncode


BEFORE: dict[str, str] = {}  # module -> an earlier pick measured beside (``--before``)
DEVICE = "cuda"  # ``--device cpu``: a smoke test of the benchmark itself


def _measure(target: str, spec: str, runs: Runs) -> None:
    try:
        runs.docs.append(
            run_in_subprocess(target, spec, steps=30, warmup=5, device=DEVICE, measure_s=2.0, profile=False)
        )
    except ConfigurationFailed as err:
        runs.failures.append(str(err)[-500:])


def _span(ci: dict) -> str:
    """A ratio and its interval for the table: ``1.26 [0.51,3.15]``; ``2.81 [n/a: too few runs]``
    where a side had fewer runs than a verdict needs (a 1-run interval is none, a 2-run one spans
    orders of magnitude); ``-`` without a ratio.

    Example:
        >>> too_few = "too few runs to tell (2 runs per side)"
        >>> _span({"ratio": 2.81, "ci_low": 0.01, "ci_high": 635.4, "verdict": too_few})
        '2.81 [n/a: too few runs]'
        >>> _span({"ratio": 1.33, "ci_low": 1.21, "ci_high": 1.47, "verdict": "B is 1.33x faster"})
        '1.33 [1.21,1.47]'
    """
    if not ci.get("ratio"):
        return "-"
    lo, hi = ci.get("ci_low"), ci.get("ci_high")
    if lo is None or hi is None or "too few runs" in (ci.get("verdict") or ""):
        return f"{ci['ratio']:.2f} [n/a: too few runs]"
    return f"{ci['ratio']:.2f} [{lo:.2f},{hi:.2f}]"


def ladder_phase(module: str, out: Path) -> dict:
    """The default ladder on ``module``; its pick and timing, written as ``ladder_MODULE.json``."""
    _prepare(module)
    ladder, wall, code = _ladder(module, out)
    rec = {
        "module": module,
        "ladder_wall_s": round(wall, 1),
        "ladder_clock_s": ladder.get("wall_s"),
        "ladder_runs": ladder.get("runs"),
        "selected": ladder.get("selected_spec") or "none",
        "ladder_exit_status": code,
        "stages": ladder.get("stages"),
        "not_tried": ladder.get("not_tried"),
    }
    (out / f"ladder_{module}.json").write_text(json.dumps(rec, indent=2, default=str))
    return rec


def summarize(lad: dict, sides: dict[str, Runs], rounds: int) -> dict:
    merged = {k: merge_runs(r) if r.docs else {} for k, r in sides.items()}
    tp = {k: (m.get("throughput") or {}).get("value") for k, m in merged.items()}
    rec = {r["name"]: r for r in (merged["pick"].get("speedups") or [])}
    graph = rec.get("cuda_graph")
    return {
        **lad,
        "throughput": tp,
        "unit": next(((m.get("throughput") or {}).get("unit") for m in merged.values() if m), None),
        "pick_vs_expert": side_ci(sides, "expert", "pick"),
        "expert_vs_plain": side_ci(sides, "plain", "expert"),
        "pick_vs_plain": side_ci(sides, "plain", "pick"),
        **(
            {"before": sides["before"].spec, "pick_vs_before": side_ci(sides, "before", "pick")}
            if "before" in sides
            else {}
        ),
        "data_wait": {k: m.get("data_wait_frac") for k, m in merged.items()},
        "cuda_graph": {
            "status": graph["status"],
            "reason": graph.get("reason"),
            "detail": graph.get("detail"),
            "tier": (merged["pick"].get("extra") or {}).get("cuda_graph_tier"),
        }
        if graph
        else None,
        "failures": {k: r.failures for k, r in sides.items() if r.failures},
        "rounds": rounds,
        "runs": {k: len(r.docs) for k, r in sides.items()},
        "per_run": {
            k: [
                {
                    "throughput": (d.get("throughput") or {}).get("value"),
                    "data_wait": d.get("data_wait_frac"),
                    "steps": d.get("steps"),
                }
                for d in r.docs
            ]
            for k, r in sides.items()
        },
        "method": "interleaved fresh processes (plain, expert, pick; the order reversed every other round) "
        "x rounds, every module's round r before any module's round r+1; 2 s windows of steady "
        "steps; ratio = B/A throughput via run-level t-interval (fastloop.compare)",
    }


def compare_phase(ladders: dict[str, dict], out: Path, rounds: int, max_s: float) -> list[dict]:
    """Plain, expert and pick of every module, interleaved in fresh processes, round by round
    (a call cut short by ``max_s`` leaves every module with the same number of rounds)."""
    sides = {
        m: {
            "plain": Runs("none"),
            "expert": Runs("none"),
            "pick": Runs(lad["selected"]),
            **({"before": Runs(BEFORE[m])} if m in BEFORE else {}),
        }
        for m, lad in ladders.items()
    }
    t0, rows, per_round = time.perf_counter(), [], []
    for r in range(rounds):
        if per_round and time.perf_counter() - t0 + 1.2 * max(per_round) > max_s:
            print(f"--max-s {max_s:.0f}: stopped after {r} round(s)", flush=True)
            break
        t_round = time.perf_counter()
        for m, by in sides.items():
            order = list(by) if r % 2 == 0 else list(by)[::-1]
            for k in order:
                t1 = time.perf_counter()
                _measure(f"benchmarks/zoo/{m}.py:{'expert' if k == 'expert' else 'make'}", by[k].spec, by[k])
                print(f"round {r + 1} {m:17} {k:7} {time.perf_counter() - t1:5.1f} s", flush=True)
        per_round.append(time.perf_counter() - t_round)
        rows = [summarize(ladders[m], sides[m], r + 1) for m in sides]
        for row in rows:
            (out / f"zoo_{row['module']}.json").write_text(json.dumps(row, indent=2, default=str))
    return rows


def wall_clock_check(module: str, spec: str, out: Path) -> dict:
    """One run of ``module`` with ``spec`` whose steps a clock outside fastloop also times
    (benchmarks/zoo/clocked.py): the report's throughput against items x steps / the outside
    clock's time of the same measured steps."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        clock = os.path.join(tmp, "clock.json")
        os.environ["ZOO_CLOCK_FILE"] = clock
        try:
            doc = run_in_subprocess(
                "benchmarks/zoo/clocked.py:make", spec, steps=30, warmup=5, device="cuda", measure_s=2.0, profile=False
            )
        finally:
            os.environ.pop("ZOO_CLOCK_FILE", None)
        clock_doc = json.loads(Path(clock).read_text())
    t, t0 = clock_doc["batch_end_s"], clock_doc["batch_start_s"]
    w, n = doc["warmup_steps"], doc["steps"]
    outside_s = t[w + n - 1] - t0[w]  # start of the first measured step to the end of the last one
    items = doc.get("items_per_step") or 0
    outside = items * n / outside_s
    reported = doc["throughput"]["value"]
    result = {
        "module": module,
        "spec": spec,
        "reported": reported,
        "outside": outside,
        "ratio": reported / outside,
        "steps": n,
        "warmup_steps": w,
        "batch_ends_recorded": len(t),
        "clock": "time.perf_counter after torch.cuda.synchronize() in a plain Lightning callback's "
        "on_train_batch_start (first measured step) and on_train_batch_end (last measured step)",
    }
    (out / "zoo_wall_clock.json").write_text(json.dumps(result, indent=2))
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--modules", default=",".join(MODULES))
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--out", default=os.environ.get("OUT", "zoo_out"))
    p.add_argument(
        "--only",
        choices=("ladder", "compare"),
        default=None,
        help="ladder: only the ladders (ladder_MODULE.json); compare: only the interleaved "
        "measurement, with the ladders' picks read from --from",
    )
    p.add_argument(
        "--from",
        dest="from_dir",
        default=None,
        help="a folder holding ladder_MODULE.json files of an earlier call (with --only compare)",
    )
    p.add_argument("--max-s", type=float, default=1e9, help="start no new comparison round after this many seconds")
    p.add_argument(
        "--clock",
        default=None,
        help="MODULE[:SPEC]: also check the report against an outside wall clock (default SPEC: the pick)",
    )
    p.add_argument(
        "--before",
        action="append",
        default=[],
        metavar="MODULE=SPEC",
        help="also measure MODULE with SPEC (an earlier ladder's pick) interleaved: pick_vs_before",
    )
    p.add_argument("--device", default="cuda", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    global DEVICE
    DEVICE = args.device
    BEFORE.update(b.split("=", 1) for b in args.before)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    modules = [m for m in args.modules.split(",") if m]
    unknown = [m for m in modules if m not in MODULES]
    if unknown:
        raise SystemExit(f"unknown module(s) {unknown}; known: {', '.join(MODULES)}")
    if args.only == "compare":
        if not args.from_dir:
            raise SystemExit("--only compare needs --from DIR (the ladder_MODULE.json files of an earlier call)")
        missing = [m for m in modules if not (Path(args.from_dir) / f"ladder_{m}.json").exists()]
        if missing:
            raise SystemExit(f"no ladder_MODULE.json in {args.from_dir} for {missing}")
        ladders = {m: json.loads((Path(args.from_dir) / f"ladder_{m}.json").read_text()) for m in modules}
    else:
        ladders = {m: ladder_phase(m, out) for m in modules}
    if args.only == "compare":
        for m in modules:
            _prepare(m)
    if args.only == "ladder":
        print(f"{'module':18} {'ladder s':>9} {'runs':>5}  selected")
        for m, lad in ladders.items():
            print(f"{m:18} {lad['ladder_wall_s']:>9.0f} {lad['ladder_runs'] or 0:>5}  {lad['selected']}")
        return 0
    rows = compare_phase(ladders, out, args.rounds, args.max_s)
    if args.clock:
        module, _, spec = args.clock.partition(":")
        picked = next((r["selected"] for r in rows if r["module"] == module), "none")
        c = wall_clock_check(module, spec or picked, out)
        print(
            f"wall clock: {module} {c['spec']}: reported {c['reported']:,.0f} vs outside {c['outside']:,.0f} "
            f"items/s -> {c['ratio']:.3f}"
        )
    print(f"{'module':18} {'plain':>10} {'expert':>10} {'pick':>10} {'pick/exp':>16} {'ladder s':>9}  selected")
    for r in rows:
        t, pe = r["throughput"], r["pick_vs_expert"] or {}
        span = _span(pe)
        print(
            f"{r['module']:18} {t['plain'] or 0:>10,.0f} {t['expert'] or 0:>10,.0f} {t['pick'] or 0:>10,.0f} "
            f"{span:>16} {r['ladder_wall_s']:>9.0f}  {r['selected']}  graph={((r['cuda_graph'] or {}).get('tier'))}"
        )
        wait = ", ".join(f"{k} {v:.0%}" for k, v in r["data_wait"].items() if v is not None)
        before = r.get("pick_vs_before") or {}
        if before.get("ratio"):
            print(f"{'':18} before ({r['before']}): {t.get('before') or 0:,.0f}; pick/before {_span(before)}")
        print(f"{'':18} data wait: {wait}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
