"""The batch-size search's bookkeeping: where a target keeps its batch size (as Lightning's
``BatchSizeFinder`` looks for it), and the state a search must put back bitwise (weights,
BatchNorm statistics, torchmetrics states, optimizer state, RNGs).

Example:
    >>> import torch
    >>> m = torch.nn.BatchNorm1d(3)
    >>> snap = snapshot_state(m)
    >>> _ = m(torch.randn(4, 3))
    >>> restore_state(m, snap); bool(m.running_mean.abs().sum() == 0)
    True
"""

from __future__ import annotations

import hashlib
import random
from typing import Any

import numpy as np
import torch

from fastloop._compat import LIGHTNING_DEFAULT_MAX_EPOCHS, LightningDataModule, LightningModule

__all__ = ["set_batch_size", "trial_optimizer_conf"]


def _bytes(v: Any) -> bytes:
    """A tensor's bytes (0-dim tensors too: a byte view needs at least one dimension)."""
    if not torch.is_tensor(v):
        return repr(v).encode()
    return v.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes() if v.numel() else b""


def _metric_modules(module: torch.nn.Module) -> list[torch.nn.Module]:
    """torchmetrics metrics (their states are attributes, not buffers: state_dict leaves them out)."""
    return [m for m in module.modules() if hasattr(m, "_defaults") and hasattr(m, "_update_count")]


def state_digest(module: torch.nn.Module, optimizers: list) -> str:
    h = hashlib.sha256()
    for k, v in module.state_dict().items():
        h.update(k.encode())
        h.update(_bytes(v))
    for k, v in module.named_buffers():  # non-persistent buffers too
        h.update(k.encode())
        h.update(_bytes(v))
    for m in _metric_modules(module):
        for k in sorted(m._defaults):
            h.update(k.encode())
            v = getattr(m, k)
            for t in v if isinstance(v, list) else [v]:
                h.update(_bytes(t))
        h.update(repr(m._update_count).encode())
    for opt in optimizers:
        for st in opt.state.values():
            for k, v in sorted(st.items()):
                h.update(k.encode())
                h.update(_bytes(v))
        h.update(repr([{k: v for k, v in g.items() if k != "params"} for g in opt.param_groups]).encode())
    return h.hexdigest()


_PLAIN = (int, float, bool, str, type(None))


def snapshot_state(module: torch.nn.Module) -> dict:
    """Everything a trial step may change on the module: its state_dict, non-persistent buffers,
    torchmetrics states, and the plain Python attributes (counters, flags) of every submodule."""

    def clone(v: Any) -> Any:
        if torch.is_tensor(v):
            return v.detach().clone()
        if isinstance(v, list):
            return [clone(x) for x in v]
        return v

    return {
        "state": {k: v.detach().clone() for k, v in module.state_dict().items()},
        "buffers": {k: v.detach().clone() for k, v in module.named_buffers()},
        "metrics": [
            (
                m,
                {k: clone(getattr(m, k)) for k in m._defaults},
                {k: vars(m).get(k) for k in ("_update_count", "_computed", "_forward_cache")},
            )
            for m in _metric_modules(module)
        ],
        "plain": [(m, {k: v for k, v in vars(m).items() if isinstance(v, _PLAIN)}) for m in module.modules()],
    }


def restore_state(module: torch.nn.Module, snap: dict) -> None:
    with torch.no_grad():
        module.load_state_dict(snap["state"])
        for k, v in module.named_buffers():
            if k in snap["buffers"]:
                v.copy_(snap["buffers"][k])
    for m, states, extra in snap["metrics"]:
        for k, v in states.items():
            setattr(m, k, v)
        for k, v in extra.items():
            setattr(m, k, v)
    for m, attrs in snap["plain"]:
        for k, v in attrs.items():
            if vars(m).get(k, object()) is not v:
                vars(m)[k] = v


def rng_states() -> dict:
    st = {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        st["cuda"] = torch.cuda.get_rng_state_all()
    return st


def restore_rng_state(st: dict) -> None:
    torch.set_rng_state(st["torch"])
    np.random.set_state(st["numpy"])
    random.setstate(st["python"])
    if "cuda" in st:
        torch.cuda.set_rng_state_all(st["cuda"])


def size_holders(module: LightningModule, data: Any) -> list[tuple[Any, str]]:
    """Every place the target keeps its batch size, where Lightning's ``BatchSizeFinder`` looks:
    the module's attribute, its hparams, the DataModule's attribute, its hparams."""
    out: list[tuple[Any, str]] = []
    places: list[Any] = [module] + ([data] if isinstance(data, LightningDataModule) else [])
    for obj in places:
        if "batch_size" in vars(obj) or isinstance(getattr(type(obj), "batch_size", None), property):
            out.append((obj, "attr"))
        hp = getattr(obj, "hparams", None)
        try:
            if hp is not None and "batch_size" in hp:
                out.append((hp, "item"))
        except TypeError:  # hparams of a type without "in"
            pass
    return out


def current_size(holders: list[tuple[Any, str]]) -> int | None:
    if not holders:
        return None
    obj, kind = holders[-1]  # Lightning reads the last holder
    value = obj["batch_size"] if kind == "item" else obj.batch_size
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def set_batch_size(module: LightningModule, data: Any, size: int) -> str:
    """Write ``size`` everywhere the target keeps its batch size; returns where it went."""
    holders = size_holders(module, data)
    if not holders:
        return "nowhere (no batch_size attribute or hparam; the DataLoader is rebuilt instead)"
    names = []
    for obj, kind in holders:
        if kind == "item":
            obj["batch_size"] = size
            names.append(
                f"{'LightningModule' if obj is getattr(module, 'hparams', None) else 'DataModule'}.hparams.batch_size"
            )
        else:
            obj.batch_size = size
            names.append(f"{type(obj).__name__}.batch_size")
    return ", ".join(names)


NOWHERE = (
    "neither the LightningModule nor the DataModule has a batch_size attribute or hparam (where Lightning's "
    "BatchSizeFinder looks too): add one (e.g. self.save_hyperparameters() with a batch_size argument) and "
    "build train_dataloader() from it, or pass a DataLoader to train on"
)


class _TrialTrainer:
    """What ``configure_optimizers`` may read from ``self.trainer`` during a trial, which runs
    without a Trainer: a training of Lightning's default length (1000 epochs) on one device."""

    def __init__(self, batches_per_epoch: int) -> None:
        self.max_epochs, self.max_steps, self.accumulate_grad_batches = LIGHTNING_DEFAULT_MAX_EPOCHS, -1, 1
        self.estimated_stepping_batches = LIGHTNING_DEFAULT_MAX_EPOCHS * batches_per_epoch
        self.num_training_batches = batches_per_epoch
        self.world_size = self.num_devices = self.num_nodes = 1
        self.global_rank = self.local_rank = self.node_rank = self.current_epoch = self.global_step = 0
        self.is_global_zero = True

    def __getattr__(self, name: str) -> Any:
        raise AttributeError(
            f"the batch-size search's trials run without a Trainer: self.trainer.{name} is not "
            f"available to configure_optimizers there (max_epochs, max_steps, "
            f"estimated_stepping_batches, accumulate_grad_batches, world_size and the ranks are)"
        )


def trial_optimizer_conf(module: LightningModule, loader: Any) -> Any:
    """``module.configure_optimizers()`` for a trial. A module that sizes its schedule from
    ``self.trainer`` (``OneCycleLR(total_steps=self.trainer.estimated_stepping_batches)``, as the
    Lightning docs do) sees a stand-in Trainer of Lightning's default length while it runs.

    Example:
        >>> import torch
        >>> class M(LightningModule):
        ...     def __init__(self):
        ...         super().__init__(); self.w = torch.nn.Linear(2, 2)
        ...     def configure_optimizers(self):
        ...         opt = torch.optim.SGD(self.parameters(), lr=0.1)
        ...         steps = self.trainer.estimated_stepping_batches
        ...         return [opt], [torch.optim.lr_scheduler.OneCycleLR(opt, 0.1, total_steps=steps)]
        >>> conf = trial_optimizer_conf(M(), range(8))
        >>> conf[1][0].total_steps
        8000
    """
    try:
        module.trainer  # noqa: B018 - raises RuntimeError when the module is attached to no Trainer
    except RuntimeError:
        pass
    else:  # inside a Trainer (the BatchSizeSearch callback): the real one
        return module.configure_optimizers()
    try:
        batches = len(loader)
    except TypeError:  # an iterable without a length
        batches = 1000
    module.trainer = _TrialTrainer(batches)  # type: ignore[assignment]
    try:
        return module.configure_optimizers()
    finally:
        module.trainer = None  # type: ignore[assignment]
