"""Every use of a Lightning private, in one place. Each says why and what public API would
replace it; ``tests/test_privates.py`` fails with a clear message when a release changes one.

Supported: lightning 2.5 and 2.6 (``pyproject.toml``), also as ``pytorch_lightning``.
"""

from __future__ import annotations

import contextlib
import importlib
import time
from collections.abc import Callable, Iterator
from typing import Any

from fastloop._compat import Trainer, pl
from fastloop.adapters.lightning_changes import patch_attr

__all__ = [
    "LOGGER_CONNECTOR_OVERRIDES",
    "at_epoch_level",
    "batch_as_the_loop_moves_it",
    "batches_that_stepped",
    "closure_result",
    "current_hook",
    "ddp_kwargs",
    "evaluation_grad_mode",
    "logged_values",
    "logger_connector",
    "on_a_failed_rank",
    "peek_closure_result",
    "prepare_train_loader",
    "prepare_val_loader",
    "progress_bar_values",
    "progress_bar_values_as_tensors",
    "set_current_hook",
    "set_train_source",
    "set_val_source",
    "swap_logger_connector",
    "train_source",
    "val_source",
    "wrap_logged_metrics",
    "wrap_validation_loop",
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


def val_source(trainer: Trainer) -> Any:
    """What the fit's validation loaders come from (``trainer.fit_loop.epoch_loop.val_loop._data_source.instance``):
    the DataLoader(s) given to ``fit`` as ``val_dataloaders``, else the DataModule or the LightningModule
    whose ``val_dataloader`` Lightning calls. Why: ``fast_validation`` feeds the validation loaders as the
    training loader is fed, in ``setup``, before Lightning asks for them; as for :func:`train_source`,
    Lightning has no public setter, and the public route is the user's own loader."""
    return trainer.fit_loop.epoch_loop.val_loop._data_source.instance


def set_val_source(trainer: Trainer, source: Any, undo: list) -> None:
    """Replace what :func:`val_source` returns for this fit (same private, same reason); ``undo``
    gets the function that puts back what ``fit`` was given."""
    patch_attr(trainer.fit_loop.epoch_loop.val_loop._data_source, "instance", source, undo)


def prepare_val_loader(trainer: Trainer, loader: Any) -> Any:
    """``loader`` as Lightning's validation loop prepares a DataLoader before it iterates it: under
    DDP or FSDP a copy with Lightning's ``DistributedSampler`` (this rank's share, shuffled only
    where the loader shuffles), and Lightning's worker seeding (``trainer._data_connector._prepare_dataloader``
    with ``_is_dataloader_shuffled``, and fabric's ``_auto_add_worker_init_fn``: the steps of
    ``_process_dataloader`` for a validation loader that act on the loader); anything but a
    DataLoader comes back as it is. Why: as for :func:`prepare_train_loader`, a feed that is not a
    DataLoader would hide the loader from that preparation, and every rank would validate on the
    whole data set."""
    try:
        from lightning.fabric.utilities.data import _auto_add_worker_init_fn
        from lightning.pytorch.trainer.states import RunningStage
        from lightning.pytorch.utilities.data import _is_dataloader_shuffled
    except ImportError:  # pragma: no cover
        from lightning_fabric.utilities.data import _auto_add_worker_init_fn  # type: ignore[no-redef]
        from pytorch_lightning.trainer.states import RunningStage  # type: ignore[no-redef]
        from pytorch_lightning.utilities.data import _is_dataloader_shuffled  # type: ignore[no-redef]
    from torch.utils.data import DataLoader

    if not isinstance(loader, DataLoader):
        return loader
    shuffle = _is_dataloader_shuffled(loader)
    prepared = trainer._data_connector._prepare_dataloader(loader, shuffle=shuffle, mode=RunningStage.VALIDATING)
    _auto_add_worker_init_fn(prepared, trainer.global_rank)
    return prepared


def evaluation_grad_mode(trainer: Trainer) -> Callable[[], contextlib.AbstractContextManager]:
    """The grad mode Lightning's validation loop runs in (``torch.inference_mode``, or ``torch.no_grad``
    under gloo, XLA, FSDP or ``Trainer(inference_mode=False)``), as a context factory: the rule of
    ``lightning.pytorch.loops.utilities._no_grad_context``, asked of the fit's validation loop. Why:
    a compiled graph is specialized to its grad mode; ``fast_validation`` warms the validation step's
    graphs before the loop runs, in the loop's own mode, and Lightning exposes the rule only as the
    decorator of the loop's ``run``."""
    try:
        from lightning.pytorch.loops.utilities import _no_grad_context
    except ImportError:  # pragma: no cover
        from pytorch_lightning.loops.utilities import _no_grad_context  # type: ignore[no-redef]
    import torch

    seen: list[Any] = []

    def note(loop: Any) -> None:  # run inside the decorator's context: which mode it entered
        seen.append(torch.inference_mode if torch.is_inference_mode_enabled() else torch.no_grad)

    _no_grad_context(note)(trainer.fit_loop.epoch_loop.val_loop)
    return seen[0]


def batch_as_the_loop_moves_it(trainer: Trainer, batch: Any, dataloader_idx: int = 0) -> Any:
    """``batch`` as Lightning's loops hand it to a step: the precision plugin's ``convert_input``, the
    module's ``on_before_batch_transfer`` (``LightningModule._on_before_batch_transfer``), then the
    strategy's ``batch_to_device`` (the device, ``transfer_batch_to_device``, ``on_after_batch_transfer``,
    and what a speedup's ``change_batch`` added). Why: ``fast_validation`` warms the steps on batches
    built before the loops run, which must reach the step exactly as the loops' batches do (a layout or
    dtype the loop changes is part of what a compiled graph is specialized to); the first of the three
    steps is a private method of the module, and Lightning has no public function for the sequence."""
    batch = trainer.precision_plugin.convert_input(batch)
    batch = trainer.lightning_module._on_before_batch_transfer(batch, dataloader_idx=dataloader_idx)
    return trainer.strategy.batch_to_device(batch, dataloader_idx=dataloader_idx)


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
    did (seen on a 2-core CI machine). There is no public hook for it.
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


# --- the logger connector, for deferred_logging (fastloop/adapters/lightning_logging.py) ---
# Why, for all of these: Lightning reads logged values to the host (.item()) inside its private
# logger connector, after every step for prog_bar values, and offers no public way to read them
# later (Lightning-AI/pytorch-lightning#20995 asks for a recipe to avoid the sync; #21232, open,
# proposes skipping the conversion when no progress bar is shown). The public route is for the user to log without
# prog_bar=True and with a large log_every_n_steps.

LOGGER_CONNECTOR_OVERRIDES: dict[str, str] = {
    "metrics": "property",
    "progress_bar_metrics": "property",
    "log_metrics": "method",
    "on_batch_end": "method",
    "reset_metrics": "method",
}
"""The members of Lightning's ``_LoggerConnector`` that deferred logging's connector overrides
(calling Lightning's own through ``super()``), with their kind."""

_SWAPPED: dict[tuple[type, type], type] = {}


def logger_connector(trainer: Trainer) -> Any:
    """The Trainer's logger connector (``trainer._logger_connector``, a ``_LoggerConnector``)."""
    return trainer._logger_connector


def swap_logger_connector(trainer: Trainer, mixin: type) -> Callable[[], None]:
    """Make the Trainer's logger connector an instance of a subclass of its own class with ``mixin``
    first (its ``__class__`` changed in place, so the Trainer, its loops and its progress bar keep
    the object they hold); returns the undo. Why a class: two of the members overridden
    (:data:`LOGGER_CONNECTOR_OVERRIDES`) are properties, which an instance attribute cannot shadow."""
    connector = logger_connector(trainer)
    original = type(connector)
    key = (mixin, original)
    if key not in _SWAPPED:
        _SWAPPED[key] = type(f"{mixin.__name__}{original.__name__}", (mixin, original), {})
    swapped = _SWAPPED[key]
    connector.__class__ = swapped

    def undo() -> None:
        if type(connector) is swapped:
            connector.__class__ = original

    return undo


def progress_bar_values(connector: Any) -> dict:
    """The numbers the progress bar shows (``connector._progress_bar_metrics``, the dict itself)."""
    return connector._progress_bar_metrics


def logged_values(connector: Any) -> dict:
    """What ``trainer.logged_metrics`` holds (``connector._logged_metrics``, the dict itself)."""
    return connector._logged_metrics


def at_epoch_level(connector: Any) -> bool:
    """True outside the batches of a loop, at an epoch's start or end (``connector._first_loop_iter
    is None``): there Lightning computes the epoch's values, once per epoch."""
    return connector._first_loop_iter is None


def batches_that_stepped(trainer: Trainer) -> int:
    """The step Lightning logs a training row at (``trainer.fit_loop.epoch_loop._batches_that_stepped``,
    what ``_LoggerConnector.log_metrics`` reads when it is given no step)."""
    return trainer.fit_loop.epoch_loop._batches_that_stepped


def _result_module() -> Any:
    return importlib.import_module(f"{pl.__name__}.trainer.connectors.logger_connector.result")


@contextlib.contextmanager
def progress_bar_values_as_tensors() -> Iterator[None]:
    """While inside, ``_ResultCollection.metrics`` leaves its progress-bar values as tensors instead
    of reading each to the host: the name ``convert_tensors_to_scalars`` in Lightning's ``result``
    module, which ``metrics`` calls for those values and nothing else, is the identity until exit
    (a name of the module, for the length of one call: a Trainer's loops run in one thread)."""
    result = _result_module()
    original = result.convert_tensors_to_scalars
    result.convert_tensors_to_scalars = lambda value: value
    try:
        yield
    finally:
        result.convert_tensors_to_scalars = original


def wrap_validation_loop(trainer: Trainer, wrap: Any) -> Any:
    """Replace the fit's validation loop's ``run`` with ``wrap(run)`` on this Trainer
    (``trainer.fit_loop.epoch_loop.val_loop.run``; the sanity check runs it too); returns the undo.
    Why: ``fastloop fit`` charges a whole validation run to its validation phase, from the
    validation loader's set-up to the model back in train mode; Lightning's hooks and profiler
    actions begin inside it (``on_validation_start`` runs after the loader is set up and the
    model put in eval mode), and no public hook spans it."""
    loop = trainer.fit_loop.epoch_loop.val_loop
    loop.run = wrap(loop.run)
    return lambda: loop.__dict__.pop("run", None)


def wrap_logged_metrics(trainer: Trainer, wrap: Any) -> Any:
    """Replace the Trainer's metric logging (``trainer._logger_connector.log_metrics``: logged
    tensors turned into Python numbers, a read to the host, then every logger's ``log_metrics``
    and ``save``) with ``wrap(log_metrics)``; returns the undo. Why: ``fastloop fit`` charges that
    read and the loggers' writes to its host-sync phase; the loggers' own public ``log_metrics``
    is called after the read, and no public hook sees it."""
    connector = trainer._logger_connector
    connector.log_metrics = wrap(connector.log_metrics)
    return lambda: connector.__dict__.pop("log_metrics", None)
