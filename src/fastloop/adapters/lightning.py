"""Lightning callbacks: drop-in speedups for an existing ``Trainer``, no change to the module.

Thin adapters: each callback applies one :class:`~fastloop.speedups.base.Speedup` at the hook
where Lightning lets that kind of change happen (loader in ``setup``, model in ``setup``,
optimizer in ``on_fit_start``, precision by swapping the strategy's precision plugin).

Example:
    >>> from fastloop.lightning import callbacks
    >>> [type(c).__name__ for c in callbacks("bf16,compile")]
    ['SpeedupCallback', 'SpeedupCallback']

    ``Trainer(callbacks=callbacks("workers,pin_memory,prefetch,bf16,fused_optimizer,compile"))``
"""

from __future__ import annotations

import weakref
from typing import Any

import torch

from fastloop._compat import Callback, LightningModule, Trainer
from fastloop._torch_private import scaler_scale, shutdown_workers
from fastloop.adapters._lightning_private import ddp_kwargs
from fastloop.adapters.lightning_batch_size import BatchSizeSearch
from fastloop.adapters.lightning_changes import patch_attr
from fastloop.adapters.lightning_run import LightningRun, held_gradients
from fastloop.speedups.base import Context, Record, RunInputs, Speedup, apply_all, resolve
from fastloop.speedups.compile.compile import check_compiled, compiles, graphs_so_far
from fastloop.speedups.precision import held_on_skipped_steps

__all__ = ["BatchSizeSearch", "SpeedupCallback", "own_held_gradients"]

_OWNED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
"""module -> the (global step, batch index) at which its held gradients were last copied."""


def own_held_gradients(trainer: Trainer, module: LightningModule, batch_idx: int) -> bool:
    """Before a new step of compile's CUDA graphs is marked: copy the gradients a step holds over
    into memory of their own, when it may hold them (accumulate_grad_batches > 1, or manual
    optimization). The backward graph's outputs live in the graphs' pool, and a gradient left in
    ``.grad`` keeps that memory (autograd takes the first gradient without copying): the next step's
    replay overwrites it, and the accumulated sum silently loses the earlier micro-batches
    (pytorch/pytorch#169545). One process only (under DDP the gradients are the reducer's bucket
    views). Returns True when it copied; once per step however many callbacks ask.

    Example:
        >>> from fastloop._compat import Trainer
        >>> from tests.targets import tiny_mlp
        >>> module, _ = tiny_mlp()
        >>> module(torch.randn(2, 16)).sum().backward()
        >>> before = module.net[0].weight.grad
        >>> own_held_gradients(Trainer(accelerator="cpu", logger=False, accumulate_grad_batches=2), module, 1)
        True
        >>> module.net[0].weight.grad is before, torch.equal(module.net[0].weight.grad, before)
        (False, True)
    """
    if trainer.world_size > 1 or held_gradients(trainer, module) is None:
        return False
    key = (trainer.global_step, batch_idx)
    if _OWNED.get(module) == key:
        return False
    _OWNED[module] = key
    copied = False
    with torch.no_grad():
        for p in module.parameters():
            if p.grad is not None:
                p.grad = p.grad.clone()
                copied = True
    return copied


class SpeedupCallback(Callback):
    """Apply one speedup to a Trainer. Its outcome is in :attr:`record`.

    Drop-in: the Trainer's own settings win (a precision you chose is kept and bf16/fp16 are
    skipped with the reason); a skipped speedup changes nothing; every patch of your module,
    DataModule, strategy or schedulers is removed in ``teardown`` (also after an exception), so
    after ``fit`` they are as they were and pickle as without fastloop.

    Args:
        speedup: a speedup name (``"bf16"``) or a Speedup object.
        inputs: what the run declares to its speedups (:class:`~fastloop.speedups.base.RunInputs`);
            the speedup callbacks of one Trainer share the first one's, so that, for example,
            ``workers`` learns that ``gpu_resident`` already serves the batches on the GPU.
    """

    def __init__(self, speedup: str | Speedup, inputs: RunInputs | None = None) -> None:
        if not isinstance(speedup, (str, Speedup)):
            raise TypeError(
                f"SpeedupCallback takes one speedup name (e.g. 'bf16') or a Speedup object, "
                f"got {type(speedup).__name__}"
            )
        found = resolve([speedup])
        if len(found) != 1:
            raise ValueError(f"SpeedupCallback takes one speedup, got {speedup!r}")
        if found[0].prepares_run:
            raise ValueError(
                f"{found[0].name!r} runs before training: use fastloop.lightning.BatchSizeSearch() "
                f"(callbacks('{found[0].name}') returns it)"
            )
        self.speedup = found[0]
        self.inputs = inputs if inputs is not None else RunInputs()
        self.ctx: Context | None = None
        self.run: LightningRun | None = None
        """The run this callback's speedup changed (set in ``setup``)."""
        self._scale_before: torch.Tensor | None = None
        self._skipped: torch.Tensor | None = None
        self._graphs_before: tuple[int, int] | None = None

    @property
    def state_key(self) -> str:
        return f"SpeedupCallback[{self.speedup.name}]"

    def _shared_inputs(self, trainer: Trainer) -> RunInputs:
        """The run's inputs: the first speedup callback's, shared by all of this Trainer's (the
        first, whose ``setup`` runs first, starts the fit with nothing on the device yet)."""
        first = next(c for c in trainer.callbacks if isinstance(c, SpeedupCallback))
        if first is self:
            self.inputs.batches_on_device = None
        elif first.inputs.step_rate is None:
            first.inputs.step_rate = self.inputs.step_rate
        return first.inputs

    @property
    def record(self) -> Record:
        if self.ctx is None or self.speedup.name not in self.ctx.records:
            return Record(self.speedup.name, "skipped", "the Trainer never ran setup")
        return self.ctx.records[self.speedup.name]

    def _fail(self, status: str, reason: str) -> None:
        assert self.ctx is not None
        if self.speedup.name not in self.ctx.records or self.ctx.applied(self.speedup.name):
            self.ctx.record(self.speedup.name, status, reason)  # type: ignore[arg-type]

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        s = self.speedup
        self._graphs_before = graphs_so_far() if compiles(s) else None  # Dynamo's import costs ~1 s
        self.ctx = ctx = Context(trainer.strategy.root_device, inputs=self._shared_inputs(trainer))
        if trainer.world_size > 1:
            ctx.ddp_kwargs = ddp_kwargs(trainer.strategy)
        self.run = LightningRun(trainer, pl_module, ctx, self._fail)
        apply_all([s], self.run)  # a speedup that did not apply has put back what it changed

    def on_fit_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self.ctx is None or self.run is None or not self.ctx.applied(self.speedup.name):
            return
        for change in self.run.fit_start:  # what waited for the optimizers
            change()
        if self.run.scale_loss:
            self._hold_schedulers_on_skipped_steps(trainer)

    def _hold_schedulers_on_skipped_steps(self, trainer: Trainer) -> None:
        """fp16: Lightning steps LR schedulers after every batch; an optimizer step the scaler
        skipped (inf/NaN gradients) must not advance the schedule. Costs one host read of the
        scale per scheduler step (only with fp16 and a scheduler)."""
        assert self.ctx is not None
        for config in trainer.lr_scheduler_configs:
            sched = config.scheduler
            step = held_on_skipped_steps(sched.step, lambda: self._last_step_skipped(trainer), self.ctx)
            patch_attr(sched, "step", step, self._undo())

    def _last_step_skipped(self, trainer: Trainer) -> bool:
        scaler = getattr(trainer.precision_plugin, "scaler", None)
        if scaler is None or scaler_scale(scaler) is None or self._scale_before is None:
            return False
        return bool((scaler_scale(scaler) < self._scale_before).item())

    def _hook(self, name: str, *args: Any) -> None:
        """Run what the speedup's changes do at Lightning's hook ``name`` (the run's ``hooks``), while it applies."""
        if self.run is not None and self.ctx is not None and self.ctx.applied(self.speedup.name):
            for change in self.run.hooks[name]:
                change(*args)

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._hook("train_start")

    def on_validation_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._hook("validation_start")

    def on_validation_batch_start(
        self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        self._hook("validation_batch_start", batch, batch_idx, dataloader_idx)

    def on_validation_batch_end(
        self,
        trainer: Trainer,
        pl_module: LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        self._hook("validation_batch_end", batch, batch_idx, dataloader_idx)

    def on_validation_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._hook("validation_end")

    def on_train_batch_start(self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int) -> None:
        if self.speedup.uses_cudagraphs() and self.ctx is not None and self.ctx.applied(self.speedup.name):
            if (self.run is None or self.run.graph is None) and own_held_gradients(trainer, pl_module, batch_idx):
                self.ctx.stats["cudagraph_grads_copied"] = self.ctx.stats.get("cudagraph_grads_copied", 0) + 1
            # a new step: outputs of the previous step's graphs may be overwritten from here on
            torch.compiler.cudagraph_mark_step_begin()
        scaler = getattr(trainer.precision_plugin, "scaler", None)
        if self.run is not None and self.run.autocast_dtype == torch.float16 and scaler is not None:
            if scaler_scale(scaler) is not None:
                self._scale_before = scaler_scale(scaler).detach().clone()
            else:  # the scale is created lazily at the first step: its initial value
                self._scale_before = torch.tensor(float(scaler.get_scale()))

    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        scaler = getattr(trainer.precision_plugin, "scaler", None)
        scale = scaler_scale(scaler) if scaler is not None else None
        if self._scale_before is not None and scale is not None:
            # the scale backs off exactly when the step was skipped (inf/NaN gradients); no sync
            skipped = (scale < self._scale_before.to(scale.device)).int()
            self._skipped = skipped if self._skipped is None else self._skipped + skipped

    def on_fit_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        graph = self.run.graph if self.run is not None else None
        if graph is not None and self.ctx is not None:
            graph.engine.finish(self.ctx, self.speedup.name)
        if self.ctx is not None:
            check_compiled(self.ctx, [self.speedup], self._graphs_before)
        if self.ctx is not None and self._skipped is not None:
            self.ctx.stats["fp16_skipped_steps"] = int(self._skipped.item())
        self._hook("fit_end")

    def _undo(self) -> list:
        """Where every change to the user's objects registers how to put it back (run at teardown)."""
        assert self.ctx is not None
        return self.ctx.undo

    def _run_undo(self) -> None:
        if self.ctx is not None:
            while self.ctx.undo:
                self.ctx.undo.pop()()
        if self.run is not None:
            for loader in self.run.loaders:  # a rebuilt loader's persistent workers (a feed's thread) end with the fit
                close = getattr(loader, "close", None)
                if callable(close) and not isinstance(loader, torch.utils.data.DataLoader):
                    close()
                shutdown_workers(loader)
            self.run.loaders.clear()

    def teardown(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        self._run_undo()

    def on_exception(self, trainer: Trainer, pl_module: LightningModule, exception: BaseException) -> None:
        self.teardown(trainer, pl_module, "fit")  # Lightning calls no teardown hook after an exception
