"""The whole Lightning training step as one CUDA graph: forward, backward and optimizer step.

Lightning runs ``optimizer_step`` with a closure that calls ``training_step`` and ``backward``.
After warm-up, :class:`WholeStepGraph` captures one call of that hook (all of it: the
training step, the backward, gradient clipping and the optimizer's update) into a CUDA graph
and from then on replays it: each step's batch is copied into the graph's static input
buffers, the graph is replayed, and Lightning gets the step's loss and the values the training
step logged as if the closure had run. The host work of the step (Lightning's hooks, autograd,
the optimizer's Python) is paid once, at capture, instead of every step.

What a graph cannot replay is checked before capture, and the step then stays eager with the
reason recorded: host syncs in the step (``.item()``, printing a tensor), a value logged from
``training_step`` that is not a tensor (it would freeze), a step counter or the batch index read
by ``training_step`` (an annealed weight would freeze), hooks of the module or of a callback
that run inside the step (they would run once), manual optimization, gradient accumulation,
fp16's GradScaler, more than one process. A batch of another shape (a bucket of ``pad_buckets``)
gets its own graph, up to ``MAX_GRAPHS``, all in one memory pool: its first step runs eagerly
(compile's code for the shape), its second is captured; past that it runs eagerly; a scheduler that changes a hyperparameter the graph baked in (momentum, betas) ends
the replays. Python side effects of ``training_step`` other than ``self.log`` (a counter, a
print) run once, at capture.

Example (needs a GPU):
    ``Trainer(callbacks=fastloop.lightning.callbacks("bf16,compile,cuda_graph"))``
"""

from __future__ import annotations

import time
from typing import Any

import torch

from fastloop._compat import Callback, LightningModule, Trainer
from fastloop.adapters._lightning_private import closure_result, current_hook, peek_closure_result, set_current_hook
from fastloop.data import map_tensors
from fastloop.adapters.step_source import step_reads_counters
from fastloop.errors import GraphIneligible
from fastloop.speedups.graph_capture import StepGraphs, copy_into, make_capturable, sync_lr

__all__ = ["HOOKS_IN_STEP", "WholeStepGraph", "whole_step_blocker"]

HOOKS_IN_STEP = ("on_before_backward", "on_after_backward", "on_before_optimizer_step", "on_before_zero_grad")
"""Callback and module hooks that Lightning calls inside the optimizer step."""

MODULE_STEP_METHODS = HOOKS_IN_STEP + ("backward", "optimizer_step", "optimizer_zero_grad",
                                       "configure_gradient_clipping")


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
        return f"accumulate_grad_batches={trainer.accumulate_grad_batches}: the graph would step the optimizer every batch"
    plugin = trainer.strategy.precision_plugin
    if getattr(plugin, "scaler", None) is not None:
        return "fp16's GradScaler checks the gradients for inf/NaN on the host every step"
    if type(plugin).__name__ not in ("Precision", "MixedPrecision"):
        return f"the precision plugin {type(plugin).__name__} is not one the graph knows"
    own = [m for m in MODULE_STEP_METHODS if _overridden(m, pl_module, LightningModule)]
    if own:
        return (f"{type(pl_module).__name__} overrides {', '.join(own)}, which Lightning runs inside the step: "
                f"in a graph its Python would run once")
    foreign = [f"{type(cb).__name__}.{h}" for cb in trainer.callbacks for h in HOOKS_IN_STEP
               if _overridden(h, cb, Callback) and not _ours(getattr(type(cb), h))]
    if foreign:
        return f"callback hooks run inside the step ({', '.join(foreign)}): in a graph their Python would run once"
    what = step_reads_counters(pl_module)
    if what:
        explained = "(a " in what
        return f"training_step uses {what}" + ("" if explained else (
            ": the graph would replay the step with the value it had at capture (a warm-up or an annealed "
            "weight would stop changing)"))
    return None


def _hyperparameters(optimizer: Any) -> list[dict]:
    """What the graph baked in: every number of every param group but a tensor lr (of the
    torch optimizer inside Lightning's LightningOptimizer)."""
    opt = getattr(optimizer, "optimizer", optimizer)
    return [{k: v for k, v in g.items() if k != "params" and not torch.is_tensor(v)} for g in opt.param_groups]




class WholeStepGraph:
    """Capture and replay Lightning's optimizer step (see the module's docstring).

    Installed by the ``cuda_graph`` callback: it patches the strategy's ``batch_to_device``
    (static input buffers), the module's ``optimizer_step`` (capture, then replay) and, during
    the capture only, the module's ``log`` (the logged values are re-logged after every
    replay). ``on_fit_start`` prepares the optimizer (fused or capturable, lr as a tensor).

    Args:
        trainer, pl_module: the fit.
        patch: ``patch(obj, attr, value)`` installs a patch that teardown removes.
        warmup: eager steps before the capture; the last one runs on a side stream and is
            watched for host syncs.
        on_fallback: called with the reason when the step must stay eager.
    """

    def __init__(self, trainer: Trainer, pl_module: LightningModule, patch: Any, warmup: int = 3,
                 on_fallback: Any = None) -> None:
        self.trainer, self.module = trainer, pl_module
        self.warmup = max(2, warmup)
        self.on_fallback = on_fallback
        self.graph: torch.cuda.CUDAGraph | None = None
        self.failed: str | None = None
        self.steps = 0
        self.replays = 0
        self.eager_after_capture = 0
        self.graphs = StepGraphs()
        """The capture core: each captured batch shape's (graph, static batch, closure result, logs,
        baked hyperparameters), one memory pool, which shape replays, is captured or stays eager."""
        self._static: Any = None
        self._shape_key: tuple | None = None
        self._result: Any = None
        self._logs: list[tuple[str, Any, tuple, dict, Any]] = []
        self._lr_pairs: list = []
        self._baked: list[dict] | None = None
        self._sync_checks = 2
        self._clean = False
        self._warm_key: tuple | None = None
        self._use_static = False
        self._capturing = False
        original_b2d = trainer.strategy.batch_to_device
        self._original_step = pl_module.optimizer_step

        def batch_to_device(*args: Any, **kwargs: Any) -> Any:
            return self._batch(original_b2d(*args, **kwargs))

        def optimizer_step(*args: Any, **kwargs: Any) -> Any:
            return self._step(*args, **kwargs)

        patch(trainer.strategy, "batch_to_device", batch_to_device)
        patch(pl_module, "optimizer_step", optimizer_step)

    # -- setup ---------------------------------------------------------------------------------
    def prepare_optimizer(self, optimizer: torch.optim.Optimizer, undo: list) -> None:
        """Make the optimizer capturable (its lr a device tensor where the implementation takes
        one); ``undo`` gets the function that puts float lrs back."""
        floats = [g["lr"] for g in optimizer.param_groups]
        try:
            self._lr_pairs = make_capturable(optimizer)
        except GraphIneligible as err:
            self.fail(str(err))
            return

        def restore() -> None:
            for g, old in zip(optimizer.param_groups, floats):
                if torch.is_tensor(g["lr"]) and not torch.is_tensor(old):
                    g["lr"] = float(g["lr"])

        undo.append(restore)

    # -- per step ------------------------------------------------------------------------------
    @property
    def active(self) -> bool:
        return self.failed is None and self.trainer.training

    def _batch(self, batch: Any) -> Any:
        """The batch the step sees: from the capture on, the graph's static buffers (this
        batch copied in) when the shapes match. The capture waits for a batch shaped like the
        checked warm-up step's (not a short last batch)."""
        self._use_static = False
        if not self.active or self.steps < self.warmup - 1:
            return batch
        key = StepGraphs.key(batch)
        if self.graph is None:
            if not self._clean:  # the checked step's batch: the capture will want this shape
                self._warm_key = key
                return batch
            if key != self._warm_key:
                return batch
            self._static = map_tensors(lambda t: t.clone(), batch)
            self._shape_key = key
            self._use_static = True
            return self._static
        route = self.graphs.route(key)
        if route == "replay":
            self._select(key)
            copy_into(self._static, batch)
            self._use_static = True
            return self._static
        if route == "capture":  # a shape's second step after the first capture: captured
            self._static = map_tensors(lambda t: t.clone(), batch)
            self._shape_key, self._capturing, self._use_static = key, True, True
            return self._static
        return batch

    def _select(self, key: tuple) -> None:
        """Replay the graph captured for batch shape ``key`` from now on."""
        self.graph, self._static, self._result, self._logs, self._baked = self.graphs.entries[key]
        self._shape_key = key

    def _step(self, epoch: int, batch_idx: int, optimizer: Any, closure: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            if not self.active or self.steps < self.warmup - 1:
                return self._original_step(epoch, batch_idx, optimizer, closure, *args, **kwargs)
            if self.graph is None:
                if not self._clean:
                    return self._checked_step(epoch, batch_idx, optimizer, closure, *args, **kwargs)
                if not self._use_static:  # another shape than the checked step's: capture a later one
                    return self._original_step(epoch, batch_idx, optimizer, closure, *args, **kwargs)
                return self._capture(epoch, batch_idx, optimizer, closure, *args, **kwargs)
            if not self._use_static:
                self.eager_after_capture += 1
                return self._original_step(epoch, batch_idx, optimizer, closure, *args, **kwargs)
            if self._capturing:  # a shape first seen after the first capture
                return self._capture(epoch, batch_idx, optimizer, closure, *args, **kwargs)
            if _hyperparameters(optimizer) != self._baked:
                self.fail("a scheduler changed an optimizer hyperparameter other than lr, which the graph baked in; "
                           "the steps from here on run eagerly")
                return self._original_step(epoch, batch_idx, optimizer, closure, *args, **kwargs)
            return self._replay(closure)
        finally:
            self.steps += 1

    def _checked_step(self, *args: Any, **kwargs: Any) -> Any:
        """An eager step on a side stream (PyTorch's warm-up before a capture) that fails the
        graph if anything in it synchronizes with the host."""
        if self.failed is not None:
            return self._original_step(*args, **kwargs)
        out, why = StepGraphs.checked(lambda: self._original_step(*args, **kwargs))
        self._clean = why is None
        if why is not None and "random numbers" in why:  # in code the source check cannot see (a library's transform)
            self.fail(why)
        elif why is not None:
            self._sync_checks -= 1
            if self._sync_checks <= 0:
                self.fail(why)
        return out

    def _capture(self, epoch: int, batch_idx: int, optimizer: Any, closure: Any, *args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        module = self.module
        original_log = module.log
        logs: list[tuple[str, Any, tuple, dict, Any]] = []

        def log(name: str, value: Any, *a: Any, **kw: Any) -> None:
            logs.append((name, value, a, kw, current_hook(module)))

        module.log = log  # type: ignore[method-assign]
        err: str | None = None
        late = bool(self.graphs.entries)
        try:
            graph, _ = self.graphs.capture(lambda: self._original_step(epoch, batch_idx, optimizer, closure, *args, **kwargs))
        except GraphIneligible as e:
            err = str(e)
        finally:
            del module.log
        if err is None:
            bad = [(n, type(v).__name__) for n, v, _, _, _ in logs if not torch.is_tensor(v)]
            if bad:
                err = (f"training_step logs {', '.join(f'{n!r} as {t}' for n, t in bad)}: a graph replays tensor work "
                       f"only, so a Python value would freeze at its first value")
            elif peek_closure_result(closure) is None or peek_closure_result(closure).closure_loss is None:
                err = "training_step returned no loss"
        self._capturing = False
        if err is not None and late:  # this shape stays eager; the shapes captured before replay on
            torch.cuda.synchronize()
            self.graphs.refuse(self._shape_key, err)
            self._select(next(iter(self.graphs.entries)))
            return self._original_step(epoch, batch_idx, optimizer, closure, *args, **kwargs)
        if err is not None:
            torch.cuda.synchronize()
            self.fail(err)
            # nothing of the captured step ran: run the step for real
            return self._original_step(epoch, batch_idx, optimizer, closure, *args, **kwargs)
        self.graph, self._logs = graph, logs
        self._result = peek_closure_result(closure)
        self._baked = _hyperparameters(optimizer)
        self.graphs.add(self._shape_key, (graph, self._static, self._result, logs, self._baked), time.perf_counter() - t0)
        graph.replay()  # this step, for real
        closure_result(closure, self._result)  # this step's outputs must not alias the graph's buffers
        self._relog(original_log)
        return None

    def _replay(self, closure: Any) -> None:
        sync_lr(self._lr_pairs)
        self.graph.replay()  # type: ignore[union-attr]
        closure_result(closure, self._result)
        self._relog(self.module.log)
        self.replays += 1

    def _relog(self, log: Any) -> None:
        """Log what the captured training step logged: the same calls, with this step's values
        (the tensors the graph just wrote), under the hook that logged them."""
        if not self._logs:
            return
        before = current_hook(self.module)
        try:
            for name, value, args, kwargs, hook in self._logs:
                set_current_hook(self.module, hook)
                log(name, value, *args, **kwargs)
        finally:
            set_current_hook(self.module, before)

    def fail(self, reason: str) -> None:
        """Keep the steps eager from here on, for ``reason`` (the first reason wins)."""
        if self.failed is None:
            self.failed = reason
            self.graph = None
            if self.on_fallback is not None:
                self.on_fallback(reason)

    def shapes_captured(self) -> dict:
        """The graphs per batch shape (:meth:`StepGraphs.summary`)."""
        return self.graphs.summary()

    def detail(self) -> str:
        """What happened, for the run record."""
        if self.failed is not None:
            return f"whole step not captured: {self.failed}"
        if self.graph is None:
            return "whole step: not captured yet"
        out = (f"whole step (forward, backward, optimizer) captured in {self.graphs.capture_s:.2f} s, "
               f"{self.replays} replays" + self.graphs.describe())
        if self.eager_after_capture:
            out += f", {self.eager_after_capture} steps of another batch shape eager"
        return out
