"""The ``fastloop`` command: run, ladder, ab, batch-size, doctor.

Exit status: 0 on success; 2 on bad input to fastloop, with one line saying what was wrong and
what is accepted; 1 when the user's own code raised (their frames only, and a last line naming
their function); 130 on Ctrl-C, with the finished configurations written. Arguments and output
paths are checked before torch is imported.

Example:
    $ fastloop doctor --json ceilings.json
    $ fastloop ladder gpt --out report/
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
from pathlib import Path
from typing import Any

from fastloop.drivers.config import BOUNDS
from fastloop.drivers.exits import arm_interrupt_deadline, distributed_left_open, leave_now, peer_failed
from fastloop.errors import FastloopError, shorten

__all__ = ["main"]


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, status 2
        sys.stderr.write(f"fastloop: error: {_one_line(message)}\n")
        raise SystemExit(2)


SPEEDUPS_HELP = (
    "comma-separated speedups, each with its options after a colon (workers:8, "
    "compile:max-autotune:shapes=static), or none; `fastloop speedups` lists every speedup and option"
)


def _common(sp: argparse.ArgumentParser) -> None:
    sp.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    sp.add_argument("--json", metavar="FILE", help="write the JSON document here")
    sp.add_argument("--out", metavar="DIR", help="write report.json, report.md and report.html here")
    sp.add_argument("--quiet", action="store_true", help="print nothing but errors")


def _steps(sp: argparse.ArgumentParser, default_steps: int = 30) -> None:
    sp.add_argument(
        "--steps",
        type=BOUNDS["steps"].argument(),
        default=None,
        help=f"measured steps (default {default_steps}; a ladder or A/B given --steps measures that many "
        "instead of its time window)",
    )
    sp.set_defaults(default_steps=default_steps)
    sp.add_argument(
        "--warmup",
        type=BOUNDS["warmup"].argument(),
        default=5,
        help="steps before measuring (compile and capture happen here)",
    )


def _ranks(sp: argparse.ArgumentParser) -> None:
    """What a command that trains the target in processes of its own takes (run, ladder, ab): the
    devices and strategy of its ranks, and whether its compiles use the compile cache."""
    sp.add_argument(
        "--devices",
        type=BOUNDS["devices"].argument(),
        default=1,
        help="devices (GPUs, or CPU processes) to train on, started by Lightning's strategy",
    )
    sp.add_argument(
        "--strategy", choices=["ddp", "fsdp"], default=None, help="Lightning's strategy for --devices > 1 (default ddp)"
    )
    _no_cache(sp)


def _no_cache(sp: argparse.ArgumentParser) -> None:
    sp.add_argument(
        "--no-cache",
        action="store_true",
        help="compile cold, in a fresh directory removed after each run, leaving the compile cache "
        "(~/.cache/fastloop/compile, or $FASTLOOP_CACHE_DIR/compile) as it was",
    )


def _ab_parser(sub: Any) -> None:
    """``fastloop ab``'s arguments."""
    sp = sub.add_parser("ab", help="compare two configurations, interleaved, with statistics")
    sp.add_argument("target")
    sp.add_argument("--a", required=True, help="configuration A: " + SPEEDUPS_HELP)
    sp.add_argument("--b", required=True, help="configuration B (a ratio > 1 means B is faster): " + SPEEDUPS_HELP)
    sp.add_argument(
        "--repeats",
        type=BOUNDS["repeats"].argument(),
        default=5,
        help="runs a side, interleaved (fewer than 3: too few runs to tell)",
    )
    sp.add_argument(
        "--measure-s",
        type=BOUNDS["measure_s"].argument(),
        default=None,
        help="seconds of steady steps each run measures, however short the step (default 2 on a GPU, "
        "1 on a CPU, as the ladder; with --steps only: that many steps)",
    )
    sp.add_argument(
        "--check",
        action="store_true",
        help="also check that B trains as A: one seeded run a side from the same weights on the same batches, "
        "their per-step losses within a tolerance derived from what B changes (the ladder's check of its pick)",
    )
    _steps(sp)
    _common(sp)
    _ranks(sp)


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog="fastloop", description="Make PyTorch training loops fast, and prove it.")
    sub = p.add_subparsers(dest="cmd", required=True, parser_class=_Parser)

    sp = sub.add_parser("run", help="measure one configuration")
    sp.add_argument("target")
    sp.add_argument("--speedups", default="none", help=SPEEDUPS_HELP)
    sp.add_argument(
        "--no-scaling",
        action="store_true",
        help="with --devices N: skip the 1-device run that scaling efficiency is measured against",
    )
    sp.add_argument(
        "--measure-s",
        type=BOUNDS["measure_s"].argument(),
        default=None,
        help="measure a window of this many seconds of steady steps (at least 10 steps) instead of --steps",
    )
    sp.add_argument(
        "--step-rate",
        type=BOUNDS["step_rate"].argument(),
        default=None,
        help="steps per second this step reaches without waiting for data, if you measured it: workers "
        "then sizes the loader to what the step consumes (the ladder passes it to a feed candidate)",
    )
    sp.add_argument(
        "--seed",
        type=BOUNDS["seed"].argument(),
        default=None,
        help="a paired run: every generator seeded before the target is built, with the initial weights' and "
        "each batch's digest in the JSON (what the check of a pick compares step by step)",
    )
    _steps(sp)
    _common(sp)
    _ranks(sp)
    sp = sub.add_parser("ladder", help="add speedups one by one, each measured")
    sp.add_argument("target")
    sp.add_argument(
        "--rungs", default=None, help=SPEEDUPS_HELP.replace(", or none", "") + " (default: all that apply here)"
    )
    sp.add_argument(
        "--max-repeats",
        type=BOUNDS["max_repeats"].argument(),
        default=6,
        help="most runs a side per comparison (3 first; more only while the answer is unclear)",
    )
    sp.add_argument(
        "--budget",
        type=BOUNDS["budget"].argument(),
        default=None,
        help="seconds for the whole ladder (default 300 on a GPU, 80 on a CPU); what does not fit is "
        "listed as 'not tried: budget'",
    )
    sp.add_argument(
        "--base",
        default=None,
        help="speedups every configuration has: the baseline is this set, the rungs are tried on top",
    )
    sp.add_argument(
        "--cumulative",
        action="store_true",
        help="add every rung on top of all before it (the story), instead of selecting",
    )
    sp.add_argument(
        "--sequential",
        action="store_true",
        help="try one rung at a time on top of the best so far (the older search), instead of the "
        "staged search (bottleneck first, the compute bundle and its ablation, the feed again)",
    )
    sp.add_argument("--keep-helpful", action="store_true", help=argparse.SUPPRESS)  # kept for old scripts
    sp.add_argument(
        "--measure-s",
        type=BOUNDS["measure_s"].argument(),
        default=None,
        help="seconds of steady steps each run measures, however short the step (default 2 on a GPU: "
        "a 16 ms step measures ~125 steps, enough to tell 5%% from noise; 1 on a CPU)",
    )
    _steps(sp)
    _common(sp)
    _ranks(sp)
    _ab_parser(sub)
    sp = sub.add_parser("batch-size", help="find the batch size (largest that fits, or fastest)")
    sp.add_argument("target")
    sp.add_argument("--speedups", default="none", help=SPEEDUPS_HELP)
    sp.add_argument("--max", type=BOUNDS["max_size"].argument(), default=4096, dest="max_size")
    sp.add_argument("--objective", choices=["max", "throughput"], default="throughput")
    margin = "use at most this fraction of the largest fitting size"
    sp.add_argument("--margin", type=BOUNDS["margin"].argument(), default=0.9, help=margin)
    _common(sp)
    sp = sub.add_parser("speedups", help="every speedup and its options (what each accepts, its default, its doc)")
    sp.add_argument("names", nargs="*", help="only these speedups")
    sp = sub.add_parser("doctor", help="machine ceilings; with a target, its bottleneck")
    sp.add_argument("target", nargs="?")
    sp.add_argument("--quick", action="store_true", help="smaller problems (faster, less exact)")
    _steps(sp, default_steps=20)
    _common(sp)
    return _fit_commands(p, sub)


def _length(sp: argparse.ArgumentParser) -> None:
    """A fit's length and target: ``--epochs``, ``--max-steps``, ``--max-time``, ``--until``."""
    length = sp.add_mutually_exclusive_group()
    length.add_argument("--epochs", type=BOUNDS["epochs"].argument(), default=None, help="epochs the fit trains")
    length.add_argument("--max-steps", type=BOUNDS["max_steps"].argument(), default=None, help="optimizer steps")
    length.add_argument(
        "--max-time",
        type=BOUNDS["max_time"].argument(),
        default=None,
        help="seconds of training (Lightning's max_time, counted from the start of training)",
    )
    sp.add_argument(
        "--until",
        default=None,
        metavar="METRIC>=X",
        help="stop at the first validation run whose METRIC reaches X (METRIC>=X or METRIC<=X; a name the module "
        "logs in validation): the time to that target is recorded; 'not reached' when the fit ends first",
    )


def _fit_commands(p: argparse.ArgumentParser, sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """``fastloop fit``, the ``--fit`` form of ``fastloop ab`` and ``fastloop ladder --objective fit``."""
    sp = sub.add_parser("fit", help="run the target's whole fit as you train it; account for every second")
    sp.add_argument("target")
    sp.add_argument("--speedups", default="none", help=SPEEDUPS_HELP)
    _length(sp)
    sp.add_argument("--seed", type=BOUNDS["seed"].argument(), default=0)
    sp.add_argument("--child-of", type=float, default=None, help=argparse.SUPPRESS)  # the fit's own process
    # a short fit (the ladder's fit objective): batches an epoch and a validation run
    sp.add_argument("--train-batches", type=BOUNDS["train_batches"].argument(), default=None, help=argparse.SUPPRESS)
    sp.add_argument("--val-batches", type=BOUNDS["val_batches"].argument(), default=None, help=argparse.SUPPRESS)
    sp.add_argument("--root-dir", default=None, help=argparse.SUPPRESS)
    _no_cache(sp)
    _common(sp)
    sub.choices["ladder"].add_argument(
        "--objective",
        choices=["step", "fit"],
        default="step",
        help="what the ladder makes fast: the training step (default), or the whole fit (validation, checkpoint "
        "saves, logging syncs too: short fits measure their phases, the fit speedups are rungs, and the report "
        "predicts the fit's time plain vs pick beside the step's)",
    )
    ab = sub.choices["ab"]
    ab.add_argument(
        "--fit", action="store_true", help="compare whole fits (time by phase, and what they learn) instead of steps"
    )
    ab.add_argument(
        "--seeds",
        type=BOUNDS["seeds"].argument(),
        default=3,
        help="with --fit: fits a side, seed i for both A and B (fewer than 3: too few runs to tell)",
    )
    ab.add_argument(
        "--tolerance",
        type=BOUNDS["tolerance"].argument(),
        default=None,
        help="with --fit: the band (in the metric's units) within which B 'learns the same' as A "
        "(default: twice A's seed-to-seed spread, at least 1%% of A's value)",
    )
    _length(ab)
    return p


def _inputs(args: argparse.Namespace) -> list[str]:
    """Files this run reads: the target's file (a report must never land on it)."""
    target = getattr(args, "target", None) or ""
    where = target.rsplit(":", 1)[0]
    return [where] if where.endswith(".py") else []


TARGET_MAX = 1024
"""The longest target name accepted (a file path and a function, or a module and a function)."""


def _check_target(args: argparse.Namespace) -> None:
    """Refuse, before anything runs, a target name no file or module could have: not UTF-8, or
    too long (a report written under it would fail after the training ran)."""
    target = getattr(args, "target", None)
    if not target:
        return
    try:
        target.encode("utf-8")
    except UnicodeEncodeError:
        raise FastloopError(
            f"target {shorten(target)}: the name is not valid UTF-8; rename the file with a "
            "UTF-8 name (FILE.py:FUNCTION)"
        ) from None
    longest = max((len(part.encode()) for part in Path(target.rsplit(":", 1)[0]).parts), default=0)
    if len(target) > TARGET_MAX or longest > 255:
        raise FastloopError(
            f"target {shorten(target)} is too long: a name in a path may be at most 255 bytes and a "
            f"target at most {TARGET_MAX:,} characters (FILE.py:FUNCTION or package.module:FUNCTION)"
        )


FIT_ONLY = ("epochs", "max_steps", "max_time", "until", "tolerance")


def _check_fit_flags(args: argparse.Namespace) -> None:
    """A fit's flags: ``--until`` well formed; on ``ab``, only with ``--fit``."""
    if args.cmd == "ab" and not args.fit:
        given = [f"--{k.replace('_', '-')}" for k in FIT_ONLY if getattr(args, k, None) is not None]
        if given:
            raise FastloopError(f"{', '.join(given)} compare whole fits: add --fit (ab TARGET --a A --b B --fit ...)")
    if getattr(args, "until", None) is not None:
        from fastloop.measure.until import Until

        Until.parse(args.until)
    if args.cmd == "fit" and args.child_of is not None and not (args.json and args.root_dir):
        raise FastloopError("--child-of is fastloop fit's own process: it needs --json and --root-dir")
    if args.cmd == "ladder" and args.objective == "fit" and (args.devices > 1 or args.strategy):
        raise FastloopError(
            "--objective fit measures fits on one device: leave out --devices/--strategy, or use --objective step"
        )


def _check_outputs(args: argparse.Namespace) -> None:
    from fastloop.report.files import check_json_path, check_out_dir

    if args.json is not None:
        check_json_path(args.json, _inputs(args))
    if args.out is not None:
        check_out_dir(args.out, _inputs(args))
    if args.json is not None and args.out is not None and Path(args.json).resolve().parent == Path(args.out).resolve():
        raise FastloopError("--json must not point into the --out folder (it already gets report.json)")


def _check_speedup_lists(args: argparse.Namespace) -> None:
    """Every speedup list of the command, checked before Lightning is imported (the registry's
    modules need torch, so this is the first check that pays for the torch import)."""
    from fastloop.speedups import resolve

    for flag in ("speedups", "a", "b", "rungs", "base"):
        value = getattr(args, flag, None)
        if value is not None:
            resolve(value)


def _print(doc: dict) -> None:
    from rich.table import Table

    from fastloop.report.terminal import make_console

    console = make_console()
    if doc["kind"] in ("fit", "ab-fit"):
        from fastloop.report.fit import print_fit

        print_fit(doc, console)
        return
    if doc["kind"] == "doctor":
        env = doc["env"]
        t = Table(
            title=f"fastloop doctor [{env['gpu'] or 'no GPU'}, driver {env['driver']}, CUDA {env['cuda']}, "
            f"torch {env['torch']}]"
        )
        t.add_column("ceiling")
        t.add_column("value")
        t.add_column("how")
        for k, v in doc["ceilings"]["measured"].items():
            t.add_row(k, f"{v['value']:,.2f}", v["how"])
        for k, why in doc["ceilings"]["not_measured"].items():
            t.add_row(k, "not measured", why)
        console.print(t)
        if doc.get("diagnosis"):
            d = doc["diagnosis"]
            console.print(f"diagnosis: [bold]{d['bottleneck']}[/bold] - {d['evidence']}\nnext: {d['recommendation']}")
        return
    if doc["kind"] == "batch-size":
        t = Table(
            title=f"batch-size search: chose {doc['batch_size']} (largest fitting {doc['max_fitting']}, "
            f"margin {doc['margin']}, {doc['search_s']:.1f} s, state restored: {doc['restored']})"
        )
        for c in ("batch size", "fits", "step", "throughput"):
            t.add_column(c)
        for tr in doc["trials"]:
            t.add_row(
                str(tr["batch_size"]),
                "yes" if tr["ok"] else "OOM",
                f"{1e3 * tr['step_s']:.2f} ms" if tr["step_s"] else "-",
                f"{tr['throughput']:,.0f}/s" if tr["throughput"] else "-",
            )
        console.print(t)
        return
    from fastloop.report.terminal import print_document

    print_document(doc, console)


ERROR_LINE_MAX = 400
"""A bad-input message is one line of at most this many characters (an echoed input is shortened)."""


def _one_line(err: BaseException) -> str:
    """The message of a bad-input error as one line of at most :data:`ERROR_LINE_MAX` characters."""
    from fastloop.errors import shorten

    text = " ".join(str(err).split())
    return text if len(text) <= ERROR_LINE_MAX else shorten(text, ERROR_LINE_MAX - 24)


def main(argv: list[str] | None = None) -> int:
    """The ``fastloop`` command. Returns the exit status (see the module docstring)."""
    from fastloop.cuda_env import ensure_cuda_queues

    ensure_cuda_queues()  # before CUDA starts, here and in every run's child process (fastloop.cuda_env)
    rc = _main(argv)
    if argv is None and rc == 130:
        # interrupted, the reports already written: skip the interpreter's teardown, whose
        # collection of torch's and Lightning's objects took 1-4 s on 2 cores after a ladder's
        # Ctrl-C (faulthandler: "Garbage-collecting"); children first, as the deadline does
        leave_now(rc)
    if argv is None and distributed_left_open():
        # a rank whose peer failed holds a process group whose C++ threads can abort the
        # interpreter's shutdown ("terminate called without an active exception", SIGABRT),
        # replacing this exit status: leave at once with it, output flushed
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(rc)
    return rc


def _list_speedups(names: list[str]) -> int:
    """``fastloop speedups [NAME ...]``: each speedup's line and options, from their one definition."""
    from fastloop.speedups import REGISTRY, speedup_names
    from fastloop.speedups.catalog import options_text

    unknown = [n for n in names if n not in REGISTRY]
    if unknown:
        sys.stderr.write(
            f"fastloop: error: unknown speedup {unknown[0]!r}; valid names: {', '.join(speedup_names())}\n"
        )
        return 2
    print(options_text(names or None))
    return 0


def _main(argv: list[str] | None = None) -> int:
    if argv is None and threading.current_thread() is threading.main_thread():
        arm_interrupt_deadline()
    try:
        args = _parser().parse_args(argv)
        if hasattr(args, "default_steps"):  # --steps given: the user's count, not a default
            args.steps_given, args.steps = args.steps is not None, args.steps or args.default_steps
    except KeyboardInterrupt:
        sys.stderr.write("fastloop: interrupted\n")
        return 130
    doc: dict | None = None
    if args.cmd == "speedups":
        return _list_speedups(args.names)
    try:
        _check_target(args)
        _check_fit_flags(args)
        _check_outputs(args)
        fit = getattr(args, "fit", False)
        if args.cmd in ("ladder", "ab") and not fit and getattr(args, "devices", 1) <= 1 and not args.strategy:
            from fastloop.drivers.subproc import prestart_fork_server

            prestart_fork_server()  # its imports run while this process imports torch and Lightning
        _check_speedup_lists(args)
        from fastloop.drivers.commands import run_command

        doc = run_command(args)
        if doc.get("global_rank", 0) != 0 or doc.get("fit_child"):
            return 0  # a rank Lightning started, or a fit's own process: rank 0, the parent, reports
        from fastloop.report import write_reports

        write_reports(doc, args.out, args.json)
    except FastloopError as err:
        sys.stderr.write(f"fastloop: error: {_one_line(err)}\n")
        return 2
    except KeyboardInterrupt:
        sys.stderr.write("fastloop: interrupted\n")
        return 130
    except SystemExit as err:  # the user's code called sys.exit while fastloop was running it
        sys.stderr.write(
            f"fastloop: error in your code: it called sys.exit({err.code}) during the run; nothing was reported\n"
        )
        return 1
    except Exception as err:  # the user's code raised (or, with no frame of theirs, fastloop did)
        from fastloop.errors import format_user_error

        if peer_failed(err):  # one clear error: the failing rank's own, not its peers' echo
            sys.stderr.write("fastloop: this rank stopped because another rank failed (its error is above)\n")
            return 1
        sys.stderr.write(format_user_error(err))
        return 1
    if doc.get("interrupted"):
        sys.stderr.write("fastloop: interrupted; the finished configurations are in the report\n")
        return 130
    if not args.quiet:
        _print(doc)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
