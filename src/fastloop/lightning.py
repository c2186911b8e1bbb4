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

from typing import Any

import torch
from torch.utils.data import DataLoader

from fastloop._compat import Callback, LightningModule, Trainer
from fastloop._lightning_private import set_train_source, train_source
from fastloop._torch_private import scaler_scale
from fastloop.data import to_channels_last
from fastloop.speedups.base import Context, Record, Speedup, StepPlan, resolve
from fastloop.speedups.compile import CUDAGRAPH_MODES
from fastloop.speedups.cudnn_benchmark import apply_cudnn_benchmark, has_conv
from fastloop.speedups.fused_optimizer import _fused_ok, apply_fused_optimizer
from fastloop.speedups.tf32 import apply_tf32, restore_tf32

__all__ = ["BatchSizeSearch", "SpeedupCallback", "callback_for", "callbacks", "records_of"]


def _wrap_train_loader(trainer: Trainer, fn) -> None:
    """Make ``fn(loader)`` transform the training loader the Trainer will ask for."""
    inst = train_source(trainer)
    if isinstance(inst, DataLoader) or (inst is not None and not hasattr(inst, "train_dataloader")):
        set_train_source(trainer, fn(inst))
        return
    if inst is None:
        raise RuntimeError("no training data source found on the Trainer")
    original = inst.train_dataloader
    inst.train_dataloader = lambda: fn(original())


class SpeedupCallback(Callback):
    """Apply one speedup to a Trainer. Its outcome is in :attr:`record`.

    Args:
        speedup: a speedup name (``"bf16"``) or a Speedup object.
    """

    def __init__(self, speedup: str | Speedup) -> None:
        if not isinstance(speedup, (str, Speedup)):
            raise TypeError(f"SpeedupCallback takes one speedup name (e.g. 'bf16') or a Speedup object, "
                            f"got {type(speedup).__name__}")
        found = resolve([speedup])
        if len(found) != 1:
            raise ValueError(f"SpeedupCallback takes one speedup, got {speedup!r}")
        self.speedup = found[0]
        self.ctx: Context | None = None
        self.plan = StepPlan()
        self._tf32_prev: dict | None = None
        self._cudnn_prev: bool | None = None
        self._scale_before: torch.Tensor | None = None
        self._skipped: torch.Tensor | None = None

    @property
    def state_key(self) -> str:
        return f"SpeedupCallback[{self.speedup.name}]"

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
        self.ctx = ctx = Context(trainer.strategy.root_device)
        reason = s.why_not(ctx)
        if reason:
            ctx.record(s.name, "skipped", reason)
            return
        try:
            if s.changes == "model":
                targets = [pl_module]
                mode = s.compile_mode()
                if mode is not None:  # training_step calls the children, not pl_module.__call__
                    targets = [c for c in pl_module.children() if any(True for _ in c.parameters())]
                for t in targets:
                    s.apply_model(t, ctx)
                if mode is not None:
                    pl_module._fastloop_compiled = True  # FLOP counting must not trace compiled code
                    pl_module._fastloop_compile_mode = mode
            if s.changes == "data" and not ctx.decided(s.name):
                _wrap_train_loader(trainer, lambda loader: s.apply_loader(loader, ctx))
            s.apply_step(self.plan, ctx)
            self._apply_plan(trainer, pl_module, ctx)
        except Exception as err:
            ctx.record(s.name, "fallback", f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}")
            return
        if s.name not in ctx.records:
            ctx.record(s.name, "applied")

    def _apply_plan(self, trainer: Trainer, pl_module: LightningModule, ctx: Context) -> None:
        plan = self.plan
        if plan.tf32:
            self._tf32_prev = apply_tf32(True)
        if plan.cudnn_benchmark:
            if not has_conv(pl_module):
                ctx.record(self.speedup.name, "skipped", "model has no convolution layers: nothing for cuDNN to tune")
            else:
                self._cudnn_prev = apply_cudnn_benchmark(True)
        if plan.autocast_dtype is not None:
            try:
                from lightning.pytorch.plugins.precision import MixedPrecision
            except ImportError:  # pragma: no cover
                from pytorch_lightning.plugins.precision import MixedPrecision  # type: ignore[no-redef]
            mode = "bf16-mixed" if plan.autocast_dtype == torch.bfloat16 else "16-mixed"
            trainer.strategy.precision_plugin = MixedPrecision(mode, device=ctx.device.type)
        if plan.channels_last_inputs:
            original = pl_module.on_after_batch_transfer

            def after_transfer(batch: Any, dataloader_idx: int) -> Any:
                return to_channels_last(original(batch, dataloader_idx))

            pl_module.on_after_batch_transfer = after_transfer  # type: ignore[method-assign]
        if plan.cuda_graph:
            # Lightning owns the optimizer step, so graph forward+backward through compile's
            # CUDA graphs ("reduce-overhead") and fuse the optimizer in on_fit_start. If the
            # compile speedup compiled the children already, its mode is raised instead: one
            # compilation (compile is lazy: nothing was compiled yet).
            already = getattr(pl_module, "_fastloop_compile_mode", None)
            if already in CUDAGRAPH_MODES:
                ctx.stats["cuda_graph"] = f"captured by compile:{already}"
            else:
                for child in pl_module.children():
                    if any(True for _ in child.parameters()):
                        child.compile(mode="reduce-overhead")
                if already is not None:
                    ctx.stats["cuda_graph"] = f"compile's mode raised from {already} to reduce-overhead"
                pl_module._fastloop_compile_mode = "reduce-overhead"
            pl_module._fastloop_compiled = True

    def on_fit_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self.ctx is None or self.speedup.name in self.ctx.records and not self.ctx.applied(self.speedup.name):
            return
        if self.speedup.changes == "optimizer" or self.plan.cuda_graph:
            for opt in trainer.optimizers:
                reason = _fused_ok(opt)
                if reason:
                    self._fail("skipped" if self.speedup.changes == "optimizer" else "applied", reason)
                    continue
                apply_fused_optimizer(opt)
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

            sched.step = step  # type: ignore[method-assign]

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
        if self.ctx is not None and self._skipped is not None:
            self.ctx.stats["fp16_skipped_steps"] = int(self._skipped.item())

    def teardown(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        if self._tf32_prev is not None:
            restore_tf32(self._tf32_prev)
            self._tf32_prev = None
        if self._cudnn_prev is not None:
            apply_cudnn_benchmark(self._cudnn_prev)
            self._cudnn_prev = None


def callback_for(speedup: Speedup) -> SpeedupCallback:
    return SpeedupCallback(speedup)


def callbacks(spec: str | list[str]) -> list[SpeedupCallback]:
    """One callback per speedup in ``spec`` (validated: unknown names raise FastloopError)."""
    if not isinstance(spec, (str, list, tuple)):
        raise TypeError(f"callbacks() takes a comma-separated string or a list of speedup names, got {type(spec).__name__}")
    return [SpeedupCallback(s) for s in resolve(spec)]


def records_of(trainer: Trainer) -> list[Record]:
    """The outcome of every fastloop speedup callback attached to ``trainer``."""
    return [c.record for c in trainer.callbacks if isinstance(c, SpeedupCallback)]


class BatchSizeSearch(Callback):
    """Search the batch size at the start of ``fit`` (see :mod:`fastloop.batch_size`).

    The Trainer's optimizers, schedulers and loop counters are untouched; the chosen size is
    written to the DataModule's or LightningModule's ``batch_size`` before the loaders are built.
    The result document is in :attr:`result`.

    Args:
        objective: ``"throughput"`` (fastest that fits under the margin) or ``"max"``.
        margin: use at most this fraction of the largest fitting size.
        max_size: never try above this.
    """

    def __init__(self, objective: str = "throughput", margin: float = 0.9, max_size: int = 4096,
                 speedups: str | None = None) -> None:
        if objective not in ("max", "throughput"):
            raise ValueError(f"objective must be 'max' or 'throughput', got {objective!r}")
        if isinstance(margin, bool) or not isinstance(margin, (int, float)) or not 0 < margin <= 1:
            raise ValueError(f"margin must be a number in (0, 1], got {margin!r}")
        if isinstance(max_size, bool) or not isinstance(max_size, int) or max_size < 1:
            raise ValueError(f"max_size must be an integer >= 1, got {max_size!r}")
        if speedups is not None:
            resolve(speedups)  # unknown names fail here, not at fit
        self.objective, self.margin, self.max_size, self.speedups = objective, margin, max_size, speedups
        self.result: dict | None = None

    def on_fit_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        from fastloop.batch_size import search_batch_size

        src = train_source(trainer)
        data = trainer.datamodule if trainer.datamodule is not None else src
        if data is pl_module:
            data = pl_module.train_dataloader()
        self.result = search_batch_size(pl_module, data, speedups=self.speedups, device=str(trainer.strategy.root_device),
                                        max_size=self.max_size, objective=self.objective, margin=self.margin,
                                        trainer_optimizers=trainer.optimizers)
        if isinstance(src, DataLoader) and src.batch_size != self.result["batch_size"]:
            from fastloop.data import rebuild_loader

            set_train_source(trainer, rebuild_loader(src, batch_size=self.result["batch_size"]))
