"""Speedups for a plain PyTorch loop: wrap model, optimizer, loader and train step.

Example:
    >>> import torch
    >>> from torch.utils.data import DataLoader, TensorDataset
    >>> from fastloop.loop import FastLoop
    >>> torch.manual_seed(0) and None
    >>> model = torch.nn.Linear(8, 2)
    >>> data = DataLoader(TensorDataset(torch.randn(64, 8), torch.randint(0, 2, (64,))), batch_size=16)
    >>> loop = FastLoop(model, torch.optim.AdamW(model.parameters()), data,
    ...                 loss_fn=torch.nn.functional.cross_entropy, speedups="fused_optimizer,prefetch")
    >>> result = loop.train(steps=6, warmup=2)
    >>> [(r.name, r.status, r.reason) for r in result.records]
    [('prefetch', 'skipped', 'no CUDA'), ('fused_optimizer', 'applied', '')]
    >>> len(result.losses), result.stats.steps
    (8, 6)
"""

from __future__ import annotations

import contextlib
import itertools
import os
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.data import DataLoader, IterableDataset

from fastloop._torch_private import found_inf
from fastloop.adapters.graph_step import GraphedStep
from fastloop.adapters.step_source import host_draws
from fastloop.data import set_sampler_epoch, to_device
from fastloop.device import resolve_device
from fastloop.errors import FastloopError
from fastloop.measure.timer import StepStats, StepTimer, collect_garbage
from fastloop.speedups.async_checkpoint import CheckpointWriter
from fastloop.speedups.base import Context, Record, Skip, apply_all, resolve
from fastloop.speedups.compile.compile import (
    CUDAGRAPH_MODES,
    apply_compile,
    check_compiled,
    compiled_by_user,
    compiles,
    graphs_so_far,
)
from fastloop.speedups.cuda_graph.cuda_graph import TierFacts, below_whole, common_blocker
from fastloop.speedups.precision import held_on_skipped_steps
from fastloop.speedups.run import Run, eval_loss

__all__ = ["FastLoop", "LoopResult", "LoopRun", "resolve_device"]


class LoopRun(Run):
    """The plain loop's :class:`~fastloop.speedups.run.Run`: each change is made at once, and the
    step reads what the speedups asked for (autocast, loss scaling, the batch's transforms, the
    graph).

    Example:
        >>> import torch
        >>> from fastloop.speedups import resolve
        >>> from fastloop.speedups.base import Context
        >>> run = LoopRun(Context(torch.device("cpu")), torch.nn.Conv2d(3, 4, 3), None, None)
        >>> apply_all(resolve("bf16,channels_last"), run)
        >>> run.autocast_dtype, len(run.batch_fns), run.model.weight.is_contiguous(memory_format=torch.channels_last)
        (torch.bfloat16, 1, True)
    """

    def __init__(
        self,
        ctx: Context,
        model: torch.nn.Module | None,
        optimizer: torch.optim.Optimizer | None,
        loader: Iterable | None,
        step_fn: Callable[[torch.nn.Module, Any], torch.Tensor] | None = None,
    ) -> None:
        self.ctx, self.model, self.optimizer, self.loader = ctx, model, optimizer, loader
        self.step_fn = step_fn
        """The loop's loss of a batch, ``step_fn(model, batch)`` (for :meth:`batch_loss`)."""
        self.autocast_dtype: torch.dtype | None = None
        self.scale_loss = False
        self.compile_mode: str | None = None  # the mode compile_step compiled with
        self.batch_fns: list[Callable[[Any], Any]] = []
        self.on_device = False
        """The loader delivers batches on the device (prefetch): the step does not copy them."""
        self.graph_owner: str | None = None
        """The speedup that asked for the whole-step graph (None: the step runs eagerly)."""
        self.held: list[Callable[[], contextlib.AbstractContextManager]] = []
        """Contexts entered while the loop trains (TF32, cuDNN autotuning)."""
        self.mark_steps = False
        """Forward and backward run through compile's CUDA graphs: each step is marked."""
        self.checkpoint_writer: CheckpointWriter | None = None
        """Where :meth:`FastLoop.save_checkpoint` saves (async_checkpoint's writer; None: at once)."""

    def _need(self, value: Any, what: str) -> Any:
        if value is None:
            raise self._cannot(f"change the {what} (none was given)")
        return value

    def change_model(self, fn: Callable[[torch.nn.Module], torch.nn.Module]) -> None:
        self.model = fn(self._need(self.model, "model"))

    def compile_step(self, mode: str, shapes: str = "auto") -> None:
        model = self._need(self.model, "model")
        if compiled_by_user(model):
            raise Skip("the model is already compiled by your code (torch.compile returned it): left as it is")
        self.model = apply_compile(model, mode, shapes)
        self.compile_mode = mode

    def change_optimizers(self, fn: Callable[[torch.optim.Optimizer], Any]) -> None:
        fn(self._need(self.optimizer, "optimizer"))

    def change_loader(self, fn: Callable[[Iterable], Iterable]) -> None:
        self.loader = fn(self._need(self.loader, "loader"))

    def change_batch(self, fn: Callable[[Any], Any]) -> None:
        self.batch_fns.append(fn)

    def batches_arrive_on_device(self) -> None:
        self.on_device = True

    def batch_loss(self, batch: Any) -> torch.Tensor:
        model, step_fn = self._need(self.model, "model"), self._need(self.step_fn, "step function")
        for fn in self.batch_fns:
            batch = fn(batch)
        return eval_loss(model, lambda: step_fn(model, batch))

    def autocast(self, dtype: torch.dtype, *, scale_loss: bool = False) -> None:
        self.autocast_dtype, self.scale_loss = dtype, scale_loss

    def graph_step(self) -> None:
        assert self.speedup is not None
        self.graph_owner = self.speedup.name

    def graph_tier_facts(self) -> TierFacts:
        model = self._need(self.model, "model")
        return TierFacts(
            compiled_mode=self.compile_mode,
            graphs_unsafe=None,  # the loop holds no gradients over
            can_compile=next(model.parameters(), None) is not None,
            user_compiled=compiled_by_user(model),
        )

    def compile_for_tier(self, mode: str | None, *, mark_steps: bool) -> None:
        self.graph_owner = None  # the step runs below the whole-step graph from here on
        if mode is not None:  # compile is lazy: a mode set before the next step is the one used
            self.model = apply_compile(self._need(self.model, "model"), mode)
            self.compile_mode = mode
        self.mark_steps = mark_steps or self.compile_mode in CUDAGRAPH_MODES

    def save_checkpoints_with(self, writer: CheckpointWriter) -> None:
        self.checkpoint_writer = writer
        self.ctx.undo.append(lambda: setattr(self, "checkpoint_writer", None))  # if the speedup then does not apply

    def hold(self, context: Callable[[], contextlib.AbstractContextManager]) -> None:
        self.held.append(context)
        self.ctx.undo.append(lambda: self.held.remove(context))  # if the speedup then does not apply

    def defer_logging(self, every: int | None, seconds: float | None) -> None:
        raise Skip(
            "the plain loop has no logging to defer: FastLoop keeps the step's losses on the device and reads "
            "them once, at the end"
        )

    def validate_like_training(self, options: Any) -> None:
        raise Skip(
            "the plain loop has no validation loop: FastLoop trains only, and what your code validates "
            "outside it is not FastLoop's to change"
        )

    def prepare(self, batch: Any, device: torch.device) -> Any:
        """The batch as the step sees it: on the device, then each speedup's transform."""
        if not self.on_device:
            batch = to_device(batch, device, non_blocking=device.type == "cuda")
        for fn in self.batch_fns:
            batch = fn(batch)
        return batch


@dataclass
class LoopResult:
    """What :meth:`FastLoop.train` did.

    Example:
        >>> from fastloop.measure.timer import StepStats
        >>> result = LoopResult(losses=[0.7, 0.6], stats=StepStats([0.01], [0.0], warmup_steps=1), records=[], extra={})
        >>> result.stats.steps, result.losses[-1]
        (1, 0.6)
    """

    losses: list[float]
    """Loss of every step, warm-up included."""
    stats: StepStats
    """The measured steps' times (warm-up left out): ``stats.step_s``, ``stats.data_wait_frac``, ..."""
    records: list[Record]
    """What each speedup did: applied, skipped or fallback, with the reason."""
    extra: dict
    """What the speedups counted while the loop trained (recompiles, fp16's skipped steps, ...)."""


def _epoch_length(loader: Iterable) -> int | None:
    """Batches in an epoch of a map-style DataLoader (None: run the loader until it ends)."""
    if not isinstance(loader, DataLoader) or isinstance(loader.dataset, IterableDataset):
        return None
    try:
        return len(loader)
    except TypeError:  # a sampler without a length
        return None


class FastLoop:
    """A train loop over ``model``/``optimizer``/``loader`` with speedups applied: the speedups
    change what they change when the loop is built (each recorded in :attr:`records`), and
    :meth:`train` runs the steps.

    Args:
        model: the model (moved to ``device``).
        optimizer: an optimizer over ``model``'s parameters.
        loader: any iterable of batches (a DataLoader for the data-pipeline speedups).
        loss_fn: ``loss_fn(model(inputs), targets)`` for ``(inputs, targets)`` batches.
        step_fn: instead of ``loss_fn``: ``step_fn(model, batch) -> loss`` for any batch.
        speedups: names (``"bf16,compile"``), a list of names, or Speedup objects.
        device: ``auto``, ``cpu`` or ``cuda``.
        scheduler: an LR scheduler stepped after every optimizer step (not after an fp16
            step the scaler skipped).

    Raises:
        TypeError: ``model``, ``optimizer``, ``loader`` or a function is not what it must be.
        ValueError: neither or both of ``loss_fn`` and ``step_fn``; the optimizer's parameters
            are not the model's.
        FastloopError: an unknown speedup, a bad option, or two speedups that conflict.

    Example:
        >>> import torch
        >>> from torch.utils.data import DataLoader, TensorDataset
        >>> model = torch.nn.Linear(4, 2)
        >>> data = DataLoader(TensorDataset(torch.randn(32, 4), torch.randint(0, 2, (32,))), batch_size=8)
        >>> loop = FastLoop(model, torch.optim.SGD(model.parameters(), lr=0.1), data,
        ...                 loss_fn=torch.nn.functional.cross_entropy, speedups="channels_last,tf32", device="cpu")
        >>> [(r.name, r.status, r.reason) for r in loop.records]
        [('tf32', 'skipped', 'no CUDA'), ('channels_last', 'skipped', 'model has no Conv2d layers')]
    """

    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        loader: Iterable,
        loss_fn: Callable | None = None,
        *,
        step_fn: Callable | None = None,
        speedups: str | list | None = None,
        device: str | torch.device = "auto",
        scheduler: Any = None,
    ) -> None:
        if not isinstance(model, torch.nn.Module):
            raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError(f"optimizer must be a torch.optim.Optimizer, got {type(optimizer).__name__}")
        if loader is None or isinstance(loader, (str, bytes)) or not hasattr(loader, "__iter__"):
            raise TypeError(
                f"loader must be an iterable of batches (a DataLoader, for example), got {type(loader).__name__}"
            )
        for name, fn in (("loss_fn", loss_fn), ("step_fn", step_fn)):
            if fn is not None and not callable(fn):
                raise TypeError(f"{name} must be callable, got {type(fn).__name__}")
        if (loss_fn is None) == (step_fn is None):
            raise ValueError("give exactly one of loss_fn (for (inputs, targets) batches) or step_fn(model, batch)")
        if step_fn is None:

            def step_fn(m: torch.nn.Module, batch: Any) -> torch.Tensor:
                inputs, targets = batch
                return loss_fn(m(inputs), targets)

        self.step_fn = step_fn
        self.device = resolve_device(device)
        self.ctx = Context(self.device)
        self.scheduler = scheduler
        self.speedups = resolve(speedups)
        model = model.to(self.device)
        if any(p.device != self.device for g in optimizer.param_groups for p in g["params"]):
            raise ValueError(
                "the optimizer's parameters are not the model's (build the optimizer after moving the model?)"
            )
        self.run = LoopRun(self.ctx, model, optimizer, loader, step_fn)
        apply_all(self.speedups, self.run)
        self.model, self.optimizer, self.loader = self.run.model, self.run.optimizer, self.run.loader
        self.scaler = torch.amp.GradScaler("cuda") if self.run.scale_loss else None
        self.skipped_steps = 0
        self.epoch = 0
        """The epochs begun (each :meth:`train` call begins a new one: the loader is iterated anew)."""
        self._last_skipped = False
        self._scheduler_step = scheduler.step if scheduler is not None else None
        if scheduler is not None and self.scaler is not None:  # fp16's rule, as under Lightning
            self._scheduler_step = held_on_skipped_steps(scheduler.step, lambda: self._last_skipped, self.ctx)
        self._skipped_dev: torch.Tensor | None = None
        self._graphs_before = graphs_so_far() if any(compiles(s) for s in self.speedups) else None
        self.graphed: GraphedStep | None = None
        self.graph_owner = owner = self.run.graph_owner
        if owner:  # what keeps the whole step out of one graph, known before the first step
            drawn = host_draws(step_fn, model)
            why = common_blocker(cuda=self.device.type == "cuda", scale_loss=self.run.scale_loss) or (
                f"the step function uses {drawn}" if drawn else None
            )
            if why:
                below_whole(self.run, owner, why)
            else:
                self.graphed = GraphedStep(
                    self.model,
                    self.optimizer,
                    self.step_fn,
                    self.run.autocast_dtype,
                    schedulers=[scheduler] if scheduler is not None else [],
                    on_fallback=lambda reason: below_whole(self.run, owner, reason),
                )
        self.model = self.run.model  # a tier below the whole step compiled it (in place)
        self._writer_at_once = CheckpointWriter(background=False)

    def save_checkpoint(self, path: str | os.PathLike, **extra: Any) -> None:
        """Save the training state to ``path`` as ``torch.save`` does (``torch.load`` reads it):
        ``{"model": model.state_dict(), "optimizer": ..., "scheduler": ... (given one), **extra}``,
        written whole or not at all (under a temporary name, then renamed). Under
        ``async_checkpoint`` the state is copied now and written while training goes on (a save
        while one is in flight waits for it); else it is written now.

        Args:
            path: the file to write (its folder must exist).
            extra: more entries of the checkpoint (the epoch, the step, ...).
        """
        reserved = sorted({"model", "optimizer", "scheduler"} & set(extra))
        if reserved:
            raise ValueError(f"save_checkpoint writes {', '.join(reserved)} itself; give other names for extra entries")
        state = {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict()}
        if self.scheduler is not None:
            state["scheduler"] = self.scheduler.state_dict()
        state.update(extra)
        (self.run.checkpoint_writer or self._writer_at_once).save(state, path)

    def wait_for_checkpoints(self) -> None:
        """Wait until the last checkpoint is written (raising its error, if its write failed)."""
        if self.run.checkpoint_writer is not None:
            self.run.checkpoint_writer.close()

    @property
    def mark_steps(self) -> bool:
        """Forward and backward run through compile's CUDA graphs: each step is marked."""
        return self.run.mark_steps

    @property
    def records(self) -> list[Record]:
        return [self.ctx.records[s.name] for s in self.speedups]

    def _autocast(self):
        if self.run.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.run.autocast_dtype)

    def _eager_step(self, batch: Any) -> torch.Tensor:
        if self.mark_steps:
            torch.compiler.cudagraph_mark_step_begin()
        self.optimizer.zero_grad(set_to_none=True)
        with self._autocast():
            loss = self.step_fn(self.model, batch)
        if self.scaler is None:
            loss.backward()
            self.optimizer.step()
            self._step_scheduler()
            return loss.detach()
        self.scaler.scale(loss).backward()
        self.scaler.step(self.optimizer)
        found = found_inf(self.scaler, self.optimizer)
        self.scaler.update()
        if self.scheduler is not None:  # needs to know now: one host read per step
            self._last_skipped = bool(found.item())
            self.skipped_steps += int(self._last_skipped)
            self._step_scheduler()
        else:  # count on the device, read once at the end
            self._skipped_dev = found if self._skipped_dev is None else self._skipped_dev + found
        return loss.detach()

    def _step_scheduler(self) -> None:
        if self.scheduler is not None:
            self._scheduler_step()

    def _graph_step(self, batch: Any) -> torch.Tensor:
        assert self.graphed is not None
        loss = self.graphed(batch)  # the engine fell a tier if it could not replay (on_fallback)
        self._step_scheduler()
        return loss

    def batches(self) -> Iterator[Any]:
        """Batches forever: the loader is restarted at the end of each epoch, its sampler told the
        epoch first (a ``DistributedSampler`` reshuffles: :func:`~fastloop.data.set_sampler_epoch`). A
        map-style DataLoader's epoch ends after its ``len`` batches, as Lightning ends it, without asking
        its iterator for one more (which would have a seeded ``RandomSampler`` draw a permutation more:
        the next epoch's order would depend on how the epoch was consumed)."""
        while True:
            set_sampler_epoch(self.loader, self.epoch)
            self.epoch += 1
            empty = True
            for batch in itertools.islice(self.loader, _epoch_length(self.loader)):
                empty = False
                yield batch
            if empty:
                raise FastloopError("the training loader yielded no batches")

    def train(self, steps: int, warmup: int = 0, timer: StepTimer | None = None) -> LoopResult:
        """Run ``warmup + steps`` steps; the first ``warmup`` are excluded from the statistics."""
        if not isinstance(steps, int) or not isinstance(warmup, int) or isinstance(steps, bool):
            raise TypeError(f"steps and warmup must be integers, got {steps!r} and {warmup!r}")
        if steps < 1 or warmup < 0:
            raise FastloopError(f"steps must be >= 1 and warmup >= 0 (got steps={steps}, warmup={warmup})")
        timer = timer or StepTimer(self.device, warmup=warmup)
        self.model.train()
        losses: list[torch.Tensor] = []
        it = self.batches()
        t0 = time.perf_counter()
        with contextlib.ExitStack() as held:  # what the speedups hold while the loop trains (TF32, cuDNN, ...)
            held.callback(it.close)  # on any exit (Ctrl-C too): the epoch's iterator ends, a feed thread with it
            for context in self.run.held:
                held.enter_context(context())
            for i in range(warmup + steps):
                with timer.fetching():
                    batch = self.run.prepare(next(it), self.device)
                loss = self._graph_step(batch) if self.run.graph_owner and self.graphed else self._eager_step(batch)
                losses.append(loss)
                timer.step_end()
                if i == warmup - 1:
                    if self.device.type == "cuda":
                        torch.cuda.synchronize()
                    collect_garbage()  # compile's garbage: collected in the warm-up, not in a measured step
                    timer.resume()
        stats = timer.result()
        stats.set_warmup_overhead(time.perf_counter() - t0)
        if self.graphed is not None and self.graph_owner is not None:
            self.graphed.engine.finish(self.ctx, self.graph_owner)
        check_compiled(self.ctx, self.speedups, self._graphs_before)
        if self._skipped_dev is not None:
            self.skipped_steps += int(self._skipped_dev.item())
        extra = dict(self.ctx.stats)
        if self.scaler is not None:
            extra["fp16_skipped_steps"] = self.skipped_steps
        return LoopResult(
            losses=torch.stack(losses).float().cpu().tolist(), stats=stats, records=self.records, extra=extra
        )
