"""``workers``: DataLoader worker processes, the count chosen by measuring the loader.

Without an option, the loader's own rate (samples/s) is measured in the main process and with
1, 2, 4, ... workers (up to the CPU count, at least 4; about half a second each), and the fastest count is
used; when no count delivers faster than the main process alone (an in-memory TensorDataset,
for example, where worker IPC costs more than indexing), the speedup is skipped with the
measured rates as the reason. When the step's own rate is known (the ladder declares the best
configuration's measured steps/s in the run's ``RunInputs.step_rate``; ``fastloop run
--step-rate`` and ``callbacks(..., step_rate=)`` let a user declare it), the
decision weighs the loader against what the step consumes: the main process's share of each
training second that workers would save, ``demand x (1/rate_main - 1/rate_workers)``, must reach
10% (``WORKER_MIN_SAVING``), else the speedup is skipped with both figures (a GPT step that
consumes 500 samples/s from a loader that delivers 15,000/s in the main process cannot gain).
``workers:N`` sets the count without measuring. The rates, the step's demand and the predicted
saving are in the record's statistics (``loader_rates``, ``step_demand``, ``predicted_saving``)
and in the report.

The card (when it helps, when it hurts, what it costs, with measured figures): ``docs/speedups/workers.md``.
Changes the data pipeline; the dataset, sampler and collate function are kept as they are.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable
from dataclasses import dataclass

import torch
from torch.utils.data import DataLoader

from fastloop._torch_private import IndexSamplerAtLength, draw_loader_base_seed, loader_iterator
from fastloop.data import first_tensor, rebuild_loader
from fastloop.speedups.base import Context, Fallback, Skip, Speedup, register, valid_step_rate
from fastloop.speedups.ladder_traits import LadderTraits, SelfSized
from fastloop.speedups.options import Options, option
from fastloop.speedups.run import Run
from fastloop.speedups.torch_facts import rank_zero_value
from fastloop.streams import splits_between_workers

__all__ = [
    "PersistentWorkersLoader",
    "Workers",
    "apply_workers",
    "choose_num_workers",
    "UNMEASURED_RATE",
    "default_num_workers",
    "record_rates",
    "size_for_demand",
    "sizes_above_kept",
    "sizes_around",
    "loader_rate",
    "predicted_saving",
    "step_rate_hint",
]


def default_num_workers() -> int:
    """One worker per available core, leaving one for the main process (at least 1, at most 16)."""
    try:
        n = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - non-Linux
        n = os.cpu_count() or 1
    return max(1, min(16, n - 1))


class PersistentWorkersLoader(IndexSamplerAtLength, DataLoader):
    """A DataLoader with persistent workers that draws from its generator (the loader's own, else
    torch's global RNG) exactly what the loader without workers draws as Lightning iterates it: a
    fresh iterator takes one number from it each epoch (its workers' base seed) before the sampler
    shuffles, a persistent one only in its first epoch; and no index past the epoch's last is
    asked of the sampler (:class:`~fastloop._torch_private.IndexSamplerAtLength`: a seeded
    ``RandomSampler`` would draw a permutation more). Without either, every later epoch's shuffle
    (and, from the global RNG, its dropout masks) would differ from the loader the user wrote."""

    def __iter__(self):  # type: ignore[override]
        if loader_iterator(self) is not None:
            draw_loader_base_seed(self)
        return super().__iter__()


def apply_workers(loader: DataLoader, num_workers: int | None = None, prefetch_factor: int = 2) -> DataLoader:
    """The same loader with ``num_workers`` workers (default: from the CPU count), persistent;
    the batches and the global RNG stream are those of the original loader (for datasets
    without random per-sample transforms, whose randomness moves into the workers)."""
    n = default_num_workers() if num_workers is None else num_workers
    if n < 1:
        raise ValueError(f"num_workers must be >= 1, got {n}")
    return rebuild_loader(
        loader,
        num_workers=n,
        persistent_workers=True,
        prefetch_factor=prefetch_factor,
        loader_cls=PersistentWorkersLoader,
    )


def loader_rate(
    loader: DataLoader,
    num_workers: int,
    *,
    seconds: float = 0.5,
    max_batches: int = 64,
    max_seconds: float | None = None,
) -> float:
    """Samples per second that ``loader`` rebuilt with ``num_workers`` workers delivers at its
    steady rate (the loader alone, no training): the workers' start and the prefetch buffer they
    fill (``num_workers x 2`` batches) are drained first, then at least ``seconds`` and at least
    two batches per worker are timed (a JPEG loader's 16 workers each deliver a batch every few
    hundred milliseconds: a shorter window reads the start-up), up to ``max_seconds`` (4x
    ``seconds``) or ``max_batches``."""
    probe = (
        loader
        if num_workers == loader.num_workers == 0
        else rebuild_loader(
            loader, num_workers=num_workers, persistent_workers=False, **({"prefetch_factor": 2} if num_workers else {})
        )
    )
    longest = max_seconds if max_seconds is not None else 4 * seconds
    least = 2 * max(1, num_workers)
    it = iter(probe)
    try:
        for _ in range(max(1, 2 * num_workers)):  # start-up and the prefetch buffer: not the steady rate
            next(it)
        n = batches = 0
        t0 = time.perf_counter()
        for batch in it:
            t = first_tensor(batch)
            n += int(t.shape[0]) if t is not None and t.dim() else 1
            batches += 1
            elapsed = time.perf_counter() - t0
            if (elapsed > seconds and batches >= least) or elapsed > longest or batches >= max(max_batches, least):
                break
        elapsed = time.perf_counter() - t0
    except StopIteration:
        return float("nan")
    finally:
        del it
    return n / elapsed if elapsed > 0 and n else float("nan")


WORKER_GAIN = 1.25
"""Workers must deliver this many times the main process's rate to be used."""


def choose_num_workers(loader: DataLoader, *, most: int | None = None) -> tuple[int, dict[str, float]]:
    """Measure the loader at 0, 1, 2, 4, ... workers; the fastest count (0 unless it delivers at
    least 1.25x the main process's rate: the loader-alone rate leaves out the main process's
    cost of receiving batches from workers, measured on the H200 at about a fifth of a
    tutorial CIFAR step) and every measured rate. Within 5% of the fastest, fewer workers win."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - non-Linux
        cores = os.cpu_count() or 1
    most = most or min(16, max(4, cores))  # loaders that wait on storage gain beyond the core count
    counts = [0] + [c for c in (1, 2, 4, 8, 16) if c <= most]
    # measuring draws shuffles from the loader's generator (or torch's global RNG): put both
    # back, so training sees the same batches as without the measurement
    generators = [g for g in (loader.generator, getattr(loader.sampler, "generator", None)) if g is not None]
    states = [g.get_state() for g in generators]
    global_state = torch.get_rng_state()
    try:
        rates = {str(c): loader_rate(loader, c) for c in counts}
    finally:
        for g, st in zip(generators, states):
            g.set_state(st)
        torch.set_rng_state(global_state)
    valid = {int(k): v for k, v in rates.items() if v == v}  # drop NaN (the loader ran dry)
    if not valid:
        return 0, rates
    top = max(valid.values())
    best = min(c for c, v in valid.items() if v >= 0.95 * top)
    if best and valid.get(0) and valid[best] < WORKER_GAIN * valid[0]:
        best = 0
    return best, rates


WORKER_MIN_SAVING = 0.10
"""With the step's demand known, workers must save the main process this share of each second:
the prediction leaves out the worker processes' contention for the cores with the main process
(on an H200, CIFAR ResNet-18 B256 from memory: a predicted 5.8% saving with 16 workers trained
0.90x, 97% CI 0.79-1.04; benchmarks/HISTORY.md)."""


WORKER_HEADROOM = 1.5
"""With the step's demand known, the fewest workers whose steady rate alone is this many times the
demand are used, not the fastest count: every worker past that takes a core the training process
needs (its Python, the copy to the device, the kernels' launches) and adds nothing the step can
eat (on an H200 a U-Net chose 16 workers at 14,328 samples/s alone, trained at 3.8-4.1k/s with
28-33% data wait, and an expert's 8 trained as fast or faster; benchmarks/HISTORY.md)."""


def size_for_demand(rates: dict[str, float], demand: float, fastest: int) -> int:
    """The fewest measured worker counts (up to ``fastest``) whose rate is at least
    ``WORKER_HEADROOM`` x ``demand`` samples/s; ``fastest`` when none is.

    >>> size_for_demand({"0": 900.0, "2": 2_000.0, "4": 3_900.0, "8": 7_000.0, "16": 9_000.0}, 2_500.0, 16)
    4
    """
    enough = [int(k) for k, v in rates.items() if _measured(v) and int(k) <= fastest and v >= WORKER_HEADROOM * demand]
    return min(enough) if enough else fastest


def step_rate_hint(ctx: Context) -> float | None:
    """Steps per second the training step runs at when it never waits for data, if a driver
    measured it and declared it (:attr:`RunInputs.step_rate`: the ladder tells a feed
    candidate's runs); else None."""
    rate = ctx.inputs.step_rate
    return rate if valid_step_rate(rate) else None


def predicted_saving(demand: float, main_rate: float, workers_rate: float) -> float:
    """The share of each training second the main process stops spending on loading when a loader
    that delivers ``main_rate`` samples/s alone delivers ``workers_rate`` with workers, for a
    step that consumes ``demand`` samples/s (receiving from workers is part of ``workers_rate``).

    >>> round(predicted_saving(500.0, 15_000.0, 30_000.0), 4)
    0.0167
    """
    return max(0.0, demand * (1.0 / main_rate - 1.0 / workers_rate))


def _demand_says_no(batch_size: int | None, main: float | None, fast: float | None, n: int, ctx: Context) -> str | None:
    """With the step's rate known: why ``n`` workers cannot pay here (they would save the main process
    under ``WORKER_MIN_SAVING`` of its time), or None; the demand and the saving go into ``ctx.stats``."""
    steps_per_s = step_rate_hint(ctx)
    if steps_per_s is None or not batch_size or not main or not fast or main != main or fast != fast:
        return None
    demand = steps_per_s * batch_size
    saving = predicted_saving(demand, main, fast)
    ctx.stats["step_demand"], ctx.stats["predicted_saving"] = demand, saving
    if saving >= WORKER_MIN_SAVING:
        return None
    return (
        f"the step consumes {demand:,.0f} samples/s (measured in the configuration before): {n} workers "
        f"would save the main process {100 * saving:.1f}% of its time, under {100 * WORKER_MIN_SAVING:g}%"
    )


def _measured_detail(loader: DataLoader, n: int, ctx: Context) -> str:
    """The applied record's note on a measured count: the two rates and, when known, the predicted saving."""
    rates = ctx.stats.get("loader_rates") or {}
    main, fast = rates.get(str(loader.num_workers)), rates.get(str(n))
    how = "measured fastest" if ctx.stats.get("worker_fastest", n) == n else "sized for the step"
    out = (
        f" ({how}: {fast:,.0f} samples/s against {main:,.0f} with {loader.num_workers or 'none'}"
        if main and fast
        else f" ({how}"
    )
    if "predicted_saving" in ctx.stats:
        demand = ctx.stats["step_demand"]
        if main and demand > main:  # a share of the time above 100% says nothing: say how far behind it is
            out += (
                f"; the main process alone cannot keep up with the step's {demand:,.0f} samples/s "
                f"(loading would take {demand / main:.1f}x the step's time)"
            )
        else:
            out += (
                f"; predicted to save the main process {100 * ctx.stats['predicted_saving']:.0f}% of its time "
                f"at the step's {demand:,.0f} samples/s"
            )
    return out + ")"


@dataclass(frozen=True, kw_only=True)
class WorkersOptions(Options):
    """Options of ``workers``."""

    speedup = "workers"
    count: int | None = option(
        None, "loader worker processes; none: measure 0, 1, 2, 4, ... and use the fastest", low=1, high=256
    )


UNMEASURED_RATE = "the loader ran out of batches before a rate could be timed with this many workers"
"""Why a worker count's rate is null in ``loader_rates`` (under ``loader_rates_unmeasured``)."""


def _measured(rate: object) -> bool:
    """A rate the probe timed: a number, not NaN (the probe's "ran dry") nor null (read back)."""
    return isinstance(rate, (int, float)) and not isinstance(rate, bool) and rate == rate


def record_rates(stats: dict, rates: dict[str, float]) -> None:
    """Record the probe's ``rates`` in a run's statistics as strict JSON: a rate the probe could not
    time (NaN) is null in ``loader_rates``, and ``loader_rates_unmeasured`` says why, by count.

    Example:
        >>> stats = {}
        >>> record_rates(stats, {"0": 900.0, "8": float("nan")})
        >>> stats["loader_rates"], list(stats["loader_rates_unmeasured"])
        ({'0': 900.0, '8': None}, ['8'])
    """
    stats["loader_rates"] = {k: v if _measured(v) else None for k, v in rates.items()}
    unmeasured = {k: UNMEASURED_RATE for k, v in rates.items() if not _measured(v)}
    if unmeasured:
        stats["loader_rates_unmeasured"] = unmeasured


def _counts_above(stats: dict, own: int) -> list[int]:
    """The worker counts the probe measured (``stats["loader_rates"]``, a rate each) above ``own``."""
    return sorted(int(k) for k, v in (stats.get("loader_rates") or {}).items() if _measured(v) and int(k) > own)


def sizes_around(stats: dict) -> tuple[int | None, list[int]]:
    """The worker count a run's probe chose (``num_workers``), and the probe's measured counts next
    below and above it (more than the user's loader's own count): the sizes the ladder measures in
    the configuration.

    >>> sizes_around({"num_workers": 8, "loader_rates": {"0": 1.0, "2": 2.0, "4": 3.0, "8": 4.0}})
    (8, [4])
    """
    chosen = stats.get("num_workers")
    if not isinstance(chosen, int) or isinstance(chosen, bool):
        return None, []
    counts = _counts_above(stats, stats.get("loader_own_workers") or 0)  # fewer than the user's: not this speedup
    below, above = [c for c in counts if c < chosen], [c for c in counts if c > chosen]
    return chosen, ([below[-1]] if below else []) + ([above[0]] if above else [])


def sizes_above_kept(stats: dict) -> tuple[int | None, list[int]]:
    """The user's loader's count, kept by a probe alone, and the larger counts the probe measured.

    >>> sizes_above_kept({"loader_own_workers": 4, "loader_rates": {"0": 1.0, "4": 3.0, "8": 4.0, "16": 3.5}})
    (4, [8, 16])
    """
    own = stats.get("loader_own_workers")
    if not isinstance(own, int) or isinstance(own, bool):
        return None, []
    return own, _counts_above(stats, own)


@register
class Workers(Speedup):
    __doc__ = __doc__
    name = "workers"
    reads_in_workers = True
    ladder = LadderTraits(
        ablation_rank=7,
        feeds=True,
        in_default=True,
        sized=SelfSized(stat="num_workers", around=sizes_around, above_kept=sizes_above_kept),
    )
    changes = "data"
    feeds_validation = True
    order = 10

    options_type = WorkersOptions

    def apply(self, run: Run) -> None:
        run.change_loader(lambda loader: self.apply_loader(loader, run.ctx))

    def apply_loader(self, loader: Iterable, ctx: Context) -> Iterable:
        if ctx.inputs.batches_on_device:
            raise Skip(f"the data is already on the GPU ({ctx.inputs.batches_on_device})")
        if not isinstance(loader, DataLoader):
            raise Fallback(f"loader is a {type(loader).__name__}, not a torch DataLoader")
        if loader.num_workers >= default_num_workers():
            raise Skip(f"loader already has {loader.num_workers} workers")
        repeats = splits_between_workers(loader)
        if repeats:
            raise Skip(repeats)
        n = self.opts.count
        if n is None:  # measured on rank 0 only; every rank uses its result
            n, rates = rank_zero_value(lambda: choose_num_workers(loader))
            record_rates(ctx.stats, rates)
            ctx.stats["loader_own_workers"] = loader.num_workers
            shown = ", ".join(f"{k}: {v:,.0f}/s" for k, v in rates.items() if v == v)
            if n <= loader.num_workers:
                raise Skip(
                    f"measured loader rates (workers: samples/s) {shown}: no worker count delivers "
                    f"{WORKER_GAIN}x the rate of {loader.num_workers or 'the main process alone'}"
                )
            main, fast = rates.get(str(loader.num_workers)), rates.get(str(n))
            why = _demand_says_no(loader.batch_size, main, fast, n, ctx)
            if why:
                raise Skip(f"measured loader rates (workers: samples/s) {shown}; {why}")
            fastest = ctx.stats["worker_fastest"] = n
            if "step_demand" in ctx.stats:  # sized for the step it feeds, not for the loader alone
                n = max(loader.num_workers + 1, size_for_demand(rates, ctx.stats["step_demand"], fastest))
            ctx.stats["worker_sizing"] = f"{n} of the counts measured ({shown}): " + (
                f"the fewest that deliver {WORKER_HEADROOM}x the step's {ctx.stats['step_demand']:,.0f} samples/s "
                f"(the fastest, {fastest}, would take cores the training process needs)"
                if n < fastest
                else "the fastest"
                + (
                    f" ({WORKER_HEADROOM}x the step's {ctx.stats['step_demand']:,.0f} samples/s needs it)"
                    if "step_demand" in ctx.stats
                    else " (the step's demand was not measured yet)"
                )
            )
        ctx.stats["num_workers"], ctx.stats["loader_own_workers"] = n, loader.num_workers
        measured = "" if self.opts.count is not None else _measured_detail(loader, n, ctx)
        ctx.describe(self.name, f"{n} worker processes{measured}")
        return apply_workers(loader, int(n))
