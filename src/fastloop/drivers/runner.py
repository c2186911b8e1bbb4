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
from fastloop.drivers.config import RunConfig
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
from fastloop.measure.run_result import RunInputsRecord, RunResult, Throughput, Timings, TrainerSettings
from fastloop.speedups.base import Record, RunInputs, Speedup

__all__ = [
    "measure_configuration",
    "measured_configuration",
    "run_configuration",
    "steadiness_warning",
    "weights_digest",
]


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
    """:func:`measure_configuration` of the configuration these keywords make (a
    :class:`~fastloop.drivers.config.RunConfig`, which checks them), as its JSON document.

    Args:
        target: ``FILE.py:FUNCTION``, ``package.module:FUNCTION`` or a recipe's short name.
        speedups: the speedups (``"bf16,compile"``, a list of names, specs or speedup objects; None
            or ``"none"``: the baseline).
        steps, warmup, device, target_kwargs, quiet, steady_warmup, devices, strategy, measure_s,
            step_rate, compile_cache, seed: the fields of
            :class:`~fastloop.drivers.config.RunConfig`, which says what each means.

    Returns:
        The JSON contract's measured configuration (:meth:`RunResult.to_dict`).
    """
    config = RunConfig(
        target=target,
        speedups=speedups,
        steps=steps,
        warmup=warmup,
        device=device,
        target_kwargs=target_kwargs,
        quiet=quiet,
        steady_warmup=steady_warmup,
        devices=devices,
        strategy=strategy,
        measure_s=measure_s,
        step_rate=step_rate,
        compile_cache=compile_cache,
        seed=seed,
    )
    return measure_configuration(config).to_dict()


def measure_configuration(config: RunConfig) -> RunResult:
    """Build the target, attach one callback per speedup plus the measurer, train, report.

    ``config.compile_cache``: compiles read and write the project's compile cache (False: cold,
    in a fresh directory; :class:`~fastloop.speedups.base.RunInputs`).

    ``config.seed``: a paired run (:mod:`fastloop.drivers.paired_run`): every generator seeded
    with it before the target is built, and the result's ``paired`` holds the initial weights'
    digest, each step's batch digest and how the dataset's reads vary, for the check of a pick
    against the baseline to compare step by step.

    ``config.step_rate``: steps/s the step reaches without data wait, when a driver measured it:
    declared to the run's speedups (:class:`~fastloop.speedups.base.RunInputs`; ``workers``
    sizes itself to it).

    ``config.steady_warmup``: extend the warm-up until step times are steady (reported as
    ``warmup_extended_steps``); off, exactly ``warmup + steps`` steps are trained.

    ``config.measure_s``: measure fewer than ``steps`` steps (at least 10) when the steady
    warm-up's step time says ``steps`` would take longer than this many seconds
    (``steps_planned`` keeps what was asked). A ladder uses it: a slow fp32 baseline needs no 30
    steps for a precise mean, and its runs dominate the ladder's wall time.

    ``config.devices`` > 1 (or a ``strategy``): the ranks are started by Lightning's own
    DDP/FSDP strategy (its launcher runs this command once per rank); every rank measures itself
    and the result (returned on every rank; ``global_rank`` says which) holds ``world_size`` and
    the ``ranks``, its throughput summed over ranks at the slowest rank's pace.

    Runtime fallback: when a speedup fails while training (a compile or capture error, a CUDA
    graph whose output was overwritten, ...), the run is repeated from a freshly built target
    without it, and its record says ``fallback`` with the first line of the cause. The model
    trained is then exactly the one a run without that speedup trains.
    """
    ensure_cuda_queues()  # before CUDA starts: a data pipeline on its own streams must not queue behind the step
    dev = resolve_device(config.device)
    if config.strategy == "fsdp" and dev.type != "cuda":
        raise FastloopError("--strategy fsdp needs CUDA devices (use ddp on a CPU)")
    if dev.type == "cuda" and config.devices > torch.cuda.device_count():
        raise FastloopError(
            f"--devices {config.devices} asked for, but this machine has {torch.cuda.device_count()} GPU(s)"
        )
    chosen: list[Speedup] = list(config.speedups)
    order = [s.name for s in chosen]
    fallbacks: list[Record] = []
    inputs = RunInputs(step_rate=config.step_rate, compile_cache=config.compile_cache)
    while True:
        flags = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32, torch.backends.cudnn.benchmark)
        paired = PairedRun(config.seed) if config.seed is not None else None  # a fresh one for a run repeated
        if paired is not None:
            paired.seed_now()
        try:
            result = _run_once(config, chosen, dev, fallbacks, inputs, paired)
        except _SpeedupFailed as failed:
            torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32, torch.backends.cudnn.benchmark = (
                flags
            )
            torch.compiler.reset()
            if dev.type == "cuda":
                torch.cuda.empty_cache()
            chosen = _without(chosen, failed, fallbacks)
            continue
        result.speedups.sort(key=lambda r: order.index(r.name) if r.name in order else len(order))
        return result


def _without(chosen: list[Speedup], failed: _SpeedupFailed, fallbacks: list[Record]) -> list[Speedup]:
    """The speedups to repeat the run with after ``failed`` (its milder variant, or none), its
    fallback record kept in ``fallbacks``."""
    variant = failed.speedup.fallback_variant(failed.err)
    then = f"as {variant.spec}" if variant is not None else "without it"
    fallbacks[:] = [r for r in fallbacks if r.name != failed.speedup.name]
    fallbacks.append(
        Record(
            failed.speedup.name,
            "fallback",
            f"{failed.speedup.spec} failed while training ({_first_line(failed.err)}); the run was repeated {then}",
        )
    )
    return [variant if s is failed.speedup else s for s in chosen if s is not failed.speedup or variant]


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


def _per_rank(result: RunResult, ranks: list[dict], world_size: int, strategy: str) -> None:
    """The JSON contract's multi-rank part: each rank's figures, the slowest rank, and the
    throughput of all ranks together (items summed, at the slowest rank's mean step)."""
    slowest = max(ranks, key=lambda r: r["step_s"]["mean"])
    result.world_size = world_size
    result.strategy = strategy
    result.ranks = ranks
    result.slowest_rank = slowest["rank"]
    items = sum(r["items_per_step"] or 0 for r in ranks)
    result.throughput = Throughput(
        value=items / slowest["step_s"]["mean"] if slowest["step_s"]["mean"] else None,
        unit=result.throughput.unit,
        basis="items per step summed over the ranks / the slowest rank's mean step time",
    )
    result.per_rank_throughput = [r["throughput"] for r in ranks]
    first = [(s["name"], s["status"], s["reason"]) for s in ranks[0]["speedups"]]
    result.speedups_agree_across_ranks = all(
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


def _warn(result: RunResult, measure: MeasureCallback, scheduler_notes: list[str], pbar: list[str]) -> None:
    """The run's warnings: manual optimization, steps that returned None, schedulers, prog_bar."""
    if measure.manual:
        result.loss_definition = "manual optimization: the sum of the losses passed to manual_backward in each step"
    if measure.none_steps:
        result.warnings.append(
            f"training_step returned None in {measure.none_steps} of {len(result.losses)} steps "
            f"(Lightning skipped their optimizer step; their loss is null)"
        )
    result.warnings += scheduler_notes
    if pbar:
        result.warnings.append(prog_bar_warning(pbar))


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


def _timings(measure: MeasureCallback, build_s: float, t_fit: float, fit_s: float, digest_s: float) -> Timings:
    """Where a run's wall time goes (a ladder pays it per process): building the target, and the
    whole fit (Trainer setup, warm-up, compile, measured and profiled steps, teardown)."""
    started, ended = measure.train_start_t, measure.train_end_t
    return Timings(
        build_s=build_s,
        fit_s=fit_s,
        pid=os.getpid(),
        digest_s=digest_s,
        setup_s=started - t_fit if started else None,  # fit -> on_train_start
        train_s=ended - started if ended and started else None,
        teardown_s=t_fit + fit_s - ended if ended else None,
    )


def _run_once(
    config: RunConfig,
    chosen: list[Speedup],
    dev: torch.device,
    fallbacks: list[Record],
    inputs: RunInputs,
    paired: PairedRun | None = None,
) -> RunResult:
    target, devices, strategy = config.target, config.devices, config.strategy
    t_build = time.perf_counter()
    module, data, user_trainer = build_target(target, **(config.target_kwargs or {}))
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
    cbs = [SpeedupCallback(s, inputs=inputs) for s in in_training]
    measure = MeasureCallback(
        warmup=config.warmup,
        count_flops=True,
        steady=config.steady_warmup,
        steps=config.steps,
        measure_s=config.measure_s,
        profile_steps=profile_steps() if dev.type == "cuda" else 0,
    )
    monitored = _MonitoredSchedulers()
    gather = _GatherRanks(measure, cbs)
    distributed = config.distributed
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
    _fit(trainer, module, data, target, chosen, config.quiet, distributed=distributed)
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
    result = measured_configuration(measure, records, dev, unit, extra, conv_tf32)
    t_digest = time.perf_counter()
    result.weights_digest = weights_digest(module)
    result.timings = _timings(measure, build_s, t_fit, fit_s, time.perf_counter() - t_digest)
    if paired is not None:
        result.paired = paired.result()
    result.data_checks = data_checks(result.batch_shapes)  # what the batches' shapes rule out
    result.built_checks = {**loader_checks(getattr(trainer, "train_dataloader", None)), **model_checks}
    result.model_checks = {**result.data_checks, **result.built_checks}
    result.run_inputs = RunInputsRecord(step_rate=inputs.step_rate, compile_cache=inputs.compile_cache)
    result.trainer_settings = TrainerSettings(
        used={k: repr(v) for k, v in user_trainer.items()},
        callbacks=[type(c).__name__ for c in user_callbacks],
        left_out=left_out,
    )
    _warn(result, measure, monitored.notes(trainer) + length.notes(), pbar)
    result.global_rank = trainer.global_rank
    result.world_size = trainer.world_size
    if gather.ranks:
        _per_rank(result, gather.ranks, trainer.world_size, strategy or "ddp")
    bad = next((i for i, v in enumerate(result.losses) if v is not None and not math.isfinite(v)), None)
    if bad is not None:
        result.loss_finite = False
        result.warnings.append(
            f"the loss was not finite ({result.losses[bad]}) from step {bad}: "
            f"the timings of a diverged run say nothing about a real one"
        )
    return result
