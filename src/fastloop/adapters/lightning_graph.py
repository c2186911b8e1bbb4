"""The whole Lightning training step as one CUDA graph: forward, backward and optimizer step.

Lightning runs ``optimizer_step`` with a closure that calls ``training_step`` and ``backward``.
:class:`WholeStepGraph` is Lightning's driver of the captured-step engine
(:class:`fastloop.speedups.cuda_graph.captured_step.CapturedStep`, the same for the plain loop: its warm-up,
its optimizer preparation, its checks and guards): it hands the engine the batch after the
strategy's ``batch_to_device`` and one call of that hook (all of it: the training step, the
backward, gradient clipping and the optimizer's update); after a replay Lightning gets the step's
loss and the values the training step logged as if the closure had run. The host work of the step
(Lightning's hooks, autograd, the optimizer's Python) is paid once, at capture, instead of every
step.

What only Lightning has is checked here (:func:`whole_step_blocker`, before the first step):
a step counter or the batch index read by ``training_step`` (an annealed weight would freeze),
hooks of the module or of a callback that run inside the step (they would run once), manual
optimization, gradient accumulation, fp16's GradScaler, more than one process; before every step,
``accumulate_grad_batches`` (:func:`accumulating`: a ``GradientAccumulationScheduler`` raises it
at an epoch's start); and at capture, a value logged from ``training_step`` that is not a tensor
(it would freeze). Python side effects of ``training_step`` other than ``self.log`` (a counter, a
print) run once, at capture. A fit resumed with ``ckpt_path`` restores the optimizer after
``on_fit_start``: the engine sees the replaced param groups at the first step and prepares them
again, so the resumed fit replays the whole step.

Example (needs a GPU):
    ``Trainer(callbacks=fastloop.lightning.callbacks("bf16,compile,cuda_graph"))``
"""

from __future__ import annotations

from typing import Any

import torch

from fastloop._compat import Callback, LightningModule, Trainer
from fastloop.adapters._lightning_private import closure_result, current_hook, peek_closure_result, set_current_hook
from fastloop.adapters.step_source import step_reads_counters
from fastloop.speedups.cuda_graph.captured_step import CapturedStep, Entry
from fastloop.speedups.cuda_graph.cuda_graph import SCALER_BLOCKS

__all__ = ["HOOKS_IN_STEP", "WholeStepGraph", "accumulating", "whole_step_blocker"]

HOOKS_IN_STEP = ("on_before_backward", "on_after_backward", "on_before_optimizer_step", "on_before_zero_grad")
"""Callback and module hooks that Lightning calls inside the optimizer step."""

MODULE_STEP_METHODS = HOOKS_IN_STEP + (
    "backward",
    "optimizer_step",
    "optimizer_zero_grad",
    "configure_gradient_clipping",
)


def _overridden(name: str, obj: Any, parent: type) -> bool:
    mine = getattr(type(obj), name, None)
    return mine is not None and mine is not getattr(parent, name, None)


def _ours(fn: Any) -> bool:
    """fastloop's own hooks in the step (MeasureCallback.on_before_backward: manual optimization
    only) are known to be safe, also where a subclass inherits them."""
    return getattr(fn, "__module__", "").startswith("fastloop.")


def whole_step_blocker(trainer: Trainer, pl_module: LightningModule) -> str | None:
    """Why Lightning's step of ``pl_module`` on ``trainer`` cannot be captured whole (None: it can
    be tried; host syncs and logged values are checked at the step before capture).

    Example:
        >>> from fastloop._compat import Trainer
        >>> from tests.targets import tiny_mlp
        >>> module, _ = tiny_mlp()
        >>> print(whole_step_blocker(Trainer(accelerator="cpu", accumulate_grad_batches=4, logger=False), module))
        accumulate_grad_batches=4: the graph would step the optimizer every batch
    """
    if trainer.world_size > 1:
        return f"{trainer.world_size} processes: the whole step is captured on one device only"
    if not pl_module.automatic_optimization:
        return "manual optimization: the training step calls the optimizer itself"
    if trainer.accumulate_grad_batches != 1:
        return (
            f"accumulate_grad_batches={trainer.accumulate_grad_batches}: the graph would step the optimizer every batch"
        )
    plugin = trainer.strategy.precision_plugin
    if getattr(plugin, "scaler", None) is not None:
        return SCALER_BLOCKS
    if type(plugin).__name__ not in ("Precision", "MixedPrecision"):
        return f"the precision plugin {type(plugin).__name__} is not one the graph knows"
    own = [m for m in MODULE_STEP_METHODS if _overridden(m, pl_module, LightningModule)]
    if own:
        return (
            f"{type(pl_module).__name__} overrides {', '.join(own)}, which Lightning runs inside the step: "
            f"in a graph its Python would run once"
        )
    foreign = [
        f"{type(cb).__name__}.{h}"
        for cb in trainer.callbacks
        for h in HOOKS_IN_STEP
        if _overridden(h, cb, Callback) and not _ours(getattr(type(cb), h))
    ]
    if foreign:
        return f"callback hooks run inside the step ({', '.join(foreign)}): in a graph their Python would run once"
    what = step_reads_counters(pl_module)
    if what:
        explained = "(a " in what
        return f"training_step uses {what}" + (
            ""
            if explained
            else (
                ": the graph would replay the step with the value it had at capture (a warm-up or an annealed "
                "weight would stop changing)"
            )
        )
    return None


def accumulating(trainer: Trainer) -> str | None:
    """Why the next step cannot replay the whole step for the Trainer's accumulation now (a
    callback such as ``GradientAccumulationScheduler`` changes ``accumulate_grad_batches`` at an
    epoch's start), or None: one attribute read per step.

    Example:
        >>> from fastloop._compat import Trainer
        >>> trainer = Trainer(accelerator="cpu", logger=False)
        >>> print(accumulating(trainer))
        None
        >>> trainer.accumulate_grad_batches = 4
        >>> accumulating(trainer)
        'accumulate_grad_batches became 4: the graph would step the optimizer every batch'
    """
    n = trainer.accumulate_grad_batches
    return None if n == 1 else f"accumulate_grad_batches became {n}: the graph would step the optimizer every batch"


class WholeStepGraph:
    """Lightning's driver of the captured-step engine (see the module's docstring).

    Installed by the ``cuda_graph`` callback: it patches the strategy's ``batch_to_device`` (the
    batch the engine chose: the graph's static buffers from the capture on), the module's
    ``optimizer_step`` (the engine's route for the step) and, during a capture only, the module's
    ``log`` (the logged values are re-logged after every replay). :meth:`prepare` readies the
    optimizer when the fit starts.

    Args:
        trainer, pl_module: the fit.
        patch: ``patch(obj, attr, value)`` installs a patch that teardown removes.
        on_fallback: called with the reason when the step stops being replayed whole.
    """

    def __init__(self, trainer: Trainer, pl_module: LightningModule, patch: Any, on_fallback: Any = None) -> None:
        self.trainer, self.module = trainer, pl_module
        self.engine = CapturedStep(on_fallback=on_fallback, blocker=lambda: accumulating(trainer))
        original_b2d = trainer.strategy.batch_to_device
        self._original_step = pl_module.optimizer_step

        def batch_to_device(*args: Any, **kwargs: Any) -> Any:
            batch = original_b2d(*args, **kwargs)
            return self.engine.batch(batch) if trainer.training else batch

        def optimizer_step(*args: Any, **kwargs: Any) -> Any:
            return self._step(*args, **kwargs)

        patch(trainer.strategy, "batch_to_device", batch_to_device)
        patch(pl_module, "optimizer_step", optimizer_step)

    def prepare(self, undo: list) -> None:
        """When the optimizers exist: one optimizer, ready for the graph given the schedulers
        (fused or capturable, lr a device tensor); ``undo`` gets the lrs back as they were given.
        A fit resumed from a checkpoint restores the optimizer after this (``load_state_dict``
        replaces its param groups): the engine prepares the new groups at the first step."""
        if len(self.trainer.optimizers) != 1:
            self.engine.fail(f"{len(self.trainer.optimizers)} optimizers (the graph takes one)")
            return
        schedulers = [c.scheduler for c in getattr(self.trainer, "lr_scheduler_configs", []) or []]
        if self.engine.prepare(self.trainer.optimizers[0], schedulers, model=self.module):
            undo.append(self.engine.restore)

    def _step(self, epoch: int, batch_idx: int, optimizer: Any, closure: Any, *args: Any, **kwargs: Any) -> Any:
        def eager() -> Any:
            return self._original_step(epoch, batch_idx, optimizer, closure, *args, **kwargs)

        if not self.trainer.training:
            return eager()
        if self.engine.route != "capture":
            return self.engine.step(eager, replayed=lambda entry: self._replayed(closure, entry))
        module = self.module
        logs: list[tuple[str, Any, tuple, dict, Any]] = []

        def log(name: str, value: Any, *a: Any, **kw: Any) -> None:
            logs.append((name, value, a, kw, current_hook(module)))

        def recorded() -> Any:  # what the graph records: the step, its self.log calls noted
            module.log = log  # type: ignore[method-assign]
            try:
                return eager()
            finally:
                del module.log

        def kept(_: Any) -> tuple[Any, str | None]:
            bad = [(n, type(v).__name__) for n, v, _, _, _ in logs if not torch.is_tensor(v)]
            if bad:
                return None, (
                    f"training_step logs {', '.join(f'{n!r} as {t}' for n, t in bad)}: a graph replays "
                    f"tensor work only, so a Python value would freeze at its first value"
                )
            result = peek_closure_result(closure)
            if result is None or result.closure_loss is None:
                return None, "training_step returned no loss"
            return (result, logs), None

        return self.engine.step(
            eager, recorded=recorded, kept=kept, replayed=lambda entry: self._replayed(closure, entry)
        )

    def _replayed(self, closure: Any, entry: Entry) -> None:
        result, logs = entry.kept
        closure_result(closure, result)  # this step's outputs, as if the closure had run
        self._relog(logs)
        return None

    def _relog(self, logs: list[tuple[str, Any, tuple, dict, Any]]) -> None:
        """Log what the captured training step logged: the same calls, with this step's values
        (the tensors the graph just wrote), under the hook that logged them."""
        if not logs:
            return
        before = current_hook(self.module)
        try:
            for name, value, args, kwargs, hook in logs:
                set_current_hook(self.module, hook)
                self.module.log(name, value, *args, **kwargs)
        finally:
            set_current_hook(self.module, before)
