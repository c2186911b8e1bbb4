"""The Lightning adapter's :class:`~fastloop.speedups.run.Run`: each change a speedup asks for,
made at the hook where Lightning lets it happen, and put back at teardown.

The model and the loader change in ``setup`` (the loader when the Trainer asks for it), the
optimizers in ``on_fit_start`` (they do not exist before), the precision by swapping the
strategy's precision plugin, the batch after the strategy moved it to the device, the step as
CUDA graphs in tiers: the whole step (:mod:`fastloop.adapters.lightning_graph`), else forward and
backward through compile's CUDA graphs (the optimizer fused and eager). Every patch registers
how to undo it in ``ctx.undo``; :class:`fastloop.adapters.lightning.SpeedupCallback` runs them.

Example:
    >>> from fastloop.adapters.lightning_run import LightningRun
    >>> [m for m in ("change_model", "compile_step", "graph_step") if callable(getattr(LightningRun, m))]
    ['change_model', 'compile_step', 'graph_step']
"""

from __future__ import annotations

import contextlib
import warnings
import weakref
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch.utils.data import DataLoader

from fastloop._compat import LightningModule, Trainer
from fastloop._torch_private import compiled_call, set_compiled_call
from fastloop.adapters._lightning_private import prepare_train_loader, set_train_source, train_source
from fastloop.adapters.lightning_changes import (
    compilable_children,
    describe_children,
    loader_members,
    patch_attr,
    trainer_precision_conflict,
)
from fastloop.adapters.lightning_checkpoint import install_checkpoint_writer
from fastloop.adapters.lightning_graph import WholeStepGraph, whole_step_blocker
from fastloop.adapters.lightning_logging import defer_logged_reads
from fastloop.adapters.lightning_validation import ValidationLikeTraining, note_loader_change
from fastloop.speedups.base import Context, Skip
from fastloop.speedups.compile.compile import CUDAGRAPH_MODES, apply_compile, compiled_by_user
from fastloop.speedups.cuda_graph.cuda_graph import TierFacts, below_whole, common_blocker
from fastloop.speedups.deferred_logging import Cadence
from fastloop.speedups.run import Run, eval_loss

__all__ = ["HOOKS", "LightningRun", "graphs_unsafe", "held_gradients"]

_COMPILE_MODE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
"""The torch.compile mode a LightningModule's children were compiled with during this fit (so
that compile and cuda_graph compile once); emptied when the fit is torn down."""

_WHOLE_STEP: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
"""The LightningModules whose whole training step cuda_graph's engine replays in this fit (until it
falls a tier, or the fit is torn down): fast_validation leaves their training shapes to the engine."""

HOOKS = (
    "train_start",
    "validation_start",
    "validation_batch_start",
    "validation_batch_end",
    "validation_end",
    "fit_end",
)
"""The Lightning hooks at which a run's changes act while the fit runs (the callback calls each list)."""


def graphs_unsafe(trainer: Trainer, module: LightningModule) -> str | None:
    """Why compile's CUDA graphs (the second tier) would train wrong here, or None. Gradients held
    between steps (accumulation, manual optimization) stay in the graphs' pool, where the next
    replay overwrites them (pytorch/pytorch#169545); in one process they are copied out before
    each step (:func:`fastloop.adapters.lightning.own_held_gradients`), under DDP they are the
    reducer's and are left alone, so there the tier below runs: compiled, without graphs.

    Example:
        >>> from fastloop._compat import Trainer
        >>> from tests.targets import tiny_mlp
        >>> module, _ = tiny_mlp()
        >>> print(graphs_unsafe(Trainer(accelerator="cpu", devices=2, strategy="ddp", accumulate_grad_batches=2,
        ...                             logger=False), module))  # doctest: +NORMALIZE_WHITESPACE
        2 processes with accumulate_grad_batches=2: the gradients held between steps would be overwritten
        by the next replay
        >>> print(graphs_unsafe(Trainer(accelerator="cpu", accumulate_grad_batches=2, logger=False), module))
        None
    """
    held = held_gradients(trainer, module)
    if trainer.world_size <= 1 or held is None:
        return None
    return (
        f"{trainer.world_size} processes with {held}: "
        "the gradients held between steps would be overwritten by the next replay"
    )


def held_gradients(trainer: Trainer, module: LightningModule) -> str | None:
    """What makes a step hold its gradients over to the next (manual optimization, or
    ``accumulate_grad_batches`` > 1), or None: Lightning clears them before the next backward."""
    if not module.automatic_optimization:
        return "manual optimization"
    if trainer.accumulate_grad_batches > 1:
        return f"accumulate_grad_batches={trainer.accumulate_grad_batches}"
    return None


class LightningRun(Run):
    """One speedup callback's run on one fit.

    Args:
        trainer, module: the fit's Trainer and LightningModule.
        ctx: the callback's context (its ``undo`` list puts everything back).
        fail: ``fail(status, reason)`` records a change that failed after ``setup`` (at fit
            start, or while the fit runs) against the callback's speedup.
    """

    def __init__(
        self, trainer: Trainer, module: LightningModule, ctx: Context, fail: Callable[[str, str], None]
    ) -> None:
        self.trainer, self.model, self.ctx, self._fail = trainer, module, ctx, fail
        self.loaders: list = []
        """Loaders this run built (their persistent workers end with the fit)."""
        self.fit_start: list[Callable[[], None]] = []
        """Changes that wait for the optimizers (run by the callback's ``on_fit_start``)."""
        self.autocast_dtype: torch.dtype | None = None
        self.scale_loss = False
        """fp16's GradScaler: the callback holds the schedulers on the steps it skipped."""
        self.graph: WholeStepGraph | None = None
        """cuda_graph only: the whole step's driver, while the whole step may still replay."""
        self.hooks: dict[str, list[Callable[..., None]]] = {name: [] for name in HOOKS}
        """What runs at each of :data:`HOOKS` (the callback's hook of that name calls them, with the hook's
        arguments after the Trainer and the module)."""

    @property
    def undo(self) -> list:
        return self.ctx.undo

    def change_model(self, fn: Callable[[torch.nn.Module], torch.nn.Module]) -> None:
        # Lightning keeps its LightningModule: a change in place is made on it; a function that
        # returns a new object (a wrapper) is applied to each child with parameters instead, each
        # wrapper set in the child's place for this fit (the children are what training_step calls)
        out = fn(self.model)
        if out is None or out is self.model:
            return
        children = [(n, c) for n, c in self.model.named_children() if any(True for _ in c.parameters())]
        if not children:
            raise Skip(
                f"the speedup returns a new model ({type(out).__name__}), and Lightning keeps its "
                f"{type(self.model).__name__}, which has no child module with parameters to change instead"
            )
        for name, child in children:
            new = fn(child)
            if new is not None and new is not child:
                setattr(self.model, name, new)
                self.undo.append(lambda name=name, child=child: setattr(self.model, name, child))
        assert self.speedup is not None
        self.ctx.describe(
            self.speedup.name,
            "applied to "
            + ", ".join(n for n, _ in children)
            + f" (Lightning keeps {type(self.model).__name__}; its children were changed)",
        )

    def compile_step(self, mode: str, shapes: str = "auto") -> None:
        # Lightning calls training_step, not the module's __call__: compile the children it calls
        module = self.model
        children = compilable_children(module)
        if not children:
            raise Skip(
                f"{type(module).__name__} has no child module with parameters to compile (its parameters "
                f"are used directly in training_step, which Lightning calls outside any compiled region)"
            )
        theirs = [n for n, c in children if compiled_by_user(c)]
        children = [(n, c) for n, c in children if not compiled_by_user(c)]
        if not children:
            raise Skip(f"your code already compiles {', '.join(theirs)} (torch.compile returned it): left as it is")
        for _, child in children:
            self._compile(child, mode, shapes)
        _COMPILE_MODE[module] = mode
        self.undo.append(lambda: _COMPILE_MODE.pop(module, None))
        assert self.speedup is not None
        self.ctx.describe(
            self.speedup.name,
            "compiled "
            + describe_children(children)
            + (f" in mode {mode}" if mode != "default" else "")
            + (f", shapes {shapes}" if shapes != "auto" else "")
            + (f"; {', '.join(theirs)} left as your code compiled it" if theirs else ""),
        )

    def _compile(self, child: torch.nn.Module, mode: str, shapes: str = "auto") -> None:
        before = compiled_call(child)
        apply_compile(child, mode, shapes)
        self.undo.append(lambda: set_compiled_call(child, before))

    def change_optimizers(self, fn: Callable[[torch.optim.Optimizer], Any]) -> None:
        def each() -> None:  # in place, on each of the Trainer's optimizers: the Trainer keeps its objects
            for opt in self.trainer.optimizers:
                try:
                    fn(opt)
                except Skip as why:
                    self._fail(why.status, why.reason)

        self.fit_start.append(each)

    def change_loader(self, fn: Callable[[Iterable], Iterable]) -> None:
        """``fn`` transforms the training loader the Trainer will ask for, as Lightning prepares
        it (:func:`~fastloop.adapters._lightning_private.prepare_train_loader`: under DDP or FSDP
        with this rank's ``DistributedSampler``), so that a feed which is not a DataLoader keeps
        each rank's share."""
        inst = train_source(self.trainer)
        note_loader_change(self.trainer, self, fn, self.undo)  # fast_validation feeds validation through it too

        def wrapped(loader: Any) -> Any:
            members = loader_members(loader)  # several loaders (Lightning combines them): each changed alike
            parts = members or {None: loader}
            try:
                changed = {k: fn(prepare_train_loader(self.trainer, v)) for k, v in parts.items()}
            except Skip as why:  # asked for when the fit starts: the loader stays as it was
                self._fail(why.status, why.reason)
                return loader
            self.loaders.extend(v for k, v in changed.items() if v is not parts[k])
            if members is None:
                return changed[None]
            return changed if isinstance(loader, dict) else type(loader)(changed.values())

        if isinstance(inst, DataLoader) or (inst is not None and not hasattr(inst, "train_dataloader")):
            set_train_source(self.trainer, wrapped(inst), self.undo)
            return
        if inst is None:
            raise RuntimeError("no training data source found on the Trainer")
        original = inst.train_dataloader
        patch_attr(inst, "train_dataloader", lambda: wrapped(original()), self.undo)

    def change_batch(self, fn: Callable[[Any], Any]) -> None:
        # after the user's (module's or DataModule's) on_after_batch_transfer: the strategy moves
        # the batch and runs those hooks; the step sees what this returns
        original = self.trainer.strategy.batch_to_device

        def batch_to_device(*args: Any, **kwargs: Any) -> Any:
            return fn(original(*args, **kwargs))

        patch_attr(self.trainer.strategy, "batch_to_device", batch_to_device, self.undo)

    def batches_arrive_on_device(self) -> None:
        return None  # the strategy's copy of a batch already on the device is a no-op

    def batch_loss(self, batch: Any) -> torch.Tensor:
        module = self.model
        trainer = module.trainer

        def loss() -> Any:
            # training_step outside the loop: with the Trainer detached its self.log calls are
            # no-ops (LightningModule.log returns when no trainer is registered), nothing is recorded
            module.trainer = None
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    return module.training_step(batch, 0)
            finally:
                module.trainer = trainer

        return eval_loss(module, loss)

    def save_checkpoints_with(self, writer: Any) -> None:
        # the strategy's checkpoint IO, through which trainer.save_checkpoint and ModelCheckpoint save and delete
        install_checkpoint_writer(self.trainer, writer, self.undo)

    def hold(self, context: Callable[[], contextlib.AbstractContextManager]) -> None:
        held = contextlib.ExitStack()  # from setup until teardown (or until it did not apply)
        held.enter_context(context())
        self.undo.append(held.close)

    def defer_logging(self, every: int | None, seconds: float | None) -> None:
        """The Trainer's logger connector reads logged values late, all at once
        (:mod:`fastloop.adapters.lightning_logging`); put back, after a last read, at teardown."""
        defer_logged_reads(self.trainer, Cadence(every, seconds), self.undo, self.ctx.stats)

    def validate_like_training(self, options: Any) -> None:
        """fast_validation (:mod:`fastloop.adapters.lightning_validation`): the validation loaders fed in
        ``setup``, the shapes warmed at ``on_train_start``, the validation runs graphed and counted."""
        module = self.model
        ValidationLikeTraining(
            self, options, training_compile=lambda: _COMPILE_MODE.get(module), whole_step=lambda: module in _WHOLE_STEP
        ).install()

    def autocast(self, dtype: torch.dtype, *, scale_loss: bool = False) -> None:
        assert self.speedup is not None
        reason = trainer_precision_conflict(self.trainer, dtype, self.speedup.name)
        if reason:
            raise Skip(reason)
        try:
            from lightning.pytorch.plugins.precision import MixedPrecision
        except ImportError:  # pragma: no cover
            from pytorch_lightning.plugins.precision import MixedPrecision  # type: ignore[no-redef]
        mode = "bf16-mixed" if dtype == torch.bfloat16 else "16-mixed"
        self.ctx.describe(self.speedup.name, f"Trainer precision {self.trainer.precision} -> {mode}")
        strategy = self.trainer.strategy
        before = strategy.precision_plugin  # a property: set back through it (patch_attr restores instance attributes)
        strategy.precision_plugin = MixedPrecision(mode, device=self.ctx.device.type)
        self.undo.append(lambda: setattr(strategy, "precision_plugin", before))
        self.autocast_dtype, self.scale_loss = dtype, scale_loss

    def graph_step(self) -> None:
        """The whole step (training_step, backward, optimizer) as one graph where nothing in the
        step needs the host (the captured-step engine, driven by lightning_graph.py); otherwise
        the tier :func:`~fastloop.speedups.cuda_graph.cuda_graph.below_whole` gives (one fallback for both
        adapters). If the compile speedup compiled the children already, its mode is raised
        instead: one compilation (compile is lazy: nothing was compiled yet)."""
        assert self.speedup is not None
        already = _COMPILE_MODE.get(self.model)
        blocker = (
            common_blocker(cuda=self.ctx.cuda, scale_loss=self.scale_loss)
            or whole_step_blocker(self.trainer, self.model)
            or ("compile's CUDA graphs were asked for" if already in CUDAGRAPH_MODES else None)
        )
        if blocker is None:
            self.graph = WholeStepGraph(
                self.trainer,
                self.model,
                lambda obj, attr, value: patch_attr(obj, attr, value, self.undo),
                on_fallback=self._graph_fallback,
            )
            self.ctx.describe(self.speedup.name, self.graph.engine.detail())
            module = self.model
            _WHOLE_STEP[module] = True
            self.undo.append(lambda: _WHOLE_STEP.pop(module, None))
            self.fit_start.append(lambda: self.graph.prepare(self.undo) if self.graph is not None else None)
            return
        below_whole(self, self.speedup.name, blocker)

    def graph_tier_facts(self) -> TierFacts:
        already = _COMPILE_MODE.get(self.model)
        children = compilable_children(self.model)
        return TierFacts(
            compiled_mode=already,
            graphs_unsafe=graphs_unsafe(self.trainer, self.model) if already not in CUDAGRAPH_MODES else None,
            can_compile=bool(children) or already is not None,
        )

    def compile_for_tier(self, mode: str | None, *, mark_steps: bool) -> None:
        """The children compiled in ``mode`` (or the compile speedup's mode raised to it: compile is
        lazy, nothing was compiled before the first step). Every step is marked by the callback
        (``on_train_batch_start``) whatever the tier."""
        assert self.speedup is not None
        name, module = self.speedup.name, self.model
        already = _COMPILE_MODE.get(module)
        if mode is not None:
            if already is None or mode in CUDAGRAPH_MODES:
                for _, child in compilable_children(module):
                    self._compile(child, mode)
            if already is not None and mode != already:
                self.ctx.stats[name] = f"compile's mode raised from {already} to {mode}"
            _COMPILE_MODE[module] = mode
            self.undo.append(lambda: _COMPILE_MODE.pop(module, None))
        elif already in CUDAGRAPH_MODES:
            self.ctx.stats[name] = f"captured by compile:{already}"

    def _graph_fallback(self, reason: str) -> None:
        """The whole step cannot be replayed (found when the fit starts or while it trains): drop
        one tier, to compile's CUDA graphs of forward and backward, in the same run."""
        assert self.speedup is not None
        self.graph = None
        _WHOLE_STEP.pop(self.model, None)
        below_whole(self, self.speedup.name, reason)
