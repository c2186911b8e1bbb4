"""``batch_size``: search the batch size, then train at it. The search core lives here with
its speedup (``fastloop batch-size`` calls it).

Batch-size search that survives OOM, torch.compile and DDP.

Exponential growth from the current size, then bisection, finds the largest batch that fits
(``max_fitting``); a margin (default 0.9) keeps the chosen size clear of the edge, since a real
run fragments memory more than a few trial steps do. With ``objective="throughput"`` (default)
the size with the best measured samples/s among those under the margin is chosen: bigger is
not always faster.

- OOM: CUDA, cuDNN and CPU-allocator out-of-memory errors are recognised (:func:`is_oom`), and
  only those; anything else propagates unchanged. After an OOM everything the failed step held
  (outputs, gradients, the trial optimizer and its state, cached blocks) is freed first.
- State: trials run on the module with a throwaway optimizer from ``configure_optimizers``;
  the module's weights and buffers, the RNG states, and any Trainer optimizer/scheduler are
  bitwise as before afterwards (checked, reported as ``restored``). No files are written.
- compile: the search runs eagerly and compiling happens once afterwards, so no trial
  recompiles; the search's wall time is reported.
- DDP: after every trial the ranks all-reduce "did anyone OOM" and the slowest step time, so
  they take the same branch and never hang.

Example:
    >>> is_oom(RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB"))
    True
    >>> is_oom(RuntimeError("mat1 and mat2 shapes cannot be multiplied"))
    False

The card (when it helps, when it hurts, what it costs, with measured figures): ``docs/speedups/batch_size.md``.
Changes the data pipeline (the target's ``batch_size``). Applied by the runner before training.
"""

from __future__ import annotations

import contextlib
import gc
import inspect
import time
from collections.abc import Callable
from typing import Any

import torch
from torch.utils.data import DataLoader

from fastloop._compat import LightningDataModule, LightningModule
from fastloop.data import WHOLE_BATCHES, first_tensor, rebuild_loader, to_device, yields_whole_batches
from fastloop.device import resolve_device
from fastloop.errors import FastloopError
from fastloop.speedups.base import Context, Record, Skip, Speedup, register, resolve
from fastloop.speedups.batch_size.rule import check_search, choose_batch_size, largest_fitting
from fastloop.speedups.batch_size.state import (  # noqa: F401  (set_batch_size: public here too)
    NOWHERE,
    current_size,
    restore_rng_state,
    restore_state,
    rng_states,
    set_batch_size,
    size_holders,
    snapshot_state,
    state_digest,
    trial_optimizer_conf,
)
from fastloop.speedups.ladder_traits import LadderTraits
from fastloop.speedups.run import Run

__all__ = ["BatchSize", "is_oom", "search_batch_size", "set_batch_size"]

_OOM_MARKERS = (
    "cuda out of memory",  # torch.cuda.OutOfMemoryError
    "cudnn_status_alloc_failed",  # cuDNN workspace allocation
    # cuDNN out of memory in disguise
    "cudnn_status_not_supported. this error may appear if you passed in a non-contiguous input",
    "cublas_status_alloc_failed",
    "defaultcpuallocator: can't allocate memory",
    "defaultcpuallocator: not enough memory",
    "out of memory",
)


def is_oom(err: BaseException) -> bool:
    """True for CUDA, cuDNN, cuBLAS and CPU-allocator out-of-memory errors, False otherwise."""
    if isinstance(err, torch.cuda.OutOfMemoryError):
        return True
    if not isinstance(err, (RuntimeError, MemoryError)):
        return False
    if isinstance(err, MemoryError):
        return True
    msg = str(err).lower()
    return any(m in msg for m in _OOM_MARKERS)


def _free(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()


def _loader_for(module: LightningModule, data: Any, size: int) -> Any:
    if isinstance(data, DataLoader):
        return rebuild_loader(data, batch_size=size)
    if data is not None and not isinstance(data, LightningDataModule):
        raise FastloopError(f"cannot search batch sizes of a {type(data).__name__}")
    holders = size_holders(module, data)
    if not holders:
        raise FastloopError(f"cannot change the batch size: {NOWHERE}")
    set_batch_size(module, data, size)
    return (data if data is not None else module).train_dataloader()


def _agree(flag: bool, step_s: float, device: torch.device) -> tuple[bool, float]:
    """Under torch.distributed: OOM on any rank counts for all; the slowest rank's step time."""
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return flag, step_s
    backend_dev = device if torch.distributed.get_backend() == "nccl" else torch.device("cpu")
    t = torch.tensor([float(flag), step_s], dtype=torch.float64, device=backend_dev)
    torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MAX)
    return bool(t[0].item()), float(t[1].item())


@contextlib.contextmanager
def _trial_hooks(module: LightningModule, opts: list):
    """Trial steps are not training: ``self.log`` in the user's ``training_step`` is a no-op
    (Lightning refuses logging from ``on_fit_start``, where the callback runs); with manual
    optimization, ``self.optimizers()`` hands out the trial optimizers, ``manual_backward`` is a
    plain backward and toggling is a no-op, so the Trainer's optimizers are never stepped."""

    def noop(*a: Any, **k: Any) -> None:
        return None

    hooks: dict[str, Any] = {"log": noop, "log_dict": noop}
    if not module.automatic_optimization:
        hooks.update(
            optimizers=lambda use_pl_optimizer=True: opts[0] if len(opts) == 1 else list(opts),
            manual_backward=lambda loss, *a, **k: loss.backward(*a, **k),
            toggle_optimizer=noop,
            untoggle_optimizer=noop,
            lr_schedulers=noop,
            clip_gradients=noop,
        )
    saved = {k: vars(module)[k] for k in hooks if k in vars(module)}
    for k, v in hooks.items():
        setattr(module, k, v)
    try:
        yield
    finally:
        for k in hooks:
            if k in saved:
                setattr(module, k, saved[k])
            elif k in vars(module):
                delattr(module, k)


def _takes_batch_idx(module: LightningModule) -> bool:
    """Lightning passes ``batch_idx`` only to a ``training_step`` that declares it."""
    try:
        params = inspect.signature(module.training_step).parameters.values()
    except (TypeError, ValueError):
        return True
    if any(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in params):
        return True
    return len([p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]) >= 2


def _trial(
    module: LightningModule, data: Any, size: int, device: torch.device, steps: int, autocast: torch.dtype | None
) -> tuple[float, int]:
    """Run ``steps`` train steps at ``size``; returns (median step time of steps after the first,
    the largest batch the data yielded: a dataset's last partial batch is not its limit)."""
    loader = _loader_for(module, data, size)
    it = iter(loader)
    opt_conf = trial_optimizer_conf(module, loader)
    opts = _optimizers_from(opt_conf)
    ctx = torch.autocast(device.type, dtype=autocast) if autocast else contextlib.nullcontext()
    with_idx = _takes_batch_idx(module)
    times, got = [], 0
    try:
        for i in range(steps):
            try:
                host = next(it)
            except StopIteration:  # fewer batches than trial steps: start the epoch again
                it = iter(loader)
                host = next(it)
            batch = to_device(host, device)
            t = first_tensor(batch)
            got = max(got, int(t.shape[0]) if t is not None and t.dim() else size)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            t0 = time.perf_counter()
            with ctx, _trial_hooks(module, opts):
                out = module.training_step(batch, i) if with_idx else module.training_step(batch)
            loss = out["loss"] if isinstance(out, dict) else out
            if module.automatic_optimization and torch.is_tensor(loss):
                loss.backward()
                for o in opts:
                    o.step()
                    o.zero_grad(set_to_none=True)
            del out, loss, batch
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            times.append(time.perf_counter() - t0)
    finally:
        module.zero_grad(set_to_none=True)
        for o in opts:
            o.state.clear()
        del opts, opt_conf, it, loader
    rest = sorted(times[1:] or times)
    return rest[len(rest) // 2], got or size


def _optimizers_from(conf: Any) -> list[torch.optim.Optimizer]:
    if isinstance(conf, torch.optim.Optimizer):
        return [conf]
    if conf is None:
        return []
    if isinstance(conf, dict):
        return [conf["optimizer"]]
    if isinstance(conf, (list, tuple)):
        out = []
        for c in conf:
            if isinstance(c, torch.optim.Optimizer):
                out.append(c)
            elif isinstance(c, dict):
                out.append(c["optimizer"])
            elif isinstance(c, (list, tuple)):
                out += [x for x in c if isinstance(x, torch.optim.Optimizer)]
        return out
    raise FastloopError(f"configure_optimizers returned {type(conf).__name__}; cannot build a trial optimizer")


class _Trials:
    """The search's trials: ``self(size)`` trains ``size`` for a few steps and says whether it fit
    (an out-of-memory error is a failed trial, on every rank alike); each lands in :attr:`rows`."""

    def __init__(
        self,
        module: Any,
        data: Any,
        dev: torch.device,
        steps: int,
        autocast: torch.dtype | None,
        progress: Callable[[str], None] | None,
    ) -> None:
        self.module, self.data, self.dev, self.steps, self.autocast, self.progress = (
            module,
            data,
            dev,
            steps,
            autocast,
            progress,
        )
        self.rows: list[dict] = []
        self.limit: int | None = None
        """The data's own batch limit (a dataset smaller than the batch), once a trial met it."""

    def __call__(self, size: int) -> bool:
        if self.progress:
            self.progress(f"trying batch size {size}")
        oom, step_s, got, t0 = False, 0.0, size, time.perf_counter()
        try:
            step_s, got = _trial(self.module, self.data, size, self.dev, self.steps, self.autocast)
        except Exception as err:  # noqa: BLE001 - re-raised unless it is an OOM
            if not is_oom(err):
                raise
            oom = True
        if oom:
            _free(self.dev)  # outside the except block: the traceback no longer pins the failed step's tensors
        oom, step_s = _agree(oom, step_s, self.dev)
        ok = not oom
        self.rows.append(
            {
                "batch_size": size,
                "ok": ok,
                "step_s": step_s if ok else None,
                "throughput": got / step_s if ok and step_s > 0 else None,
                "trial_s": time.perf_counter() - t0,
            }
        )
        if ok and got < size:
            self.rows[-1]["note"] = f"the data yields only {got} samples per batch"
            self.limit = got if self.limit is None else min(self.limit, got)
        return ok


MIXED_PRECISION = {"bf16-mixed": torch.bfloat16, "bf16": torch.bfloat16, "16-mixed": torch.float16, "16": torch.float16}
"""A Trainer's mixed ``precision`` -> the dtype its steps autocast to (the search's trials do too)."""


def search_batch_size(
    module: LightningModule,
    data: Any,
    *,
    speedups: str | list[str | Speedup] | None = None,
    device: str = "auto",
    init: int | None = None,
    max_size: int = 4096,
    objective: str = "throughput",
    margin: float = 0.9,
    trial_steps: int = 3,
    precision: float = 0.0625,
    trainer_optimizers: list | None = None,
    attached: bool = False,
    progress: Callable[[str], None] | None = None,
    trainer_precision: str | None = None,
) -> dict:
    """Find the batch size; write it where the target keeps it; return the JSON document part.

    Args:
        init: first size tried (default: the target's current batch size).
        max_size: never try above this.
        objective: ``"max"`` (largest under the margin) or ``"throughput"`` (fastest under it).
        margin: the chosen size is at most ``margin * max_fitting``.
        attached: True when called from a running Trainer (its DataModule is set up already);
            otherwise a DataModule's ``prepare_data()`` and ``setup("fit")`` are called first.
        precision: bisection stops when the gap between fitting and failing sizes is at most this
            fraction of the failing size (1/16: the largest fitting size is found within ~6%).
        trainer_precision: the user's Trainer ``precision`` (``"bf16-mixed"``, ``"16-mixed"``): the
            trials autocast as the training will, when no speedup sets the precision.
    """

    check_search(objective, margin, max_size)
    dev = resolve_device(device)
    autocast = _PrecisionProbe.of(resolve(speedups), Context(dev)) or MIXED_PRECISION.get(str(trainer_precision))
    if isinstance(data, LightningDataModule) and not attached:
        # as Trainer.fit would, before asking for the loader (a DataModule makes its datasets here)
        data.prepare_data()
        data.setup("fit")
    current = current_size(size_holders(module, data))
    if isinstance(data, DataLoader) and yields_whole_batches(data):
        raise FastloopError(
            f"cannot change the batch size: {WHOLE_BATCHES}; make the batches in the DataLoader "
            f"(batch_size=N) to search it"
        )
    if current is None and isinstance(data, DataLoader):
        current = data.batch_size or getattr(data.batch_sampler, "batch_size", None)
    if not size_holders(module, data) and not isinstance(data, DataLoader):
        raise FastloopError(f"cannot change the batch size: {NOWHERE}")
    start = max(1, min(int(init or current or 1), max_size))
    module.to(dev)
    was_training = module.training
    before = state_digest(module, trainer_optimizers or [])
    rng = rng_states()
    snap = snapshot_state(module)
    mem0 = torch.cuda.memory_allocated(dev) if dev.type == "cuda" else None
    t_start = time.perf_counter()
    attempt = _Trials(module, data, dev, trial_steps, autocast, progress)
    trials = attempt.rows
    try:
        module.train()
        lo = largest_fitting(attempt, start, max_size, precision, lambda: attempt.limit is not None)
        max_fitting = lo if attempt.limit is None else min(lo, attempt.limit)
        chosen = choose_batch_size(trials, attempt, max_fitting, margin, objective)
    finally:
        restore_state(module, snap)
        module.zero_grad(set_to_none=True)
        module.train(was_training)
        restore_rng_state(rng)
        _free(dev)
    written = set_batch_size(module, data, chosen)
    mem1 = torch.cuda.memory_allocated(dev) if dev.type == "cuda" else None
    return {
        "batch_size": chosen,
        "max_fitting": max_fitting,
        "objective": objective,
        "margin": margin,
        "trials": trials,
        "search_s": time.perf_counter() - t_start,
        "restored": state_digest(module, trainer_optimizers or []) == before,
        "written_to": written,
        "memory_allocated_before": mem0,
        "memory_allocated_after": mem1,
        "autocast": str(autocast).replace("torch.", "") if autocast else None,
        "compile_note": "trials run eagerly; compile (if requested) happens once afterwards, so no trial recompiles",
    }


class _PrecisionProbe(Run):
    """A run that only hears autocast: the precision the speedups will train in (every other
    change raises :class:`~fastloop.speedups.base.Skip`, the default, and is ignored here)."""

    def __init__(self, ctx: Context) -> None:
        self.ctx, self.dtype = ctx, None

    def autocast(self, dtype: torch.dtype, *, scale_loss: bool = False) -> None:
        self.dtype = dtype

    @classmethod
    def of(cls, speedups: list[Speedup], ctx: Context) -> torch.dtype | None:
        probe = cls(ctx)
        for s in speedups:
            if s.why_not(ctx) is None:
                with contextlib.suppress(Skip):
                    s.apply(probe)
        return probe.dtype


@register
class BatchSize(Speedup):
    __doc__ = __doc__
    name = "batch_size"
    trains = "workload"  # other batches: their size
    ladder = LadderTraits(changes_workload=True)
    changes = "data"
    order = 70
    prepares_run = True

    def prepare_run(
        self, module: Any, data: Any, others: list[Speedup], device: torch.device, *, precision: str | None = None
    ) -> tuple[Any, Record, dict]:
        """Search with the other speedups on, then train at the size found (a DataLoader, fixed
        at build, is rebuilt at that size; a DataModule or module reads its ``batch_size``). Where the
        size cannot be changed, the run goes on at the user's size and the record says why (skipped)."""

        try:
            search = search_batch_size(module, data, speedups=others, device=str(device), trainer_precision=precision)
        except FastloopError as err:  # not the user's code failing (UserCodeError is no FastloopError)
            return data, Record(self.name, "skipped", str(err)), {}
        if isinstance(data, DataLoader) and data.batch_size != search["batch_size"]:
            data = rebuild_loader(data, batch_size=search["batch_size"])
        record = Record(
            self.name,
            "applied",
            detail=f"batch size {search['batch_size']} (largest fitting "
            f"{search['max_fitting']}, search {search['search_s']:.1f} s)",
        )
        stats = {"batch_size_search": {k: search[k] for k in ("batch_size", "max_fitting", "search_s", "restored")}}
        return data, record, stats
