"""The noise benchmark (issue 37): can fastloop's statistics be trusted on this GPU?

Three parts, each optional:

1. ``--aa MODULE=SPEC`` (repeatable): ``--trials`` times ``fastloop ab benchmarks/zoo/MODULE.py:make
   --a SPEC --b SPEC --json F`` exactly as a user types it (the defaults: 5 runs a side, 2 s
   windows, counterbalanced order). Each trial's verdict says whether fastloop called the same
   configuration faster than itself. The trials' runs, in the order they ran (``run_order``),
   are also **the noise study**: 10 fresh processes a trial, 60 for 6 trials, one configuration in
   sequence: the run-to-run spread, the drift between the two processes of a round (the second
   against the first), the trend over a trial and the lag-1 correlation.
2. **The simulation fed with those figures** (always, from the A vs A files of this call or of
   ``--from DIR``): A vs A with the measured run-to-run spread and the measured second-of-a-round
   drift (and with the drift at the far end of its interval), with the old fixed order (A B A B)
   and with the counterbalanced one (A B, B A, ...): how often each calls a difference; and the
   power at that spread: how often a true 5% (10%) difference is called with 5 (6) runs a side.
3. ``--ladders MODULE``: two default ladders ``fastloop ladder benchmarks/zoo/MODULE.py:make --out
   DIR`` (no other flags), then their two picks measured interleaved (``--rounds`` runs a side,
   2 s windows, counterbalanced) and the ratio. ``--pick-a SPEC`` stands for a first ladder run in
   an earlier call (its pick; then one ladder runs here).

``--cpus 0-7`` confines each A vs A trial (the command, its fork server, runs and loader workers)
to those CPUs, its rows named ``MODULE-cpus0-7``: does a host-bound step's spread come from
where its processes run? ``--env FASTLOOP_FORKSERVER=0``: each run a fresh interpreter instead of
a fork of the server (rows ``MODULE-FASTLOOP_FORKSERVER0``).

``--max-s S`` starts no new trial or ladder after S seconds (the device call's limit); every
finished piece is already written under $OUT. Prints a table last.

Example (on the GPU machine, ``PYTHONPATH=src:.``)::

    python3 benchmarks/run.py noise --aa vit=workers,pin_memory --trials 6
    python3 benchmarks/run.py noise --from results/ --trials 0    # the simulation only (CPU)
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from fastloop.compare import compare, measure_interleaved, merge_runs
from fastloop.measure.stats import t_quantile

SIM_TRIALS = 2000


def _target(module: str) -> str:
    """A zoo module's target (``benchmarks/zoo/MODULE.py:make``), or any target as given (``demo``)."""
    return f"benchmarks/zoo/{module}.py:make" if Path(f"benchmarks/zoo/{module}.py").exists() else module


def parse_cpus(text: str) -> set[int]:
    """``--cpus``: a CPU list as ``taskset -c`` takes it.

    Example:
        >>> sorted(parse_cpus("0-3,8"))
        [0, 1, 2, 3, 8]
    """
    cpus: set[int] = set()
    for part in text.split(","):
        low, _, high = part.partition("-")
        cpus.update(range(int(low), int(high or low) + 1))
    return cpus


def _ab(
    module: str,
    spec: str,
    out: Path,
    k: int,
    *,
    tag: str = "",
    cpus: set[int] | None = None,
    env: dict[str, str] | None = None,
) -> dict:
    path = out / f"aa_{module}{'-' + tag if tag else ''}_{k}.json"
    t0 = time.perf_counter()
    pin = (lambda: os.sched_setaffinity(0, cpus)) if cpus else None  # the command and every process it starts
    proc = subprocess.run(
        [sys.executable, "-m", "fastloop.cli", "ab", _target(module), "--a", spec, "--b", spec, "--json", str(path)],
        capture_output=True,
        text=True,
        preexec_fn=pin,
        env={**os.environ, **(env or {})},
    )
    wall = time.perf_counter() - t0
    doc = json.loads(path.read_text()) if path.exists() else {}
    doc["bench_wall_s"], doc["bench_rc"] = wall, proc.returncode
    if proc.returncode:
        doc["bench_stderr"] = proc.stderr[-2000:]
    path.write_text(json.dumps(doc, indent=2, default=str))
    return doc


def run_sequence(doc: dict) -> list[float]:
    """One A vs A trial's runs as they ran: each run's mean step time, in ``run_order``.

    Example:
        >>> run_sequence({"run_order": ["A", "B", "B", "A"], "a": {"run_mean_step_s": [1.0, 2.0]},
        ...               "b": {"run_mean_step_s": [3.0, 4.0]}})
        [1.0, 3.0, 4.0, 2.0]
    """
    taken = {"A": iter(doc["a"].get("run_mean_step_s") or []), "B": iter(doc["b"].get("run_mean_step_s") or [])}
    return [next(taken[side]) for side in doc.get("run_order") or []]


def _t_interval(values: list[float]) -> tuple[float, float, float]:
    m = statistics.fmean(values)
    half = t_quantile(0.985, len(values) - 1) * statistics.stdev(values) / math.sqrt(len(values))
    return m, m - half, m + half


def noise_study(trials: list[dict]) -> dict:
    """Run-to-run spread and drift from A vs A trials of one configuration (log mean step times).

    ``second_vs_first``: mean over rounds of log(second run's step time / first's), with a 97%
    t-interval (negative: the second process of a round runs faster); ``run_sd``: the spread of
    one run's log step time about its trial's mean after that effect is taken out."""
    seqs = [[math.log(x) for x in run_sequence(t)] for t in trials if t.get("run_order")]
    seqs = [s for s in seqs if len(s) >= 4]
    diffs = [s[i + 1] - s[i] for s in seqs for i in range(0, len(s) - 1, 2)]
    drift = statistics.fmean(diffs)
    resid: list[float] = []
    slopes, lag1 = [], []
    for s in seqs:
        adj = [x - (drift / 2 if i % 2 else -drift / 2) for i, x in enumerate(s)]  # the position effect out
        m = statistics.fmean(adj)
        resid += [x - m for x in adj]
        idx = list(range(len(s)))
        slopes.append(float(np.polyfit(idx, s, 1)[0]))
        r = [x - m for x in adj]
        lag1.append(float(np.corrcoef(r[:-1], r[1:])[0, 1]))
    dof = len(resid) - len(seqs)
    run_sd = math.sqrt(sum(r * r for r in resid) / max(dof, 1))
    m, lo, hi = _t_interval(diffs)
    all_times = [math.exp(x) for s in seqs for x in s]
    return {
        "runs": sum(len(s) for s in seqs),
        "trials": len(seqs),
        "rounds": len(diffs),
        "run_sd": run_sd,
        "run_cv_pct": 100 * (math.exp(run_sd) - 1),
        "second_vs_first": {"mean": m, "low": lo, "high": hi, "pct": 100 * (math.exp(m) - 1)},
        "trend_per_run_pct": 100 * (math.exp(statistics.fmean(slopes)) - 1),
        "lag1_corr": statistics.fmean(lag1),
        "median_step_s": statistics.median(all_times),
        "min_max_step_s": [min(all_times), max(all_times)],
    }


def _called(
    run_sd: float,
    *,
    drift: float = 0.0,
    effect: float = 1.0,
    counterbalance: bool = True,
    trials: int = SIM_TRIALS,
    seed: int = 0,
    repeats: int = 5,
    faster_only: bool = False,
    floor: bool = True,
) -> float:
    """The fraction of simulated comparisons, through fastloop's own interleaving and statistics,
    called significant (``faster_only``: and B faster): each process's log step time varies by
    ``run_sd``, the second of each round is shifted by ``drift`` (log), and B is ``effect``
    times faster. ``floor=False``: count an interval that excludes 1 even where the two sides are
    less than ``MIN_EFFECT`` apart (the statistics alone, without the 1% floor)."""
    rng = np.random.default_rng(seed)
    hits = 0
    for _ in range(trials):
        started = [0]

        def measure(target, spec, started=started, **kw):
            second = started[0] % 2 == 1
            started[0] += 1
            mean = 0.010 * math.exp(run_sd * rng.standard_normal() + (drift if second else 0.0))
            mean /= effect if spec == "b" else 1.0
            return {"step_s_all": list(mean * (1 + 0.01 * rng.standard_normal(30))), "items_per_step": 16}

        runs = measure_interleaved(
            "x", ["a", "b"], repeats, measure=measure, steps=30, warmup=5, device="cpu", counterbalance=counterbalance
        )
        ci = compare(runs["a"], runs["b"])
        called = ci["significant"] or (not floor and ci.get("negligible", False))
        hits += bool(called and (ci["ratio"] > 1 or not faster_only))
    return hits / trials


def simulate(
    run_sd: float,
    drift: float,
    counterbalance: bool,
    trials: int = SIM_TRIALS,
    seed: int = 0,
    repeats: int = 5,
    floor: bool = True,
) -> float:
    """A vs A at the defaults: the fraction of trials called significant (the false positives).

    Example:
        >>> simulate(0.03, -0.03, counterbalance=False, trials=200) > simulate(0.03, -0.03, True, trials=200)
        True
    """
    return _called(
        run_sd, drift=drift, counterbalance=counterbalance, trials=trials, seed=seed, repeats=repeats, floor=floor
    )


def power(run_sd: float, effect: float, repeats: int, trials: int = SIM_TRIALS, seed: int = 1) -> float:
    """How often fastloop's comparison calls a true ``effect`` (1.05: B 5% faster) significant with
    ``repeats`` runs a side, when each process's log step time varies by ``run_sd``.

    Example:
        >>> power(0.01, 1.10, 6, trials=100) > 0.9
        True
    """
    return _called(run_sd, effect=effect, trials=trials, seed=seed, repeats=repeats, faster_only=True)


def aa_part(
    pairs: list[str],
    trials: int,
    out: Path,
    deadline: float,
    *,
    tag: str = "",
    cpus: set[int] | None = None,
    env: dict[str, str] | None = None,
) -> dict:
    result = {}
    for pair in pairs:
        module, _, spec = pair.partition("=")
        docs = []
        for k in range(trials):
            if time.monotonic() > deadline:
                break
            docs.append(_ab(module, spec or "none", out, k, tag=tag, cpus=cpus, env=env))
            print(
                f"aa {module} trial {k + 1}: {docs[-1].get('verdict')} ({docs[-1]['bench_wall_s']:.0f} s)", flush=True
            )
        result[module + (f"-{tag}" if tag else "")] = {"spec": spec, "trials": docs}
    return result


def _load_aa(folder: Path) -> dict:
    found: dict = {}
    for path in sorted(folder.glob("aa_*_*.json")):
        doc = json.loads(path.read_text())
        module = path.stem[3:].rsplit("_", 1)[0]
        found.setdefault(module, {"spec": doc.get("a_spec"), "trials": []})["trials"].append(doc)
    return found


def summarize_aa(aa: dict) -> dict:
    summary = {}
    for module, entry in aa.items():
        docs = [d for d in entry["trials"] if d.get("speedup")]
        if not docs:
            continue
        noise = noise_study(docs)
        drift, sd = noise["second_vs_first"]["mean"], noise["run_sd"]
        far = max(abs(noise["second_vs_first"]["low"]), abs(noise["second_vs_first"]["high"]))
        summary[module] = {
            "spec": entry["spec"],
            "trials": len(docs),
            "significant": sum(bool(d["speedup"]["significant"]) for d in docs),
            "ratios": [round(d["speedup"]["ratio"], 4) for d in docs],
            "intervals": [[round(d["speedup"]["ci_low"], 4), round(d["speedup"]["ci_high"], 4)] for d in docs],
            "verdicts": [d.get("verdict") for d in docs],
            "wall_s": [round(d.get("bench_wall_s", 0), 1) for d in docs],
            "noise": noise,
            "simulation": {
                "trials": SIM_TRIALS,
                "run_sd": sd,
                "drift": drift,
                "far_drift": -far,
                "old_order": simulate(sd, drift, False),
                "counterbalanced": simulate(sd, drift, True),
                "old_order_far_drift": simulate(sd, -far, False),
                "counterbalanced_far_drift": simulate(sd, -far, True),
                "without_the_1pct_floor": {
                    "old_order": simulate(sd, drift, False, floor=False),
                    "counterbalanced": simulate(sd, drift, True, floor=False),
                    "old_order_far_drift": simulate(sd, -far, False, floor=False),
                    "counterbalanced_far_drift": simulate(sd, -far, True, floor=False),
                },
            },
            "power": {
                f"{int(round(100 * (e - 1)))}% at {r} runs a side": power(sd, e, r)
                for e in (1.05, 1.10)
                for r in (5, 6)
            },
        }
    return summary


def _ladder(module: str, out: Path, k: int) -> dict:
    folder = out / f"ladder_{module}_{k}"
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "fastloop.cli", "ladder", _target(module), "--out", str(folder)],
        capture_output=True,
        text=True,
    )
    wall = time.perf_counter() - t0
    doc = json.loads((folder / "report.json").read_text()) if (folder / "report.json").exists() else {}
    return {
        "selected": doc.get("selected_spec") or "none",
        "wall_s": round(wall, 1),
        "runs": doc.get("runs"),
        "ties": doc.get("ties"),
        "not_tried": doc.get("not_tried"),
        "rc": proc.returncode,
        "stderr": proc.stderr[-1500:] if proc.returncode else "",
    }


def ladders_part(module: str, pick_a: str | None, rounds: int, out: Path, deadline: float) -> dict:
    from fastloop.drivers.ladder import default_measure_s
    from fastloop.drivers.subproc import run_in_subprocess

    device = "cuda" if _cuda() else "cpu"
    args_measure_s = default_measure_s(device)

    ladders = [{"selected": pick_a, "wall_s": None, "note": "from an earlier call (--pick-a)"}] if pick_a else []
    while len(ladders) < 2 and time.monotonic() < deadline:
        ladders.append(_ladder(module, out, len(ladders) + 1))
        print(f"ladder {len(ladders)} on {module}: {ladders[-1]['selected']} ({ladders[-1]['wall_s']} s)", flush=True)
    result: dict = {"module": module, "ladders": ladders}
    if len(ladders) == 2 and time.monotonic() < deadline:
        target = _target(module)
        keys = [f"1:{ladders[0]['selected']}", f"2:{ladders[1]['selected']}"]
        order: list[str] = []

        def measure(target_: str, key: str, **kw) -> dict:
            kw["profile"] = False
            return run_in_subprocess(target_, key.split(":", 1)[1], measure_s=args_measure_s, **kw)

        runs = measure_interleaved(
            target, keys, rounds, measure=measure, steps=30, warmup=5, device=device, order=order
        )
        ci = compare(runs[keys[0]], runs[keys[1]])
        tp = [(merge_runs(runs[k]).get("throughput") or {}).get("value") for k in keys]
        per_run = {k: [statistics.median(d["step_s_all"]) for d in runs[k].docs if d.get("step_s_all")] for k in keys}
        result["interleaved"] = {
            "throughput": tp,
            "run_order": order,
            "rounds": rounds,
            "median_step_s_per_run": per_run,
            "ratio_2_over_1": {k: ci.get(k) for k in ("ratio", "ci_low", "ci_high", "significant", "verdict")}
            if ci
            else None,
        }
    (out / f"ladders_{module}.json").write_text(json.dumps(result, indent=2, default=str))
    return result


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--aa", action="append", default=[], metavar="MODULE=SPEC")
    p.add_argument("--trials", type=int, default=6)
    p.add_argument("--from", dest="from_", default=None, help="also read aa_*.json from this folder")
    p.add_argument("--ladders", default=None, metavar="MODULE")
    p.add_argument("--pick-a", default=None)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--max-s", type=float, default=1e9)
    p.add_argument("--out", default=os.environ.get("OUT", "noise_out"))
    p.add_argument(
        "--cpus",
        default=None,
        metavar="LIST",
        help="run each A vs A trial confined to these CPUs (as taskset -c: 0-7): does pinning cut the spread?",
    )
    p.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="set in each trial's environment (FASTLOOP_FORKSERVER=0: every run a fresh interpreter)",
    )
    p.add_argument("--tag", default="", help="a name for this variant of the A vs A trials (their files and rows)")
    args = p.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + args.max_s
    env = dict(item.partition("=")[::2] for item in args.env)
    tag = args.tag or "-".join([*(["cpus" + args.cpus] if args.cpus else []), *(f"{k}{v}" for k, v in env.items())])
    aa = aa_part(
        args.aa, args.trials, out, deadline, tag=tag, cpus=parse_cpus(args.cpus) if args.cpus else None, env=env
    )
    if args.from_:
        for module, entry in _load_aa(Path(args.from_)).items():
            aa.setdefault(module, {"spec": entry["spec"], "trials": []})["trials"][:0] = entry["trials"]
    summary = summarize_aa(aa)
    (out / "noise_summary.json").write_text(json.dumps(summary, indent=2, default=str))
    lad = ladders_part(args.ladders, args.pick_a, args.rounds, out, deadline) if args.ladders else None
    print(
        f"{'module':14} {'spec':38} {'runs':>4} {'run sd':>7} {'2nd vs 1st':>22} {'A=A sig':>8} "
        f"{'sim old':>8} {'sim new':>8}"
    )
    for module, s in summary.items():
        n, d, sim = s["noise"], s["noise"]["second_vs_first"], s["simulation"]
        print(
            f"{module:14} {s['spec']:38} {n['runs']:>4} {n['run_cv_pct']:>6.2f}% "
            f"{d['pct']:>+6.2f}% [{100 * (math.exp(d['low']) - 1):+.2f},{100 * (math.exp(d['high']) - 1):+.2f}] "
            f"{s['significant']:>3}/{s['trials']:<4} {sim['old_order']:>7.1%} {sim['counterbalanced']:>7.1%}"
        )
    if lad:
        for i, entry in enumerate(lad["ladders"], 1):
            print(f"ladder {i}: {entry['selected']} ({entry.get('wall_s')} s)")
        inter = (lad.get("interleaved") or {}).get("ratio_2_over_1")
        if inter:
            print(f"pick 2 / pick 1 interleaved: {inter['ratio']:.3f} [{inter['ci_low']:.3f}, {inter['ci_high']:.3f}]")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
