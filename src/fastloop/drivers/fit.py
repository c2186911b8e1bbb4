"""``fastloop fit``: the target's whole fit, the way the user trains it, with every second accounted.

The fit runs in a fresh Python process (the user's own command pays its imports too), with the
target's own Trainer settings (validation cadence, checkpoints, logger, progress bar, callbacks;
a plain Trainer's defaults where it gives none), its loaders and validation, and the speedups as
fastloop's callbacks. Two clocks time it: the parent times the process from spawn to exit (the
outside clock, ``wall_s``); inside it, :mod:`fastloop.measure.fit_clock` charges every second
from that same spawn to a phase. What they disagree by is ``other`` (docs/fit.md).

The fit writes its logs and checkpoints under ``--out`` (its ``fit_files`` folder), or into a
temporary folder removed afterwards: never into the working directory.

Example:
    >>> FitOptions(target="demo", epochs=2).length_args()
    ['--epochs', '2']
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

from fastloop.drivers.fit_parts import fit_parts
from fastloop.drivers.fit_result import (
    EpochRecord,
    FitResult,
    Outcome,
    Phases,
    StepOnly,
    divergence,
    phase_check,
)
from fastloop.errors import ConfigurationFailed, FastloopError, UserCodeError
from fastloop.report.files import OWNED_FOLDERS

__all__ = ["FIT_FILES", "FIT_RECORD", "FitOptions", "fit_here", "fit_result", "run_fit", "run_fit_process"]

FIT_FILES = "fit_files"
"""The folder under ``--out`` that holds the fit's own files (its logs and checkpoints)."""
FIT_MARK = OWNED_FOLDERS[FIT_FILES]
"""Written into :data:`FIT_FILES`: the folder is fastloop's (a later fit may empty it)."""
FIT_RECORD = "fit.json"
"""Beside the reports in ``--out``: the fit's document, kept when a later ``run``, ``ladder`` or
``ab`` writes its report in the same folder (they read it: what share of this fit their step covers)."""

FIT_OWNED: dict[str, str] = {
    **{
        k: "fastloop chooses the device (--device); a fit runs on one device"
        for k in ("accelerator", "devices", "strategy", "num_nodes")
    },
    "profiler": "fastloop's phase clock is the fit's profiler",
    "default_root_dir": "the fit writes its logs and checkpoints under --out (or a temporary folder)",
}
"""Trainer settings of the target a fit replaces, and why (the rest are the user's, as given)."""
LENGTH_KEYS = ("max_epochs", "max_steps", "max_time", "min_epochs", "min_steps")


@dataclass(frozen=True, kw_only=True)
class FitOptions:
    """What ``fastloop fit`` was asked: the target, its speedups, the fit's length and seed."""

    target: str
    speedups: str = "none"
    """Comma-separated speedups (``none``: the plain fit)."""
    device: str = "cpu"
    epochs: int | None = None
    max_steps: int | None = None
    max_time: float | None = None
    """Seconds: Lightning's own ``max_time`` (counted from the start of training)."""
    until: str | None = None
    """``METRIC>=X`` or ``METRIC<=X``: stop at the first validation run that reaches it."""
    seed: int = 0
    compile_cache: bool = True
    """Compiles use the project's compile cache (False: ``--no-cache``, a cold compile)."""
    train_batches: int | None = None
    """At most this many training batches an epoch (Lightning's ``limit_train_batches``; None: the
    target's own): the ladder's short fit, whose record still gives a full epoch's batches."""
    val_batches: int | None = None
    """At most this many batches a validation run (Lightning's ``limit_val_batches``; None: the target's own)."""

    def length_args(self) -> list[str]:
        """The length and target flags as the command line spells them."""
        out: list[str] = []
        for flag, value in (("--epochs", self.epochs), ("--max-steps", self.max_steps), ("--max-time", self.max_time)):
            if value is not None:
                out += [flag, repr(value) if isinstance(value, float) else str(value)]
        out += ["--until", self.until] if self.until else []
        for flag, value in (("--train-batches", self.train_batches), ("--val-batches", self.val_batches)):
            out += [flag, str(value)] if value is not None else []
        return out

    def length_kwargs(self, user: dict[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
        """(the Trainer's length settings, the target's length settings they replace -> why). The
        flags replace the target's length as a whole; without flags the target's own stand, and
        a target with none needs a flag (Lightning's default would train 1000 epochs). A short
        fit's batch limits (:meth:`limit_kwargs`) replace the target's own."""
        given = {"max_epochs": self.epochs, "max_steps": self.max_steps, "max_time": self.max_time}
        if all(v is None for v in given.values()):
            if self.until is None and all(user.get(k) in (None, -1) for k in ("max_epochs", "max_steps", "max_time")):
                raise FastloopError(
                    f"{self.target}'s Trainer settings give the fit no length (Lightning would train 1,000 epochs): "
                    "give --epochs N, --max-steps N, --max-time S or --until METRIC>=X"
                )
            return self.limit_kwargs(), self.limits_replace(user)
        kwargs = {
            "max_epochs": self.epochs,
            "max_steps": -1 if self.max_steps is None else self.max_steps,
            "max_time": None if self.max_time is None else timedelta(seconds=self.max_time),
        }
        why = "the fit's length is --epochs/--max-steps/--max-time"
        return kwargs | self.limit_kwargs(), {k: why for k in LENGTH_KEYS if k in user} | self.limits_replace(user)

    def limit_kwargs(self) -> dict[str, int]:
        """Lightning's batch limits of a short fit (``train_batches``, ``val_batches``; {} for a whole fit)."""
        limits = {"limit_train_batches": self.train_batches, "limit_val_batches": self.val_batches}
        return {k: v for k, v in limits.items() if v is not None}

    def limits_replace(self, user: dict[str, Any]) -> dict[str, str]:
        """The target's own batch limits that a short fit's replace, and why."""
        why = "a short fit (the ladder's fit objective) sets the batches an epoch and a validation run"
        return {k: why for k in self.limit_kwargs() if k in user}


def _sync(device: str) -> Callable[[], None] | None:
    """The phase clock's synchronize on CUDA: never while a CUDA graph is being captured (a compile
    may begin inside a capture; a synchronize there would end the capture with an error)."""
    if device != "cuda":
        return None
    import torch

    def sync() -> None:
        if not torch.cuda.is_current_stream_capturing():
            torch.cuda.synchronize()

    return sync


def _build(opts: FitOptions) -> tuple[Any, Any, dict, list, list[dict], list, dict]:
    """The target built (seeded): (module, data, the user's Trainer settings, the speedups, the
    records of those that prepared the run before training, the others' callbacks, their stats)."""
    from fastloop._compat import pl
    from fastloop.adapters.lightning import SpeedupCallback
    from fastloop.drivers.targets import build_target, recipe_fit_settings
    from fastloop.speedups.base import RunInputs, resolve

    pl.seed_everything(opts.seed, verbose=False)
    module, data, user_trainer = build_target(opts.target, optional_kwargs={"seed": opts.seed})
    user_trainer = {**recipe_fit_settings(opts.target), **user_trainer}  # a recipe's cadence, as its script has it
    chosen = resolve(opts.speedups)
    prepared, extra = [], {}
    in_training = [s for s in chosen if not s.prepares_run]
    for s in chosen:
        if s.prepares_run:
            import torch

            dev = torch.device("cuda" if opts.device == "cuda" else "cpu")
            data, record, stats = s.prepare_run(module, data, in_training, dev, precision=user_trainer.get("precision"))
            prepared.append(record.to_dict())
            extra.update(stats)
    inputs = RunInputs(compile_cache=opts.compile_cache)
    callbacks = [SpeedupCallback(s, inputs=inputs) for s in in_training]
    return module, data, user_trainer, chosen, prepared, callbacks, extra


def _trainer(opts: FitOptions, user: dict, callbacks: list, root_dir: str, profiler: Any) -> tuple[Any, dict]:
    """The user's Trainer, as they configured it, on fastloop's device and folder; the settings
    it used and left out."""
    from fastloop._compat import Trainer

    length, replaced = opts.length_kwargs(user)
    left_out = {k: FIT_OWNED[k] for k in user if k in FIT_OWNED} | replaced
    kwargs = {k: v for k, v in user.items() if k not in left_out}
    user_callbacks = kwargs.pop("callbacks", None) or []
    user_callbacks = list(user_callbacks) if isinstance(user_callbacks, (list, tuple)) else [user_callbacks]
    trainer = Trainer(
        **kwargs,
        **length,
        accelerator="gpu" if opts.device == "cuda" else "cpu",
        devices=1,
        default_root_dir=root_dir,
        profiler=profiler,
        callbacks=[*user_callbacks, *callbacks],
    )
    profiler.checkpoint_keys = {cb.state_key for cb in trainer.checkpoint_callbacks}
    bar = trainer.progress_bar_callback
    profiler.progress_keys = {bar.state_key} if bar is not None else set()
    settings = {
        "used": {k: repr(v) for k, v in kwargs.items()},
        "length": {k: (v.total_seconds() if isinstance(v, timedelta) else v) for k, v in length.items()},
        "callbacks": [type(c).__name__ for c in trainer.callbacks],
        "logger": [type(lg).__name__ for lg in trainer.loggers],
        "left_out": left_out,
        "root_dir": root_dir,
    }
    return trainer, settings


def _train(trainer: Any, module: Any, data: Any) -> BaseException | None:
    """``trainer.fit``; the user's exception, returned (fastloop's own errors and Ctrl-C raised)."""
    from torch.utils.data import DataLoader

    try:
        if data is None:
            trainer.fit(module)
        elif isinstance(data, DataLoader):
            trainer.fit(module, train_dataloaders=data)
        else:
            trainer.fit(module, datamodule=data)
    except SystemExit:
        if trainer.interrupted:  # Lightning turns Ctrl-C into a graceful shutdown and then exit(1)
            raise KeyboardInterrupt from None
        raise
    except (FastloopError, KeyboardInterrupt):
        raise
    except Exception as err:  # noqa: BLE001 - the user's code raised: recorded, then reported by the caller
        return err
    if trainer.interrupted:
        raise KeyboardInterrupt
    return None


def fit_here(opts: FitOptions, *, spawned_at: float, root_dir: str) -> tuple[dict, BaseException | None]:
    """Run the fit in this process (the child's side); returns its record and the user's exception
    (None when the fit ended on its own). ``spawned_at``: ``time.monotonic()`` when the parent
    started this process (the phases are charged from there)."""
    from fastloop._torch_private import compile_event_hooks, dynamo_counters
    from fastloop.adapters._lightning_private import wrap_logged_metrics, wrap_validation_loop
    from fastloop.measure.fit_clock import CompileWatch, PhaseClock, PhaseProfiler
    from fastloop.measure.fit_recorder import FitRecorder
    from fastloop.measure.until import Until

    clock = PhaseClock(origin=spawned_at, sync=_sync(opts.device))
    watch = CompileWatch(clock, compile_event_hooks, dynamo_counters)
    try:
        module, data, user, chosen, prepared, speedup_cbs, extra = _build(opts)
        recorder = FitRecorder(clock, Until.parse(opts.until) if opts.until else None)
        profiler = PhaseProfiler(clock, set(), set())
        trainer, settings = _trainer(opts, user, [*speedup_cbs, recorder], root_dir, profiler)
        undo = [
            wrap_validation_loop(trainer, lambda run: clock.wrap(run, "validation", sync=True)),
            wrap_logged_metrics(trainer, lambda log: clock.wrap(log, "host_syncs")),
        ]
        try:
            error = _train(trainer, module, data)
        finally:
            for u in undo:
                u()
    finally:
        watch.close()
    failed_in = clock.failed_in or (clock.current, clock.seconds())
    ended = clock.finish(base="other")
    record = _record(clock, recorder, watch, settings, [c.record.to_dict() for c in speedup_cbs] + prepared)
    record["record_s"] = ended  # the phases are charged up to here
    for cb in speedup_cbs:  # what the speedups counted (fast_validation: the compiles after its warm-up)
        if cb.ctx is not None:
            extra.update({k: v for k, v in cb.ctx.stats.items() if isinstance(v, (int, float, str, dict))})
    record["extra"] = extra
    record["parts"] = fit_parts(module, data, user)  # what the fit has beside its steps, read off the target
    record["loaders"] = _loaders(recorder, user)
    if error is not None:
        culprit = next((s for s in reversed(chosen) if s.claims(error)), None)
        first = f"{type(error).__name__}: {str(error).strip().splitlines()[0] if str(error).strip() else ''}"[:300]
        if culprit is not None:
            record["speedup_failed"] = {"name": culprit.name, "spec": culprit.spec, "error": first}
            return record, None
        record["failed"] = {"phase": failed_in[0], "second": failed_in[1], "error": first}
    return record, error


def _limited(batches: int | None, limit: Any) -> int | None:
    """The batches Lightning runs of ``batches`` under the user's own ``limit_*_batches`` (an int:
    at most that many; a fraction: that share, as Lightning rounds it).

    Example:
        >>> _limited(100, None), _limited(100, 30), _limited(100, 0.25), _limited(None, 5)
        (100, 30, 25, None)
    """
    if batches is None or limit is None or isinstance(limit, bool):
        return batches
    return min(batches, limit) if isinstance(limit, int) else int(batches * float(limit))


def _loaders(recorder: Any, user: dict) -> dict:
    """The batches a whole epoch and a whole validation run of the target's own fit have (its own
    limits applied), and the validation batches this fit ran (the sanity check's apart)."""
    full = recorder.loader_batches
    return {
        "train": _limited(full["train"], user.get("limit_train_batches")),
        "val": _limited(full["val"], user.get("limit_val_batches")),
        "val_run": recorder.val_batches,
        "sanity_run": recorder.sanity_batches,
    }


def _record(clock: Any, recorder: Any, watch: Any, settings: dict, speedups: list[dict]) -> dict:
    """The child's record: what the parent turns into a :class:`FitResult`."""
    losses = recorder.train_loss()
    return {
        "phases": dict(clock.totals),
        "epochs": {str(e): p for e, p in sorted(clock.by_epoch.items())},
        "batches": {str(e): n for e, n in recorder.batches.items()},
        "samples": {str(e): n for e, n in recorder.samples.items()},
        "train_loss": {
            "step": [s for s, _ in recorder.steps],
            "second": [t for _, t in recorder.steps],
            "value": losses,
        },
        "validation": recorder.validation,
        "until": str(recorder.until) if recorder.until else None,
        "reached": recorder.reached,
        "compiles": watch.summary(),
        "steady_s": recorder.steady_s,
        "speedups": speedups,
        "settings": settings,
    }


def fit_result(record: dict, wall_s: float, opts: FitOptions, fallbacks: list[dict] | None = None) -> FitResult:
    """The parent's side: the child's record and the outside clock as a :class:`FitResult`."""
    from fastloop.measure.stats import summarize

    phases = Phases.from_child(record["phases"], wall_s)
    epochs = [
        EpochRecord(int(e), p, int(record["batches"].get(e, 0)), int(record["samples"].get(e, 0)))
        for e, p in record["epochs"].items()
    ]
    loss = record["train_loss"]
    outcome = Outcome(
        train_loss=loss,
        validation=record["validation"],
        until=record.get("until"),
        reached=record.get("reached"),
        diverged=divergence(loss["step"], loss["value"]),
    )
    steady = summarize(record["steady_s"])
    steps = len(loss["step"])
    step_only = StepOnly(
        steps=steps,
        steady_steps=len(record["steady_s"]),
        median_s=steady["median"],
        p25_s=steady["p25"],
        p75_s=steady["p75"],
        covers_frac=steps * steady["median"] / wall_s if steady["median"] and wall_s > 0 else None,
    )
    teardown = float(record["phases"].get("other", 0.0))
    check = phase_check(
        phases, wall_s, other_parts={"teardown_s": teardown, "exit_s": wall_s - float(record["record_s"])}
    )
    warnings = []
    if not check["within"]:
        warnings.append(
            f"the phases leave {100 * (check['other_frac'] or 0):.1f}% of the outside clock to `other` (more than "
            f"{100 * check['tolerance']:g}%): this fit spent time where fastloop's phase clock does not look"
        )
    if outcome.diverged:
        warnings.append(f"the fit diverged at step {outcome.diverged['step']}: {outcome.diverged['why']}")
    settings = {**record["settings"], "seed": opts.seed, "speedups_asked": opts.speedups, "until": opts.until}
    return FitResult(
        wall_s=wall_s,
        phases=phases,
        epochs=epochs,
        outcome=outcome,
        compiles=record["compiles"],
        step_only=step_only,
        speedups=[*(fallbacks or []), *record["speedups"]],
        settings=settings,
        phase_check=check,
        warnings=warnings,
        failed=record.get("failed"),
        parts=record.get("parts") or {},
        loaders=record.get("loaders") or {},
        extra=record.get("extra") or {},
    )


def _child_command(opts: FitOptions, speedups: str, record_path: str, root_dir: str, spawned_at: float) -> list[str]:
    return [
        sys.executable,
        "-m",
        "fastloop.cli",
        "fit",
        opts.target,
        "--speedups",
        speedups or "none",
        *opts.length_args(),
        "--seed",
        str(opts.seed),
        "--device",
        opts.device,
        "--json",
        record_path,
        "--quiet",
        "--child-of",
        repr(spawned_at),
        "--root-dir",
        root_dir,
        *([] if opts.compile_cache else ["--no-cache"]),
    ]


def run_fit_process(opts: FitOptions, speedups: str, root_dir: str, timeout: float) -> tuple[dict | None, float, str]:
    """One fit in a fresh interpreter: (its record, None when it wrote none; the outside clock's
    seconds from spawn to exit; its stderr). Raises ConfigurationFailed for bad input (status 2)."""
    from fastloop.drivers.reaper import run_folder
    from fastloop.drivers.subproc import child_env, run_fresh

    with run_folder() as tmp:
        record_path, err_path = os.path.join(tmp, "record.json"), os.path.join(tmp, "stderr.txt")
        env = child_env(profile=False)
        spawned_at = time.monotonic()
        cmd = _child_command(opts, speedups, record_path, root_dir, spawned_at)
        rc = run_fresh(cmd, env, err_path, timeout, speedups)
        wall_s = time.monotonic() - spawned_at
        with open(err_path, errors="replace") as f:
            stderr = f.read()
        if rc == 2:
            lines = [ln for ln in stderr.splitlines() if ln.startswith("fastloop: error:")] or ["(no message)"]
            raise ConfigurationFailed(lines[-1].removeprefix("fastloop: error: "), rc, stderr)
        record = None
        if os.path.exists(record_path):
            with open(record_path) as f:
                record = json.load(f)
        if rc == 1 and record is None:  # the user's code raised before the fit began (importing, building)
            raise UserCodeError(user_error_text(stderr))
        if rc not in (0, 1) or record is None:
            last = [ln for ln in stderr.strip().splitlines() if ln.strip()][-1:] or [f"(exit status {rc})"]
            raise UserCodeError(f"the fit's process ended without a record (exit status {rc}): {last[0]}")
        return record, wall_s, stderr


def _fit_folder(out: str | None) -> tuple[str, bool]:
    """(the folder the fit writes its logs and checkpoints in, whether it is temporary)."""
    if out is None:
        return tempfile.mkdtemp(prefix="fastloop-fit-"), True
    folder = Path(out) / FIT_FILES
    if folder.exists() and (folder / FIT_MARK).exists():
        shutil.rmtree(folder)  # a previous fit's files: this fit's replace them
    folder.mkdir(parents=True, exist_ok=True)
    (folder / FIT_MARK).write_text("written by fastloop fit; a later fit in this --out replaces this folder\n")
    return str(folder), False


def user_error_text(stderr: str) -> str:
    """The user's error as the fit's process printed it (their frames and the last line), without
    the progress bar's and Lightning's lines before it.

    Example:
        >>> user_error_text("Epoch 0: 10%\\nTraceback (your code only; ...):\\n  File x\\nfastloop: error in your code")
        'Traceback (your code only; ...):\\n  File x\\nfastloop: error in your code'
    """
    start = stderr.rfind("Traceback (your code only")
    if start < 0:
        start = stderr.rfind("fastloop: error")
    return stderr[start:].strip() if start >= 0 else stderr.strip()[-2000:]


def run_fit(opts: FitOptions, out: str | None = None, timeout: float | None = None) -> tuple[dict, str | None]:
    """The whole fit in a fresh process, as a document (``kind: "fit"``), and the user's error
    text when their code raised (the document then holds the partial timeline, ``failed`` set).
    A speedup that breaks mid-fit falls back: the fit runs again without it, the record says why."""
    from fastloop.speedups.base import resolve

    specs = [s.spec for s in resolve(opts.speedups)]
    limit = timeout or (3 * opts.max_time + 600 if opts.max_time else 7 * 24 * 3600.0)
    fallbacks: list[dict] = []
    root, temporary = _fit_folder(out)
    try:
        while True:
            record, wall_s, stderr = run_fit_process(opts, ",".join(specs) or "none", root, limit)
            gone = record.get("speedup_failed")
            if not gone or gone["spec"] not in specs:
                break
            specs.remove(gone["spec"])
            fallbacks.append(
                {
                    "name": gone["name"],
                    "status": "fallback",
                    "reason": f"{gone['spec']} failed during the fit ({gone['error']}); the fit ran again without it",
                    "detail": "",
                }
            )
    finally:
        if temporary:
            shutil.rmtree(root, ignore_errors=True)
    doc = fit_result(record, wall_s, opts, fallbacks).to_dict()
    if temporary:
        doc["settings"]["root_dir"] = None
    return doc, (user_error_text(stderr) if doc.get("failed") else None)
