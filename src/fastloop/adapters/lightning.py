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

import contextlib
import weakref
from typing import Any

import torch
from torch.utils.data import DataLoader

from fastloop._compat import Callback, LightningModule, Trainer
from fastloop.adapters._lightning_private import ddp_kwargs, set_train_source, train_source
from fastloop._torch_private import (
    compiled_call,
    compiled_graph_count,
    first_graph_break,
    scaler_scale,
    set_compiled_call,
    shutdown_workers,
)
from fastloop.data import to_channels_last
from fastloop.adapters.lightning_batch_size import BatchSizeSearch
from fastloop.adapters.lightning_changes import compilable_children, patch_attr, trainer_precision_conflict
from fastloop.adapters.lightning_graph import WholeStepGraph, cycled_hyperparameters, whole_step_blocker
from fastloop.speedups.base import Context, Record, RunInputs, Skip, Speedup, StepPlan, resolve
from fastloop.speedups.compile import CUDAGRAPH_MODES
from fastloop.speedups.fused_optimizer import _fused_ok, apply_fused_optimizer

__all__ = ["BatchSizeSearch", "SpeedupCallback"]


_COMPILE_MODE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
"""The torch.compile mode a LightningModule's children were compiled with during this fit (so
that compile and cuda_graph compile once); emptied when the fit is torn down."""


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
            raise TypeError(f"SpeedupCallback takes one speedup name (e.g. 'bf16') or a Speedup object, "
                            f"got {type(speedup).__name__}")
        found = resolve([speedup])
        if len(found) != 1:
            raise ValueError(f"SpeedupCallback takes one speedup, got {speedup!r}")
        if found[0].prepares_run:
            raise ValueError(f"{found[0].name!r} runs before training: use fastloop.lightning.BatchSizeSearch() "
                             f"(callbacks('{found[0].name}') returns it)")
        self.speedup = found[0]
        self.inputs = inputs if inputs is not None else RunInputs()
        self.ctx: Context | None = None
        self.plan = StepPlan()
        self._loaders: list = []
        self._scale_before: torch.Tensor | None = None
        self._skipped: torch.Tensor | None = None
        self._graph: WholeStepGraph | None = None
        self.module: LightningModule | None = None
        self.tier: str | None = None
        """cuda_graph only: the tier that ran ("whole step", "forward+backward graphed", "eager")."""
        self.tier_why: str | None = None
        """Why the tier above it did not run."""
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

    def _wrap_train_loader(self, trainer: Trainer, fn) -> None:
        """Make ``fn(loader)`` transform the training loader the Trainer will ask for."""
        inst = train_source(trainer)

        def wrapped(loader: Any) -> Any:
            try:
                new = fn(loader)
            except Skip as why:  # asked for when the fit starts: the loader stays as it was
                self._fail(why.status, why.reason)
                return loader
            if new is not loader:
                self._loaders.append(new)
            return new

        if isinstance(inst, DataLoader) or (inst is not None and not hasattr(inst, "train_dataloader")):
            set_train_source(trainer, wrapped(inst))
            return
        if inst is None:
            raise RuntimeError("no training data source found on the Trainer")
        original = inst.train_dataloader
        patch_attr(inst, "train_dataloader", lambda: wrapped(original()), self._undo())

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        s = self.speedup
        self._graph = None
        self.module = pl_module
        self.tier = self.tier_why = None
        compiles = s.compile_mode() is not None or s.uses_cudagraphs()
        self._graphs_before = compiled_graph_count() if compiles else None  # Dynamo's import costs ~1 s
        self.ctx = ctx = Context(trainer.strategy.root_device, inputs=self._shared_inputs(trainer))
        if trainer.world_size > 1:
            ctx.ddp_kwargs = ddp_kwargs(trainer.strategy)
        reason = s.why_not(ctx) or s.why_not_model(pl_module)
        if reason:
            ctx.record(s.name, "skipped", reason)
            return
        plan = StepPlan()
        plan.apply(s, ctx)  # only fills a plan: nothing changes yet
        if plan.autocast_dtype is not None:
            reason = trainer_precision_conflict(trainer, plan.autocast_dtype, s.name)
            if reason:
                ctx.record(s.name, "skipped", reason)
                return
        try:
            if s.changes == "model":
                self._apply_model(pl_module, ctx)
            if s.changes == "data":
                self._wrap_train_loader(trainer, lambda loader: s.apply_loader(loader, ctx))
            self.plan = plan
            self._apply_plan(trainer, pl_module, ctx)
        except Skip as why:  # it cannot apply here: what it changed is put back, the reason is its record
            self._run_undo()
            ctx.record(s.name, why.status, why.reason)
            return
        except Exception as err:
            self._run_undo()
            ctx.record(s.name, "fallback", f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}")
            return
        if s.name not in ctx.records:
            ctx.record(s.name, "applied")

    def _apply_model(self, pl_module: LightningModule, ctx: Context) -> None:
        s = self.speedup
        mode = s.compile_mode()
        if mode is None:
            s.apply_model(pl_module, ctx)
            return
        # Lightning calls training_step, not pl_module.__call__: compile the children it calls
        children = compilable_children(pl_module)
        if not children:
            raise Skip(f"{type(pl_module).__name__} has no child module with parameters to compile (its parameters "
                       f"are used directly in training_step, which Lightning calls outside any compiled region)")
        for name, child in children:
            self._compile(child, lambda c=child: s.apply_model(c, ctx))
        _COMPILE_MODE[pl_module] = mode
        self._undo().append(lambda: _COMPILE_MODE.pop(pl_module, None))
        ctx.describe(s.name, "compiled " + ", ".join(f"{n} ({type(c).__name__})" for n, c in children)
                     + (f" in mode {mode}" if mode != "default" else ""))

    def _compile(self, child: torch.nn.Module, apply: Any) -> None:
        before = compiled_call(child)
        apply()
        self._undo().append(lambda: set_compiled_call(child, before))

    def _apply_plan(self, trainer: Trainer, pl_module: LightningModule, ctx: Context) -> None:
        plan = self.plan
        held = contextlib.ExitStack()  # the speedup's run context (TF32, cuDNN, ...) until teardown
        held.enter_context(self.speedup.run_context(ctx))
        self._undo().append(held.close)
        if plan.autocast_dtype is not None:
            try:
                from lightning.pytorch.plugins.precision import MixedPrecision
            except ImportError:  # pragma: no cover
                from pytorch_lightning.plugins.precision import MixedPrecision  # type: ignore[no-redef]
            mode = "bf16-mixed" if plan.autocast_dtype == torch.bfloat16 else "16-mixed"
            ctx.describe(self.speedup.name, f"Trainer precision {trainer.precision} -> {mode}")
            trainer.strategy.precision_plugin = MixedPrecision(mode, device=ctx.device.type)
        if plan.channels_last_inputs:
            # after the user's (module's or DataModule's) on_after_batch_transfer: the strategy
            # moves the batch and runs those hooks; the step sees what this returns
            original = trainer.strategy.batch_to_device

            def batch_to_device(*args: Any, **kwargs: Any) -> Any:
                return to_channels_last(original(*args, **kwargs))

            patch_attr(trainer.strategy, "batch_to_device", batch_to_device, self._undo())
        if plan.cuda_graph:
            # The whole step (training_step, backward, optimizer) as one graph where nothing in
            # the step needs the host (lightning_graph.py); otherwise forward+backward through
            # compile's CUDA graphs ("reduce-overhead") and the optimizer fused in on_fit_start.
            # If the compile speedup compiled the children already, its mode is raised instead:
            # one compilation (compile is lazy: nothing was compiled yet).
            already = _COMPILE_MODE.get(pl_module)
            blocker = whole_step_blocker(trainer, pl_module) if ctx.cuda else "no CUDA"
            if already not in CUDAGRAPH_MODES and blocker is None:
                self._graph = WholeStepGraph(trainer, pl_module, lambda obj, attr, value: patch_attr(obj, attr, value, self._undo()),
                                             on_fallback=self._graph_fallback)
                self.tier = "whole step"
                ctx.describe(self.speedup.name, self._graph.detail())
                return
            if blocker is not None:
                ctx.stats[f"{self.speedup.name}_whole_step"] = f"not captured whole: {blocker}"
            self._compiled_graphs(pl_module, ctx, blocker or "compile's CUDA graphs were asked for")

    def _compiled_graphs(self, pl_module: LightningModule, ctx: Context, why_not_whole: str) -> None:
        """The second tier: forward and backward through compile's CUDA graphs
        ("reduce-overhead", each step marked in on_train_batch_start), the optimizer fused and
        eager. If the compile speedup compiled the children already, its mode is raised instead
        (compile is lazy: before the first step nothing was compiled yet)."""
        name = self.speedup.name
        already = _COMPILE_MODE.get(pl_module)
        self.tier = "forward+backward graphed"
        self.tier_why = why_not_whole
        if already in CUDAGRAPH_MODES:
            ctx.stats[name] = f"captured by compile:{already}"
        else:
            children = compilable_children(pl_module)
            if not children:
                self.tier = "eager"
                self._fail("fallback", f"whole step: {why_not_whole}; {type(pl_module).__name__} has no child module "
                                       f"with parameters for compile's CUDA graphs: the steps run eagerly")
                return
            for _, child in children:
                self._compile(child, lambda c=child: c.compile(mode="reduce-overhead"))
            if already is not None:
                ctx.stats[name] = f"compile's mode raised from {already} to reduce-overhead"
            _COMPILE_MODE[pl_module] = "reduce-overhead"
            self._undo().append(lambda: _COMPILE_MODE.pop(pl_module, None))
        ctx.describe(name, f"{self.tier}; whole step: {why_not_whole}")

    def _graph_fallback(self, reason: str) -> None:
        """The whole step cannot be replayed (found while the run is under way): drop one tier, to
        compile's CUDA graphs of forward and backward, in the same run."""
        assert self.ctx is not None and self.module is not None
        self._graph = None
        self._compiled_graphs(self.module, self.ctx, reason)

    def on_fit_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self.ctx is None or self.speedup.name in self.ctx.records and not self.ctx.applied(self.speedup.name):
            return
        if self.speedup.changes == "optimizer":  # the speedup's own change, on each of the Trainer's optimizers
            changed = []
            for opt in trainer.optimizers:
                try:
                    self.speedup.apply_optimizer(opt, self.ctx)  # in place: the Trainer keeps its objects
                except Skip as why:
                    self._fail(why.status, why.reason)
                    continue
                changed.append(type(opt).__name__)
            if changed:
                self.ctx.describe(self.speedup.name, "fused " + ", ".join(changed))
        elif self.plan.cuda_graph:  # the graph's optimizer step runs fused where it can
            for opt in trainer.optimizers:
                reason = _fused_ok(opt)
                if reason:
                    self._fail("applied", reason)  # graphed all the same, the optimizer as it is
                else:
                    apply_fused_optimizer(opt)
        if self._graph is not None:
            cycling = cycled_hyperparameters(trainer)
            if len(trainer.optimizers) != 1:
                self._graph.fail(f"{len(trainer.optimizers)} optimizers (the graph takes one)")
            elif cycling:  # known before the first step: the next tier compiles before warm-up
                self._graph.fail(cycling)
            else:
                self._graph.prepare_optimizer(trainer.optimizers[0], self._undo())
        if self.plan.grad_scaler:
            self._hold_schedulers_on_skipped_steps(trainer)

    def _hold_schedulers_on_skipped_steps(self, trainer: Trainer) -> None:
        """fp16: Lightning steps LR schedulers after every batch; an optimizer step the scaler
        skipped (inf/NaN gradients) must not advance the schedule. Costs one host read of the
        scale per scheduler step (only with fp16 and a scheduler)."""
        for config in trainer.lr_scheduler_configs:
            sched = config.scheduler
            original = sched.step

            def step(*args: Any, _original=original, **kwargs: Any) -> Any:
                if self._last_step_skipped(trainer):
                    assert self.ctx is not None
                    self.ctx.stats["fp16_scheduler_steps_held"] = self.ctx.stats.get("fp16_scheduler_steps_held", 0) + 1
                    return None
                return _original(*args, **kwargs)

            patch_attr(sched, "step", step, self._undo())

    def _last_step_skipped(self, trainer: Trainer) -> bool:
        scaler = getattr(trainer.precision_plugin, "scaler", None)
        if scaler is None or scaler_scale(scaler) is None or self._scale_before is None:
            return False
        return bool((scaler_scale(scaler) < self._scale_before).item())

    def on_train_batch_start(self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int) -> None:
        if self.speedup.uses_cudagraphs() and self.ctx is not None and self.ctx.applied(self.speedup.name):
            # a new step: outputs of the previous step's graphs may be overwritten from here on
            torch.compiler.cudagraph_mark_step_begin()
        scaler = getattr(trainer.precision_plugin, "scaler", None)
        if self.plan.grad_scaler or (self.plan.autocast_dtype == torch.float16 and scaler is not None):
            if scaler is not None and scaler_scale(scaler) is not None:
                self._scale_before = scaler_scale(scaler).detach().clone()
            elif scaler is not None:  # the scale is created lazily at the first step: its initial value
                self._scale_before = torch.tensor(float(scaler.get_scale()))

    def on_train_batch_end(self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int) -> None:
        scaler = getattr(trainer.precision_plugin, "scaler", None)
        scale = scaler_scale(scaler) if scaler is not None else None
        if self._scale_before is not None and scale is not None:
            # the scale backs off exactly when the step was skipped (inf/NaN gradients); no sync
            skipped = (scale < self._scale_before.to(scale.device)).int()
            self._skipped = skipped if self._skipped is None else self._skipped + skipped

    def on_fit_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._check_compiled(pl_module)
        if self._graph is not None and self.ctx is not None and self._graph.failed is None:
            if self._graph.graph is None:  # the fit ended before the capture: nothing was graphed
                self._fail("skipped", f"the fit ended after {self._graph.steps} steps, before the whole step was "
                                      f"captured (after {self._graph.warmup} warm-up steps)")
            else:
                self.ctx.describe(self.speedup.name, self._graph.detail())
                if self._graph.capture_s is not None:
                    self.ctx.stats[f"{self.speedup.name}_capture_s"] = round(self._graph.capture_s, 3)
        if self.ctx is not None and self._skipped is not None:
            self.ctx.stats["fp16_skipped_steps"] = int(self._skipped.item())

    def _check_compiled(self, pl_module: LightningModule) -> None:
        """A compile that compiled nothing (every frame fell back to eager) is not ``applied``:
        ``fallback`` with torch's first graph-break reason. cuda_graph's tier is named."""
        ctx, name = self.ctx, self.speedup.name
        if ctx is None or not ctx.applied(name):
            return
        compiled = self.speedup.compile_mode() is not None or self.tier == "forward+backward graphed"
        graphs, frames = compiled_graph_count() if self._graphs_before is not None else (0, 0)
        if compiled and self._graphs_before is not None and graphs == self._graphs_before[0] \
                and frames > self._graphs_before[1]:  # frames were tried and none gave a graph
            why = first_graph_break() or "no frame of the model was compiled"
            self.tier = "eager" if self.tier else None
            self._fail("fallback", f"torch.compile compiled no graph, the steps ran eagerly: {why}")
            return
        if self.tier is not None:
            ctx.stats[f"{name}_tier"] = self.tier
            if self.tier_why:
                ctx.describe(name, f"{self.tier} (whole step: {self.tier_why})")

    def _undo(self) -> list:
        """Where every change to the user's objects registers how to put it back (run at teardown)."""
        assert self.ctx is not None
        return self.ctx.undo

    def _run_undo(self) -> None:
        if self.ctx is not None:
            while self.ctx.undo:
                self.ctx.undo.pop()()
        for loader in self._loaders:  # a rebuilt loader's persistent workers end with the fit
            shutdown_workers(loader)
        self._loaders.clear()

    def teardown(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        self._run_undo()

    def on_exception(self, trainer: Trainer, pl_module: LightningModule, exception: BaseException) -> None:
        self.teardown(trainer, pl_module, "fit")  # Lightning calls no teardown hook after an exception
