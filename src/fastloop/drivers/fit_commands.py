"""The command line's ``fastloop fit`` and ``fastloop ab --fit`` (cli.py parses and checks the
arguments; :func:`fastloop.drivers.commands.run_command` hands them here).

``fastloop fit`` starts the fit's own process (:func:`~fastloop.drivers.fit.run_fit`), which is
``fastloop fit ... --child-of T`` itself: that process runs the fit in place and writes its record
(:func:`fit_child`), also when the user's code raised (the partial timeline), and the parent
reports.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from fastloop.drivers.fit import FitOptions, fit_here, run_fit
from fastloop.errors import UserCodeError

__all__ = ["ab_fit_command", "fit_child", "fit_command", "fit_options", "run_fit_commands"]


def fit_options(args: argparse.Namespace, device: str, speedups: str | None = None) -> FitOptions:
    """The fit the parsed command asks for (``speedups``: a side of an A/B instead of ``--speedups``)."""
    return FitOptions(
        target=args.target,
        speedups=speedups if speedups is not None else getattr(args, "speedups", "none"),
        device=device,
        epochs=args.epochs,
        max_steps=args.max_steps,
        max_time=args.max_time,
        until=args.until,
        seed=getattr(args, "seed", 0),
        compile_cache=not getattr(args, "no_cache", False),
        train_batches=getattr(args, "train_batches", None),
        val_batches=getattr(args, "val_batches", None),
    )


def fit_child(args: argparse.Namespace, device: str, leave: bool = True) -> dict:
    """The fit's own process: run it here, write its record to ``--json`` (also when the user's code
    raised: the parent keeps the partial timeline), then raise the user's error (status 1), or
    (``leave``) end the process at once with status 0."""
    from fastloop.report.files import atomic_write, to_json

    record, error = fit_here(fit_options(args, device), spawned_at=args.child_of, root_dir=args.root_dir)
    atomic_write(args.json, to_json(record))
    if error is not None:
        raise UserCodeError(f"while fitting {args.target}") from error
    if leave:
        from fastloop.drivers.exits import leave_now

        # the fit is over and recorded: the interpreter's teardown (collecting torch's and Lightning's
        # objects, 1-9 s on a busy 2-core CPU) is no cost of the fit, and the outside clock ends here
        leave_now(0)
    return {"fit_child": True}


def fit_command(args: argparse.Namespace, device: str, stamp: Callable[[dict], dict]) -> dict:
    """``fastloop fit``: the document (``kind: "fit"``). When the user's code raised, the partial
    document is written first and the user's error raised (status 1)."""
    from fastloop.drivers.fit_share import keep_fit_record
    from fastloop.report import write_reports

    doc, error = run_fit(fit_options(args, device), out=args.out)
    doc = stamp(doc)
    keep_fit_record(doc, args.out)
    if error is not None:
        write_reports(doc, args.out, args.json)
        failed = doc["failed"]
        raise UserCodeError(
            f"the fit of {args.target} raised in its {failed['phase']} phase at {failed['second']:.1f} s "
            f"(the timeline up to there is in the report):\n{error}"
        )
    return doc


def ab_fit_command(
    args: argparse.Namespace, device: str, stamp: Callable[[dict], dict], progress: Callable[[str], None] | None
) -> dict:
    """``fastloop ab --fit``: two fits a seed, counterbalanced, and their verdicts."""
    from fastloop.drivers.ab_fit import run_ab_fit
    from fastloop.report import write_reports

    def update(doc: dict) -> None:
        write_reports(stamp({**doc, "partial": True}), args.out, args.json)

    doc = run_ab_fit(
        fit_options(args, device, speedups="none"),
        args.a,
        args.b,
        seeds=args.seeds,
        tolerance=args.tolerance,
        progress=progress,
        on_update=update if (args.out or args.json) else None,
    )
    return stamp(doc)


def run_fit_commands(
    args: argparse.Namespace, device: str, stamp: Callable[[dict], dict], progress: tuple[Any, Any]
) -> dict:
    """``fit`` (the parent, or the fit's own process with ``--child-of``) or ``ab --fit``."""
    if args.cmd == "fit" and args.child_of is not None:
        return fit_child(args, device)
    prog, update = progress
    try:
        if prog:
            prog.start()
            update(f"fitting {args.target}" if args.cmd == "fit" else "starting")
        if args.cmd == "fit":
            return fit_command(args, device, stamp)
        return ab_fit_command(args, device, stamp, update)
    finally:
        if prog:
            prog.stop()
