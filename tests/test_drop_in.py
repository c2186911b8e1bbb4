"""Drop-in, all of it: after ``fit`` with fastloop's callbacks, the Trainer (its precision plugin,
accumulation, callbacks, data source, schedulers), its strategy, the module (state layout,
attributes, hooks, class, modes), the DataModule and its loader (class, attributes, sampler,
collate) and the process's global switches are what a Trainer that never saw fastloop leaves,
so a later ``trainer.validate()`` runs as the user set it up. Compared field by field: weights'
values are not (bf16 trains other values), their dtype, shape, device and memory layout are.

What a finished fit leaves that is not compared: ``trainer.train_dataloader`` (Lightning's record
of the loader that trained, the feed where one applied; the next ``fit`` or ``validate`` replaces it)."""

from __future__ import annotations

import sys

import pytest
import torch

from fastloop._compat import LightningDataModule, Trainer
from fastloop.adapters._lightning_private import train_source
from fastloop.feed import live_feed_threads
from fastloop.lightning import SpeedupCallback, callbacks, records_of
from fastloop.speedups import REGISTRY

HOOKS = (
    "_forward_hooks",
    "_forward_pre_hooks",
    "_backward_hooks",
    "_backward_pre_hooks",
    "_state_dict_hooks",
    "_state_dict_pre_hooks",
    "_load_state_dict_pre_hooks",
    "_load_state_dict_post_hooks",
)


def describe(value, depth: int = 0):
    """What ``value`` is, without the values a training changes: a tensor's dtype, shape, device,
    strides and requires_grad; a callable's name; a container's items (two levels); else its type."""
    if torch.is_tensor(value):
        return ("tensor", str(value.dtype), tuple(value.shape), value.device.type, value.stride(), value.requires_grad)
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)) and depth < 2:
        return (type(value).__name__, [describe(v, depth + 1) for v in value])
    if isinstance(value, dict) and depth < 2:
        return {str(k): describe(v, depth + 1) for k, v in value.items()}
    if callable(value) and hasattr(value, "__qualname__"):
        return ("callable", getattr(value, "__module__", None), value.__qualname__)
    return type(value).__qualname__


def shallow(obj, skip: tuple = ()) -> dict:
    return {k: describe(v, 1) for k, v in vars(obj).items() if k not in skip}


def module_state(module: torch.nn.Module) -> dict:
    return {
        "class": type(module).__qualname__,
        "attributes": shallow(module, ("_trainer", "_modules", "_parameters", "_buffers", "_current_fx_name")),
        "children": [(n, type(c).__qualname__, c.training) for n, c in module.named_modules()],
        "hooks": {n: [len(getattr(c, h)) for h in HOOKS] for n, c in module.named_modules()},
        "tensors": {n: describe(t) for n, t in [*module.named_parameters(), *module.named_buffers()]},
        "instance_methods": sorted(
            k for k, v in vars(module).items() if callable(v) and not isinstance(v, torch.nn.Module)
        ),
    }


def loader_state(loader) -> dict:
    return {
        "class": type(loader).__qualname__,
        "attributes": shallow(loader, ("_iterator",)),
        "sampler": (type(loader.sampler).__qualname__, shallow(loader.sampler)),
        "batch_sampler": (type(loader.batch_sampler).__qualname__, shallow(loader.batch_sampler)),
        "collate_fn": loader.collate_fn,  # the same object the user gave
    }


def trainer_state(trainer: Trainer) -> dict:
    plugin = trainer.strategy.precision_plugin
    return {
        "precision": trainer.precision,
        "precision_plugin": (type(plugin).__qualname__, shallow(plugin)),
        "accumulate_grad_batches": trainer.accumulate_grad_batches,
        "callbacks": [type(c).__qualname__ for c in trainer.callbacks if not isinstance(c, SpeedupCallback)],
        "strategy": (type(trainer.strategy).__qualname__, shallow(trainer.strategy, ("_lightning_module", "_model"))),
        "attributes": shallow(trainer, ("callbacks",)),
        "data_source": type(train_source(trainer)).__qualname__,
        "optimizers": [
            [{k: describe(v) for k, v in g.items() if k != "params"} for g in opt.param_groups]
            for opt in trainer.optimizers
        ],
        "optimizer_state": [
            sorted({(k, str(describe(v))) for s in opt.state.values() for k, v in s.items() if k == "step"})
            for opt in trainer.optimizers
        ],
        "schedulers": [
            shallow(c.scheduler, ("last_epoch", "_last_lr", "_step_count")) for c in trainer.lr_scheduler_configs
        ],
    }


def process_state() -> dict:
    return {
        "switch_interval": sys.getswitchinterval(),
        "feed_threads": live_feed_threads(),
        "autocast": torch.is_autocast_enabled("cpu"),
        "grad": torch.is_grad_enabled(),
        "default_dtype": str(torch.get_default_dtype()),
        "matmul_precision": torch.get_float32_matmul_precision(),
        "cudnn_benchmark": torch.backends.cudnn.benchmark,
    }


class Data(LightningDataModule):
    """A DataModule handing out the user's loader."""

    def __init__(self, loader) -> None:
        super().__init__()
        self.loader = loader

    def train_dataloader(self):
        return self.loader


def _fit(target: str, spec: str | None, via: str):
    from tests import targets

    module, loader = getattr(targets, target)()
    data = Data(loader)
    trainer = Trainer(
        accelerator="cpu",
        max_steps=6,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=callbacks(spec) if spec else [],
    )
    if via == "datamodule":
        trainer.fit(module, datamodule=data)
    else:
        trainer.fit(module, train_dataloaders=loader)
    state = {
        "trainer": trainer_state(trainer),
        "module": module_state(module),
        "datamodule": (type(data).__qualname__, shallow(data, ("loader", "trainer", "_trainer"))),
        "loader": loader_state(loader),
        "process": process_state(),
    }
    return state, trainer, module, data


def _differences(want, got, where: str = "") -> list[str]:
    if isinstance(want, dict) and isinstance(got, dict):
        out = [f"{where}.{k}: only after a plain fit" for k in want.keys() - got.keys()]
        out += [f"{where}.{k}: only after fastloop's fit" for k in got.keys() - want.keys()]
        return out + [d for k in want.keys() & got.keys() for d in _differences(want[k], got[k], f"{where}.{k}")]
    return [] if want == got else [f"{where}: {want!r} vs {got!r}"]


@pytest.mark.parametrize(
    "target,spec,via",
    [
        ("masked_text", "workers:2,pad_buckets,prefetch,bf16,fused_optimizer", "datamodule"),
        ("masked_text", "gpu_resident,pad_buckets", "loader"),
        ("tiny_conv", "gpu_resident,bf16,channels_last,fused_optimizer", "datamodule"),
        pytest.param("tiny_conv", "compile", "loader", marks=pytest.mark.slow),
    ],
)
def test_after_fit_everything_is_as_a_trainer_that_never_saw_fastloop_leaves_it(target, spec, via, monkeypatch):
    for name in ("prefetch", "gpu_resident"):  # CUDA-only: on this CPU, let them apply
        monkeypatch.setattr(REGISTRY[name], "why_not", lambda self, ctx: None)
    plain, *_ = _fit(target, None, via)
    fast, trainer, module, data = _fit(target, spec, via)
    assert all(r.status == "applied" for r in records_of(trainer)), records_of(trainer)
    # the user's loader is what fit was given, through the DataModule or as it is
    assert train_source(trainer) is (data if via == "datamodule" else data.loader)
    assert data.train_dataloader() is data.loader and "train_dataloader" not in vars(data)
    differences = _differences(plain, fast)
    assert differences == [], "\n".join(differences)
