"""The command line's drivers, one function per command: ``fastloop run``, ``ladder``, ``ab``,
``batch-size`` and ``doctor`` (cli.py parses and checks the arguments, then calls
:func:`run_command`; it prints what this returns).
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from fastloop.errors import FastloopError

__all__ = ["HTML_EVERY_S", "run_command"]

TEARDOWN_S = 3.0
"""Seconds kept back from a ladder's budget for the last reports and the process's exit: the
budget bounds the command's wall time, from its start (imports) to its end."""
HTML_EVERY_S = 15.0
"""A ladder or A/B refreshes report.html (plots) at most this often while it runs; report.json
and report.md after every run."""


def _stamp(doc: dict, args: argparse.Namespace, device: str) -> dict:
    from fastloop import __version__
    from fastloop.measure.env import env_stamp

    return {
        "fastloop_version": __version__,
        "env": env_stamp(),
        "target": getattr(args, "target", None),
        "device": device,
        **doc,
    }


def _progress(args: argparse.Namespace):
    if args.quiet or not sys.stdout.isatty():
        return None, None
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    prog = Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(), transient=True)
    task = prog.add_task("starting", total=None)
    return prog, lambda text: prog.update(task, description=text)


def _measure_on(args: argparse.Namespace):
    """How ladder and ab measure a configuration: a fresh process, on ``--devices`` ranks."""
    import functools

    from fastloop.drivers.subproc import run_in_subprocess

    kw: dict = {"measure_s": args.measure_s} if getattr(args, "measure_s", None) else {}
    if getattr(args, "no_cache", False):
        kw["compile_cache"] = False
    if args.devices > 1 or args.strategy:
        kw.update(devices=args.devices, strategy=args.strategy or "ddp")
    return functools.partial(run_in_subprocess, **kw) if kw else run_in_subprocess


def _scaling_run(args: argparse.Namespace, device: str) -> dict:
    """``run --devices N``: the same configuration on 1 device, then on N (each in its own
    process; the N ranks are started by Lightning), and the scaling efficiency between them:
    N-device throughput / (N x 1-device throughput), same per-device batch."""
    from fastloop.drivers.doctor import diagnose
    from fastloop.drivers.subproc import run_in_subprocess

    kw = dict(steps=args.steps, warmup=args.warmup, device=device, compile_cache=not args.no_cache)
    one = run_in_subprocess(args.target, args.speedups, **kw)
    many = run_in_subprocess(args.target, args.speedups, **kw, devices=args.devices, strategy=args.strategy or "ddp")
    t1, tn = one["throughput"]["value"], many["throughput"]["value"]
    many["scaling"] = {
        "devices": args.devices,
        "throughput_1": t1,
        "throughput_n": tn,
        "speedup": tn / t1 if t1 and tn else None,
        "efficiency": tn / (args.devices * t1) if t1 and tn else None,
        "basis": "the same per-device batch; each side one fresh process (the N ranks started by "
        "Lightning); throughput summed over ranks at the slowest rank's pace",
        "one_device": {k: one[k] for k in ("step_s", "throughput", "data_wait_frac", "speedups")},
    }
    slowest = many["ranks"][many["slowest_rank"]]["step_s"]["mean"] if many.get("ranks") else None
    many["scaling"]["step_time_growth"] = (
        slowest / one["step_s"]["mean"] - 1 if slowest and one["step_s"]["mean"] else None
    )
    many["diagnosis"] = diagnose(many)
    return many


def run_command(args: argparse.Namespace) -> dict:
    """Run the parsed command (its inputs already checked) and return its stamped document."""
    from fastloop.device import resolve_device

    device = resolve_device(args.device).type  # children get "cuda"/"cpu" (the CLI's own choices)
    if args.cmd == "fit" or getattr(args, "fit", False):
        from fastloop.drivers.fit_commands import run_fit_commands

        return run_fit_commands(args, device, lambda doc: _stamp(doc, args, device), _progress(args))
    commands = {"run": _run, "ladder": _ladder_or_ab, "ab": _ladder_or_ab, "batch-size": _batch_size, "doctor": _doctor}
    if args.cmd not in commands:
        raise FastloopError(f"unknown command {args.cmd!r}")
    doc = commands[args.cmd](args, device)
    if args.cmd in ("run", "ladder", "ab"):
        from fastloop.drivers.fit_share import fit_share

        doc["fit_share"] = fit_share(doc, args.out)  # what share of the target's fit the step figures cover
    return doc


def _run(args: argparse.Namespace, device: str) -> dict:
    from fastloop.drivers.runner import run_configuration

    if args.devices > 1 and not args.no_scaling:
        return _stamp({"kind": "run", **_scaling_run(args, device)}, args, device)
    return _stamp(
        {
            "kind": "run",
            **run_configuration(
                args.target,
                args.speedups,
                steps=args.steps,
                warmup=args.warmup,
                device=device,
                devices=args.devices,
                strategy=args.strategy,
                measure_s=args.measure_s,
                step_rate=args.step_rate,
                compile_cache=not args.no_cache,
                seed=args.seed,
            ),
        },
        args,
        device,
    )


def _ladder_or_ab(args: argparse.Namespace, device: str) -> dict:
    prog, update = _progress(args)
    from fastloop.report import write_reports

    last_html = [float("-inf")]
    clock: dict[str, float] = {}
    from fastloop.report.lines import RunLines

    lines = RunLines() if not args.quiet and not sys.stdout.isatty() else None

    def partial(doc: dict) -> None:
        """Every finished run lands in report.json and report.md at once; report.html (its
        plots cost ~0.5 s) at most every HTML_EVERY_S seconds, and always at the end."""
        if lines is not None:  # on the command's clock and the user's budget
            lines(
                {
                    **doc,
                    "budget_s": clock.get("budget", doc.get("budget_s")),
                    "run_log": [
                        {**e, "elapsed_s": e.get("elapsed_s", 0) + clock.get("started", 0.0)}
                        for e in doc.get("run_log") or []
                    ],
                }
            )
        now = time.monotonic()
        html = now - last_html[0] >= HTML_EVERY_S
        write_reports(_stamp({**doc, "partial": True}, args, device), args.out, args.json, html=html)
        if html:
            last_html[0] = now

    try:
        if prog:
            prog.start()
        from fastloop.drivers.ladder import default_budget, default_measure_s, run_ladder

        if args.measure_s is None and not getattr(args, "steps_given", False):
            # ladder and ab: a time window of steady steps, however short the step (unless --steps was given)
            args.measure_s = default_measure_s(device)
        if args.cmd == "ladder":
            from fastloop import STARTED
            from fastloop.speedups.base import resolve

            rungs = [s.spec for s in resolve(args.rungs)] if args.rungs is not None else None
            budget = args.budget if args.budget is not None else default_budget(device)
            started_s = time.perf_counter() - STARTED  # imports and checks before the ladder's clock
            clock.update(budget=budget, started=started_s)
            doc = run_ladder(
                args.target,
                rungs,
                steps=args.steps,
                warmup=args.warmup,
                max_repeats=args.max_repeats,
                budget=max(budget - started_s - TEARDOWN_S, 1.0),
                mode="cumulative" if args.cumulative else "sequential" if args.sequential else "select",
                device=device,
                progress=update,
                on_update=partial,
                measure=_measure_on(args),
                base=args.base,
                objective=args.objective,
            )
            doc.update(budget_s=budget, started_s=round(started_s, 2), teardown_reserve_s=TEARDOWN_S)
            if doc["rungs"]:
                doc["diagnosis"] = doc["rungs"][-1].get("bottleneck") or doc["rungs"][0].get("bottleneck")
        else:
            doc = _ab(args, device, update, partial)
    finally:
        if prog:
            prog.stop()
    return _stamp(doc, args, device)


def _ab(args: argparse.Namespace, device: str, update: Any, partial: Any) -> dict:
    """``fastloop ab``: the A/B (with ``--check``, the check of B against A after it)."""
    from fastloop.drivers.ab import run_ab

    return run_ab(
        args.target,
        args.a,
        args.b,
        repeats=args.repeats,
        steps=args.steps,
        warmup=args.warmup,
        device=device,
        progress=update,
        on_update=partial,
        measure=_measure_on(args),
        check=args.check,
    )


def _batch_size(args: argparse.Namespace, device: str) -> dict:
    from fastloop.drivers.targets import build_target
    from fastloop.speedups.batch_size import search_batch_size

    module, data, settings = build_target(args.target)  # no Trainer: of its settings, the precision applies
    doc = search_batch_size(
        module,
        data,
        speedups=args.speedups,
        device=device,
        max_size=args.max_size,
        trainer_precision=(settings or {}).get("precision"),
        objective=args.objective,
        margin=args.margin,
    )
    return _stamp({"kind": "batch-size", **doc}, args, device)


def _doctor(args: argparse.Namespace, device: str) -> dict:
    from fastloop.drivers.doctor import diagnose, machine_ceilings

    doc: dict = {"kind": "doctor", "ceilings": machine_ceilings(quick=args.quick)}
    if args.target:
        from fastloop.drivers.runner import run_configuration

        base = run_configuration(args.target, "none", steps=args.steps, warmup=args.warmup, device=device)
        doc["baseline"] = base
        doc["diagnosis"] = diagnose(base, doc["ceilings"])
    return _stamp(doc, args, device)
