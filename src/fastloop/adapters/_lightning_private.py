"""Every use of a Lightning private, in one place. Each says why and what public API would
replace it; ``tests/test_privates.py`` fails with a clear message when a release changes one.

Supported: lightning 2.5 and 2.6 (``pyproject.toml``), also as ``pytorch_lightning``.
"""

from __future__ import annotations

import time
from typing import Any

from fastloop._compat import Trainer
from fastloop.adapters.lightning_changes import patch_attr

__all__ = [
    "closure_result",
    "current_hook",
    "ddp_kwargs",
    "on_a_failed_rank",
    "peek_closure_result",
    "prepare_train_loader",
    "set_current_hook",
    "set_train_source",
    "train_source",
]


def train_source(trainer: Trainer) -> Any:
    """The DataLoader or DataModule given to ``fit`` (``trainer.fit_loop._data_source.instance``).

    Why: the data speedups change the training loader of a Trainer they did not build, in
    ``setup``, before Lightning asks for it. Lightning has no public setter for the train loader
    after ``fit`` is called (``trainer.train_dataloader`` is read-only and filled later); the
    public route would be for the user to pass our loader to ``fit`` themselves.
    """
    return trainer.fit_loop._data_source.instance


def set_train_source(trainer: Trainer, source: Any, undo: list | None = None) -> None:
    """Replace what ``train_source`` returns (same private, same reason); with ``undo``, for this
    fit only: ``undo`` gets the function that puts back what ``fit`` was given (the first
    replacement's original, whichever callback's undo runs first)."""
    if undo is None:
        trainer.fit_loop._data_source.instance = source
    else:
        patch_attr(trainer.fit_loop._data_source, "instance", source, undo)


def prepare_train_loader(trainer: Trainer, loader: Any) -> Any:
    """``loader`` as Lightning's fit loop prepares a training DataLoader before it iterates it:
    under DDP or FSDP a copy with Lightning's ``DistributedSampler`` (this rank's share, its seed,
    ``set_epoch`` each epoch), and Lightning's worker seeding where ``seed_everything(workers=True)``
    asked for it (``trainer._data_connector._prepare_dataloader`` and fabric's
    ``_auto_add_worker_init_fn``, the two steps of ``_process_dataloader`` that act on the loader);
    anything but a DataLoader, or a loader already given its sampler, comes back as it is.

    Why: a data speedup that hands Lightning something other than a DataLoader (``prefetch``'s
    background feed, ``gpu_resident``'s loaders, ``dali``'s pipeline) hides the DataLoader inside
    from that preparation, so every rank would read the whole data set; the speedups are given the
    loader Lightning itself would have trained on. Lightning has no public function for it; the
    public route is the user's own ``DistributedSampler`` with ``Trainer(use_distributed_sampler=False)``.
    """
    try:
        from lightning.fabric.utilities.data import _auto_add_worker_init_fn
        from lightning.pytorch.trainer.states import RunningStage
    except ImportError:  # pragma: no cover
        from lightning_fabric.utilities.data import _auto_add_worker_init_fn  # type: ignore[no-redef]
        from pytorch_lightning.trainer.states import RunningStage  # type: ignore[no-redef]
    from torch.utils.data import DataLoader

    if not isinstance(loader, DataLoader):
        return loader
    # shuffle=True: what Lightning's _process_dataloader passes for every training loader
    prepared = trainer._data_connector._prepare_dataloader(loader, shuffle=True, mode=RunningStage.TRAINING)
    _auto_add_worker_init_fn(prepared, trainer.global_rank)
    return prepared


def ddp_kwargs(strategy: Any) -> dict | None:
    """The keyword arguments Lightning's DDPStrategy passes to ``DistributedDataParallel``
    (``strategy._ddp_kwargs``; None for another strategy). Why: the ``ddp_comm`` speedup tunes
    DDP's gradient buckets of a Trainer it did not build, before the strategy wraps the model
    (after the callbacks' ``setup``). The public route is ``DDPStrategy(**kwargs)`` given to the
    Trainer by the user."""
    kwargs = getattr(strategy, "_ddp_kwargs", None)
    return kwargs if isinstance(kwargs, dict) else None


def closure_result(closure: Any, captured: Any) -> None:
    """Hand Lightning's optimizer closure a result without calling it (``closure._result``, a
    ``ClosureResult`` built from ``captured``, the result of the captured step, its tensors
    cloned). Why: a whole-step CUDA graph replays the training step, backward and optimizer step
    that the closure would run; Lightning then reads the step's loss through
    ``closure.consume_result()``, which has no public setter. The public route is manual
    optimization, which a drop-in callback cannot switch on for the user's module."""
    try:
        from lightning.pytorch.loops.optimization.automatic import ClosureResult
    except ImportError:  # pragma: no cover
        from pytorch_lightning.loops.optimization.automatic import ClosureResult  # type: ignore[no-redef]
    import torch

    extra = {k: v.detach().clone() if isinstance(v, torch.Tensor) else v for k, v in captured.extra.items()}
    closure._result = ClosureResult(closure_loss=captured.closure_loss.detach(), extra=extra)


def peek_closure_result(closure: Any) -> Any:
    """The result the closure's last call left for Lightning (``closure._result``; same reason)."""
    return closure._result


def current_hook(pl_module: Any) -> Any:
    """The hook Lightning is running on the module (``pl_module._current_fx_name``). Why: the
    whole-step graph re-issues, after each replay, the ``self.log`` calls its training step made
    at capture; Lightning files a logged value under the hook that logged it and checks that
    the hook may log. No public API sets it."""
    return pl_module._current_fx_name


def set_current_hook(pl_module: Any, name: Any) -> None:
    """Set what :func:`current_hook` returns (same private, same reason)."""
    pl_module._current_fx_name = name


def _observer() -> Any:
    try:
        from lightning.fabric.strategies.launchers.subprocess_script import _ChildProcessObserver
    except ImportError:  # pragma: no cover
        from lightning_fabric.strategies.launchers.subprocess_script import _ChildProcessObserver  # type: ignore
    return _ChildProcessObserver


def on_a_failed_rank(leave: Any, grace_s: float = 10.0) -> Any:
    """While a multi-rank fit runs: when a rank Lightning started ends with an error, rank 0
    (the launcher) kills the other ranks as Lightning does, gives its own main thread
    ``grace_s`` to end the process (with its own error, when rank 0 failed first), and then
    calls ``leave()`` (which ends the process with a status) instead of killing itself with
    SIGKILL. Returns the undo.

    Why: Lightning's ``_ChildProcessObserver._terminate_all`` (``lightning.fabric``, polled every
    5 s in rank 0) sends SIGKILL to the children and to rank 0 itself, so the command ended with
    status -9 instead of 1 whenever the observer saw the failed rank before rank 0's collective
    did (seen on a 2-core CI machine, 2026-12-03). There is no public hook for it.
    """
    cls = _observer()
    original = cls._terminate_all

    def terminate_all(self: Any) -> None:
        for p in self._child_processes:
            p.send_signal(self._termination_signal)
        time.sleep(grace_s)  # a daemon thread: ends with the process when the main thread ends it
        leave()

    cls._terminate_all = terminate_all
    return lambda: setattr(cls, "_terminate_all", original)
