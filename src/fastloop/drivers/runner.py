"""Measure one configuration: a target trained N steps through a Lightning Trainer with
exactly the given speedups, returned as the JSON contract's "measured configuration".

Example:
    >>> from fastloop.drivers.runner import run_configuration
    >>> doc = run_configuration("tests/targets.py:tiny_mlp", "none", steps=5, warmup=1, device="cpu")  # doctest: +SKIP
    >>> doc["steps"], doc["speedups"]  # doctest: +SKIP
    (5, [])
"""

from __future__ import annotations

import contextlib
import io
import logging
import math
import os
import sys
import time
import warnings
from datetime import timedelta
from typing import Any

import torch
from torch.utils.data import DataLoader

from fastloop._compat import Callback, DDPStrategy, FSDPStrategy, SingleDeviceStrategy, Trainer
from fastloop._torch_private import CONV_TYPES
from fastloop.adapters._lightning_private import on_a_failed_rank
from fastloop.adapters.lightning import SpeedupCallback
from fastloop.cuda_env import ensure_cuda_queues
from fastloop.device import resolve_device
from fastloop.drivers.exits import leave_now
from fastloop.drivers.fit_share import fit_parts
from fastloop.drivers.paired_run import PairedRun
from fastloop.drivers.run_document import (
    data_checks,
    describe_dataset,
    loader_checks,
    measured_configuration,
    model_checks_of,
    profile_steps,
    prog_bar_warning,
    steadiness_warning,
    weights_digest,
)
from fastloop.drivers.silent_logger import SilentLogger
from fastloop.drivers.targets import TrainingLength, build_target, check_trainer_kwargs
from fastloop.errors import FastloopError, UserCodeError
from fastloop.lightning import records_of
from fastloop.measure.callback import FeedClock, MeasureCallback
from fastloop.speedups.base import Record, RunInputs, resolve, valid_step_rate

__all__ = ["measured_configuration", "run_configuration", "steadiness_warning", "weights_digest"]


class _MonitoredSchedulers(Callback):
    """Validation is off while measuring. A scheduler that monitors a metric only validation
    logs (ReduceLROnPlateau on ``val_loss``) would end the fit with Lightning's error; it is held
    instead (``strict=False``: not stepped while the metric is missing), and the report says so."""

    def __init__(self) -> None:
        self.held: list[str] = []

    def on_train_start(self, trainer: Trainer, pl_module: Any) -> None:
        for config in trainer.lr_scheduler_configs:
            if config.monitor and config.strict:
                config.strict = False
                self.held.append(config.monitor)

    def notes(self, trainer: Trainer) -> list[str]:
        missing = [m for m in self.held if m not in trainer.callback_metrics]
        return [
            f"the LR scheduler monitors {m!r}, which this run never logged (fastloop measures with validation "
            f"off): the scheduler was not stepped; the step times are unaffected"
            for m in missing
        ]


class _SpeedupFailed(Exception):
    """A speedup failed while the run was under way (it claimed the error)."""

    def __init__(self, speedup: Any, err: BaseException) -> None:
        super().__init__(str(err))
        self.speedup, self.err = speedup, err


def _first_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0] if text else ''}"[:300]


def run_configuration(
    target: str,
    speedups: str | list | None,
    *,
    steps: int = 30,
    warmup: int = 5,
    device: str = "auto",
    target_kwargs: dict[str, Any] | None = None,
    quiet: bool = True,
    steady_warmup: bool = True,
    devices: int = 1,
    strategy: str | None = None,
    measure_s: float | None = None,
    step_rate: float | None = None,
    compile_cache: bool = True,
    seed: int | None = None,
) -> dict:
    """Build the target, attach one callback per speedup plus the measurer, train, report.

    ``compile_cache``: compiles read and write the project's compile cache (False: cold, in a
    fresh directory; :class:`~fastloop.speedups.base.RunInputs`).

    ``seed``: a paired run (:mod:`fastloop.drivers.paired_run`): every generator seeded with it
    before the target is built, and the document's ``"paired"`` section holds the initial
    weights' digest, each step's batch digest and how the dataset's reads vary, for the check of
    a pick against the baseline to compare step by step.

    ``step_rate``: steps/s the step reaches without data wait, when a driver measured it: declared
    to the run's speedups (:class:`~fastloop.speedups.base.RunInputs`; ``workers`` sizes itself
    to it).

    ``steady_warmup``: extend the warm-up until step times are steady (reported as
    ``warmup_extended_steps``); off, exactly ``warmup + steps`` steps are trained.

    ``measure_s``: measure fewer than ``steps`` steps (at least 10) when the steady warm-up's
    step time says ``steps`` would take longer than this many seconds (``steps_planned`` in the
    document keeps what was asked). A ladder uses it: a slow fp32 baseline needs no 30 steps
    for a precise mean, and its runs dominate the ladder's wall time.

    ``devices`` > 1 (or a ``strategy``): the ranks are started by Lightning's own DDP/FSDP
    strategy (its launcher runs this command once per rank); every rank measures itself and
    the document (returned on every rank; ``global_rank`` says which) holds ``world_size`` and
    a ``ranks`` section, its throughput summed over ranks at the slowest rank's pace.

    Runtime fallback: when a speedup fails while training (a compile or capture error, a CUDA
    graph whose output was overwritten, ...), the run is repeated from a freshly built target
    without it, and its record says ``fallback`` with the first line of the cause. The model
    trained is then exactly the one a run without that speedup trains.
    """
    if not isinstance(steps, int) or steps < 1:
        raise FastloopError(f"--steps must be >= 1, got {steps}")
    if not isinstance(warmup, int) or warmup < 0:
        raise FastloopError(f"--warmup must be >= 0, got {warmup}")
    if isinstance(devices, bool) or not isinstance(devices, int) or devices < 1:
        raise FastloopError(f"--devices must be an integer >= 1, got {devices!r}")
    if measure_s is not None and (isinstance(measure_s, bool) or not measure_s > 0):
        raise FastloopError(f"--measure-s must be a number of seconds > 0, got {measure_s!r}")
    if strategy not in (None, "ddp", "fsdp"):
        raise FastloopError(f"--strategy must be ddp or fsdp, got {strategy!r}")
    if step_rate is not None and not valid_step_rate(step_rate):
        raise FastloopError(f"--step-rate must be steps per second, a number > 0, got {step_rate!r}")
    ensure_cuda_queues()  # before CUDA starts: a data pipeline on its own streams must not queue behind the step
    dev = resolve_device(device)
    if strategy == "fsdp" and dev.type != "cuda":
        raise FastloopError("--strategy fsdp needs CUDA devices (use ddp on a CPU)")
    if dev.type == "cuda" and devices > torch.cuda.device_count():
        raise FastloopError(f"--devices {devices} asked for, but this machine has {torch.cuda.device_count()} GPU(s)")
    chosen = resolve(speedups)
    order = [s.name for s in chosen]
    fallbacks: list[Record] = []
    while True:
        flags = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32, torch.backends.cudnn.benchmark)
        paired = PairedRun(seed) if seed is not None else None  # a fresh one for a run repeated after a fallback
        if paired is not None:
            paired.seed_now()
        try:
            doc = _run_once(
                target,
                chosen,
                dev,
                steps,
                warmup,
                target_kwargs,
                quiet,
                fallbacks,
                steady_warmup,
                devices,
                strategy,
                measure_s,
                RunInputs(step_rate=step_rate, compile_cache=compile_cache),
                paired,
            )
        except _SpeedupFailed as failed:
            torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32, torch.backends.cudnn.benchmark = (
                flags
            )
            torch.compiler.reset()
            if dev.type == "cuda":
                torch.cuda.empty_cache()
            variant = failed.speedup.fallback_variant(failed.err)
            chosen = [variant if s is failed.speedup else s for s in chosen if s is not failed.speedup or variant]
            then = f"as {variant.spec}" if variant is not None else "without it"
            fallbacks[:] = [r for r in fallbacks if r.name != failed.speedup.name]
            fallbacks.append(
                Record(
                    failed.speedup.name,
                    "fallback",
                    f"{failed.speedup.spec} failed while training ({_first_line(failed.err)}); "
                    f"the run was repeated {then}",
                )
            )
            continue
        doc["speedups"].sort(key=lambda r: order.index(r["name"]) if r["name"] in order else len(order))
        return doc


class _RunStrategy(SingleDeviceStrategy):
    """Lightning's single-device strategy for a measured run on one GPU, without its end-of-fit
    move of the model and the optimizer state to the CPU and its garbage collection and cache
    release: 1.3-1.6 s of every GPT-124M run on the H200 (`git show d4c3d80:benchmarks/HISTORY.md`,
    the phase timings), paid per process by a ladder,
    for memory the run's process gives back when it ends anyway. The weights digest reads the
    weights where they are."""

    def teardown(self) -> None:
        self.precision_plugin.teardown()
        self.checkpoint_io.teardown()


def _strategy(kind: str | None, dev: torch.device) -> Any:
    """Lightning's own strategy for ``--strategy`` (never a home-made one). A short process-group
    timeout: a rank stuck in a collective fails in minutes, not the default half hour."""
    timeout = timedelta(seconds=float(os.environ.get("FASTLOOP_DIST_TIMEOUT", 300)))
    if kind == "fsdp":
        return FSDPStrategy(timeout=timeout)
    return DDPStrategy(process_group_backend="nccl" if dev.type == "cuda" else "gloo", timeout=timeout)


class _GatherRanks(Callback):
    """At the end of training, every rank's measurement to every rank (``all_gather_object``)."""

    def __init__(self, measure: MeasureCallback, cbs: list) -> None:
        self.measure, self.cbs = measure, cbs
        self.ranks: list[dict] | None = None

    def on_train_end(self, trainer: Trainer, pl_module: Any) -> None:
        if trainer.world_size <= 1 or not torch.distributed.is_initialized():
            return
        stats = self.measure.result()
        summary = stats.summary()
        mine = {
            "rank": trainer.global_rank,
            "steps": stats.steps,
            "step_s": summary,
            "step_s_all": stats.step_s,
            "wait_s_all": stats.wait_s,
            "data_wait_frac": stats.data_wait_frac,
            "items_per_step": self.measure.mean_items_per_step(),
            "peak_mem_bytes": self.measure.peak_mem_bytes,
            "throughput": (self.measure.mean_items_per_step() or 0) / summary["mean"] if summary["mean"] else None,
            "speedups": [c.record.to_dict() for c in self.cbs],
        }
        gathered: list = [None] * trainer.world_size
        torch.distributed.all_gather_object(gathered, mine)
        self.ranks = sorted(gathered, key=lambda r: r["rank"])


def _per_rank(doc: dict, ranks: list[dict], world_size: int, strategy: str) -> None:
    """The JSON contract's multi-rank part: each rank's figures, the slowest rank, and the
    throughput of all ranks together (items summed, at the slowest rank's mean step)."""
    slowest = max(ranks, key=lambda r: r["step_s"]["mean"])
    doc["world_size"] = world_size
    doc["strategy"] = strategy
    doc["ranks"] = ranks
    doc["slowest_rank"] = slowest["rank"]
    items = sum(r["items_per_step"] or 0 for r in ranks)
    doc["throughput"] = {
        "value": items / slowest["step_s"]["mean"] if slowest["step_s"]["mean"] else None,
        "unit": doc["throughput"]["unit"],
        "basis": "items per step summed over the ranks / the slowest rank's mean step time",
    }
    doc["per_rank_throughput"] = [r["throughput"] for r in ranks]
    first = [(s["name"], s["status"], s["reason"]) for s in ranks[0]["speedups"]]
    doc["speedups_agree_across_ranks"] = all(
        [(s["name"], s["status"], s["reason"]) for s in r["speedups"]] == first for r in ranks
    )


def _leave_after_a_failed_rank() -> None:
    """Rank 0, when a rank it started failed (its error is printed above): status 1, at once."""
    sys.stderr.write("fastloop: this rank stopped because another rank failed (its error is above)\n")
    leave_now(1)


def _trainer(
    user_trainer: dict, callbacks: list, dev: torch.device, devices: int, strategy: str | None, distributed: bool
) -> Trainer:
    """The run's Trainer: the user's own settings (gradient clipping, accumulation, precision, ...)
    and fastloop's measurement: no end of its own (the measurement stops the fit), no validation,
    logs, checkpoints or progress bar."""
    return Trainer(
        **user_trainer,
        accelerator="gpu" if dev.type == "cuda" else "cpu",
        devices=devices,
        max_steps=-1,
        max_epochs=-1,
        limit_val_batches=0,
        num_sanity_val_steps=0,
        logger=SilentLogger(),
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=callbacks,
        profiler=FeedClock(),
        **(
            {"strategy": _strategy(strategy, dev)}
            if distributed
            else {"strategy": _RunStrategy(device=dev)}
            if dev.type == "cuda"
            else {}
        ),
    )


def _fit(
    trainer: Trainer, module: Any, data: Any, target: str, chosen: list, quiet: bool, *, distributed: bool = False
) -> None:
    """``trainer.fit``, its failures sorted: Ctrl-C, fastloop's own errors, a speedup that claims the
    error (it falls back), or the user's code. ``distributed``: rank 0 ends with status 1 when a
    rank it started fails (:func:`~fastloop.adapters._lightning_private.on_a_failed_rank`)."""
    ctx = contextlib.redirect_stdout(io.StringIO()) if quiet else contextlib.nullcontext()
    with ctx, warnings.catch_warnings(), contextlib.ExitStack() as ranks:
        if distributed:
            ranks.callback(on_a_failed_rank(_leave_after_a_failed_rank))
        warnings.simplefilter("ignore")
        try:
            if isinstance(data, DataLoader):
                trainer.fit(module, train_dataloaders=data)
            else:
                trainer.fit(module, datamodule=data)
        except SystemExit:
            # Lightning turns Ctrl-C into a graceful shutdown and then exit(1)
            if trainer.interrupted:
                raise KeyboardInterrupt from None
            raise
        except (FastloopError, KeyboardInterrupt):
            raise
        except Exception as err:
            culprit = next((s for s in reversed(chosen) if s.claims(err)), None)
            if culprit is not None:
                raise _SpeedupFailed(culprit, err) from err
            raise UserCodeError(f"while training {target}") from err
    if trainer.interrupted:
        raise KeyboardInterrupt


def _warn(doc: dict, measure: MeasureCallback, scheduler_notes: list[str], pbar: list[str]) -> None:
    """The run's warnings: manual optimization, steps that returned None, schedulers, prog_bar."""
    if measure.manual:
        doc["loss_definition"] = "manual optimization: the sum of the losses passed to manual_backward in each step"
    if measure.none_steps:
        doc["warnings"].append(
            f"training_step returned None in {measure.none_steps} of {len(doc['losses'])} steps "
            f"(Lightning skipped their optimizer step; their loss is null)"
        )
    doc["warnings"] += scheduler_notes
    if pbar:
        doc["warnings"].append(prog_bar_warning(pbar))


def _records(
    trainer: Trainer, cbs: list[SpeedupCallback], fallbacks: list[Record], prepared: list[Record], extra: dict
) -> list[Record]:
    """Every requested speedup's record (a variant that ran instead keeps its fallback record);
    the counters the speedups reported go into ``extra``."""
    fell_back = {r.name for r in fallbacks}
    records = [r for r in records_of(trainer) if r.name not in fell_back] + fallbacks + prepared
    for cb in cbs:
        if cb.ctx is not None:
            extra.update({k: v for k, v in cb.ctx.stats.items() if isinstance(v, (int, float, str, dict))})
        if cb.record.status == "applied":
            extra.update(cb.speedup.run_stats())
    return records


def _timings(measure: MeasureCallback, build_s: float, t_fit: float, fit_s: float, digest_s: float) -> dict:
    """Where a run's wall time goes (a ladder pays it per process): building the target, and the
    whole fit (Trainer setup, warm-up, compile, measured and profiled steps, teardown)."""
    return {
        "build_s": build_s,
        "fit_s": fit_s,
        "pid": os.getpid(),
        "digest_s": digest_s,
        "setup_s": measure.train_start_t - t_fit if measure.train_start_t else None,  # fit -> on_train_start
        "train_s": (measure.train_end_t - measure.train_start_t)
        if measure.train_end_t and measure.train_start_t
        else None,
        "teardown_s": (t_fit + fit_s - measure.train_end_t) if measure.train_end_t else None,
    }


def _run_once(
    target: str,
    chosen: list,
    dev: torch.device,
    steps: int,
    warmup: int,
    target_kwargs: dict[str, Any] | None,
    quiet: bool,
    fallbacks: list[Record],
    steady_warmup: bool,
    devices: int = 1,
    strategy: str | None = None,
    measure_s: float | None = None,
    inputs: RunInputs | None = None,
    paired: PairedRun | None = None,
) -> dict:

    t_build = time.perf_counter()
    module, data, user_trainer = build_target(target, **(target_kwargs or {}))
    extra: dict = {"fit_parts": fit_parts(module, data, user_trainer)}  # what the fit has beside its steps
    length = TrainingLength.asked(user_trainer)  # what configure_optimizers sees (estimated_stepping_batches)
    user_trainer, left_out = check_trainer_kwargs(target, user_trainer)
    build_s = time.perf_counter() - t_build
    model_checks = model_checks_of(module)
    prepared: list[Record] = []
    in_training = [s for s in chosen if not s.prepares_run]
    for s in chosen:
        if s.prepares_run:
            data, record, stats = s.prepare_run(module, data, in_training, dev, precision=user_trainer.get("precision"))
            prepared.append(record)
            extra.update(stats)
    for name in ("lightning.pytorch", "pytorch_lightning", "lightning.fabric", "lightning_fabric"):
        logging.getLogger(name).setLevel(logging.ERROR)
    inputs = inputs or RunInputs()
    cbs = [SpeedupCallback(s, inputs=inputs) for s in in_training]
    measure = MeasureCallback(
        warmup=warmup,
        count_flops=True,
        steady=steady_warmup,
        steps=steps,
        measure_s=measure_s,
        profile_steps=profile_steps() if dev.type == "cuda" else 0,
    )
    monitored = _MonitoredSchedulers()
    gather = _GatherRanks(measure, cbs)
    distributed = devices > 1 or strategy is not None
    user_callbacks = list(user_trainer.pop("callbacks", None) or [])
    first = [paired] if paired is not None else []  # before any speedup's setup: it reads the initial weights
    trainer = _trainer(
        user_trainer,
        [*first, length, *user_callbacks, *cbs, measure, monitored, gather],
        dev,
        devices,
        strategy,
        distributed,
    )
    t_fit = time.perf_counter()
    _fit(trainer, module, data, target, chosen, quiet, distributed=distributed)
    fit_s = time.perf_counter() - t_fit
    pbar = sorted(trainer.progress_bar_metrics) if dev.type == "cuda" else []
    if pbar:
        extra["prog_bar_keys"] = pbar
    if not measure.measured_steps:
        raise (
            UserCodeError(f"no step was measured: {length.notes()[0]}; the warm-up alone needs more")
            if length.stopped
            else UserCodeError(
                f"no step was trained: the training loader of {target} yielded no batches "
                f"(an empty dataset, or batch_size larger than the dataset with drop_last=True?)"
            )
        )
    described = describe_dataset(getattr(trainer, "train_dataloader", None))
    if described:
        extra["dataset"] = described
    records = _records(trainer, cbs, fallbacks, prepared, extra)
    unit = getattr(module, "throughput_unit", "samples")
    conv_tf32 = bool(torch.backends.cudnn.allow_tf32) and any(isinstance(m, CONV_TYPES) for m in module.modules())
    doc = measured_configuration(measure, records, dev, unit, extra, conv_tf32)
    t_digest = time.perf_counter()
    doc["weights_digest"] = weights_digest(module)
    doc["timings"] = _timings(measure, build_s, t_fit, fit_s, time.perf_counter() - t_digest)
    if paired is not None:
        doc["paired"] = paired.result()
    doc["data_checks"] = data_checks(doc.get("batch_shapes"))  # what the batches' shapes rule out
    doc["built_checks"] = {**loader_checks(getattr(trainer, "train_dataloader", None)), **model_checks}
    doc["model_checks"] = {**doc["data_checks"], **doc["built_checks"]}
    doc["run_inputs"] = {"step_rate": inputs.step_rate, "compile_cache": inputs.compile_cache}  # told to the speedups
    doc["trainer_settings"] = {
        "used": {k: repr(v) for k, v in user_trainer.items()},
        "callbacks": [type(c).__name__ for c in user_callbacks],
        "left_out": left_out,
    }
    _warn(doc, measure, monitored.notes(trainer) + length.notes(), pbar)
    doc["global_rank"] = trainer.global_rank
    doc["world_size"] = trainer.world_size
    if gather.ranks:
        _per_rank(doc, gather.ranks, trainer.world_size, strategy or "ddp")
    bad = next((i for i, v in enumerate(doc["losses"]) if v is not None and not math.isfinite(v)), None)
    if bad is not None:
        doc["loss_finite"] = False
        doc["warnings"].append(
            f"the loss was not finite ({doc['losses'][bad]}) from step {bad}: "
            f"the timings of a diverged run say nothing about a real one"
        )
    return doc
