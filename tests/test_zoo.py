"""fastloop as a drop-in on ordinary LightningModules (tests/zoo.py), on the CPU.

For every zoo module and every speedup: the callback applies or is skipped with a reason, the
loss trajectory stays within the speedup's tolerance of a plain Trainer, the module (and its
DataModule) keep the same instance attributes as after a plain fit, and ``torch.save(module)``
works afterwards. The batch-size search completes on each of them with everything restored:
a plain Trainer at the size it chose trains exactly the same losses.
"""

from __future__ import annotations

import io
import logging
import warnings

import pytest
import torch
from torch.utils.data import DataLoader

from fastloop._compat import Callback, LightningDataModule, Trainer
from fastloop.drivers.runner import run_configuration
from fastloop.errors import FastloopError
from fastloop.lightning import BatchSizeSearch, SpeedupCallback, callbacks, records_of
from fastloop.measure.stats import RatioCI, verdict
from fastloop.speedups import REGISTRY
from fastloop.speedups.batch_size import search_batch_size
from tests import zoo

STEPS = 8

# the largest relative loss difference from the plain Trainer each speedup may cause on a CPU
TOLERANCE = {"bf16": 6e-2, "fused_optimizer": 1e-5, "channels_last": 1e-4, "compile": 1e-4}


class Losses(Callback):
    """The loss of each step as a plain user would see it (with manual optimization: the sum
    of the losses passed to manual_backward)."""

    def __init__(self) -> None:
        self.values: list[float | None] = []
        self._manual = 0.0

    def on_before_backward(self, trainer, pl_module, loss) -> None:
        self._manual += float(loss)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if not pl_module.automatic_optimization:
            self.values.append(self._manual)
            self._manual = 0.0
            return
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        self.values.append(None if loss is None else float(loss))


def _fit(build, extra_callbacks=(), steps: int = STEPS, **trainer_kwargs):
    torch.manual_seed(0)
    module, data = build()
    losses = Losses()
    trainer = Trainer(
        max_steps=steps,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        callbacks=[*extra_callbacks, losses],
        **trainer_kwargs,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
        if isinstance(data, LightningDataModule):
            trainer.fit(module, datamodule=data)
        elif data is None:
            trainer.fit(module)
        else:
            trainer.fit(module, train_dataloaders=data)
    return module, data, trainer, losses.values


def _rel(a: list, b: list) -> float:
    assert len(a) == len(b), (a, b)
    assert [x is None for x in a] == [x is None for x in b]
    return max((abs(x - y) / max(abs(y), 1e-8) for x, y in zip(a, b) if x is not None), default=0.0)


def _shape(obj) -> dict:
    """An object's instance attributes: name -> type (what a patch would change)."""
    return {k: type(v).__name__ for k, v in vars(obj).items()}


CPU_SPEEDUPS = sorted(n for n in REGISTRY if n not in ("batch_size", "compile"))


def _spec(name: str) -> str:
    return "workers:2" if name == "workers" else name  # a fixed count: applies whatever it measures


_PLAIN: dict = {}


def _plain(name: str):
    if name not in _PLAIN:
        module, data, _, losses = _fit(zoo.ZOO[name])
        _PLAIN[name] = (_shape(module), _shape(data) if isinstance(data, LightningDataModule) else None, losses)
    return _PLAIN[name]


def _check_drop_in(zoo_name: str, speedup: str) -> None:
    plain_shape, plain_dm_shape, plain_losses = _plain(zoo_name)
    cb = SpeedupCallback(_spec(speedup))
    module, data, trainer, losses = _fit(zoo.ZOO[zoo_name], [cb])
    rec = cb.record
    assert rec.status in ("applied", "skipped"), rec
    if rec.status == "skipped":
        assert rec.reason, f"{speedup} skipped without a reason"
        assert losses == plain_losses, f"{speedup} was skipped but the losses changed"
    else:
        diff = _rel(losses, plain_losses)
        assert diff <= TOLERANCE.get(speedup, 0.0), f"{zoo_name}/{speedup}: losses differ by {diff:.2e}"
    assert _shape(module) == plain_shape, f"{zoo_name}/{speedup} left the module changed"
    if plain_dm_shape is not None:
        assert _shape(data) == plain_dm_shape, f"{zoo_name}/{speedup} left the DataModule changed"
    torch.save(module, io.BytesIO())  # pickles as without fastloop


@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("zoo_name", sorted(zoo.ZOO))
def test_every_cpu_speedup_is_a_drop_in(zoo_name):
    for speedup in CPU_SPEEDUPS:
        _check_drop_in(zoo_name, speedup)


@pytest.mark.filterwarnings("ignore")
def test_compile_is_a_drop_in_and_says_what_it_compiled():
    _check_drop_in("patch_mlp", "compile")
    cb = SpeedupCallback("compile")
    _fit(zoo.patch_mlp, [cb], steps=2)
    assert cb.record.status == "applied" and cb.record.detail == "compiled mlp (Sequential)"


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("zoo_name", sorted(set(zoo.ZOO) - {"patch_mlp"}))
def test_compile_is_a_drop_in_on_the_zoo(zoo_name):
    # Inductor draws dropout masks from its own generator; eager's draws make the trajectories
    # comparable (bn_net has dropout: 33% apart without this). The compile card says so.
    import torch._inductor.config

    with torch._inductor.config.patch(fallback_random=True):
        _check_drop_in(zoo_name, "compile")


@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("zoo_name", sorted(zoo.ZOO))
def test_batch_size_search_restores_everything(zoo_name):
    """After the search, training is exactly what a plain Trainer does at the size it chose:
    weights, BatchNorm statistics, torchmetrics states and RNG streams were all put back."""
    search = BatchSizeSearch(max_size=64)
    module, data, trainer, losses = _fit(zoo.ZOO[zoo_name], [search])
    assert search.record.status == "applied", search.record
    assert search.result["restored"] is True
    chosen = search.result["batch_size"]
    assert 1 <= chosen <= 64 and f"batch size {chosen}" in search.record.detail
    torch.save(module, io.BytesIO())

    def at_chosen():
        m, d = zoo.ZOO[zoo_name](batch_size=chosen) if zoo_name != "batch_sampler" else zoo.ZOO[zoo_name](chosen)
        return m, d

    _, _, _, plain = _fit(at_chosen)
    assert losses == plain, f"{zoo_name}: training after the search differs from a plain run at {chosen}"


@pytest.mark.filterwarnings("ignore")
def test_batch_size_search_restores_batchnorm_and_metric_states():
    module, _ = zoo.bn_net()
    loader = module.train_dataloader()
    module.train_acc.update(torch.randn(4, 4), torch.tensor([0, 1, 2, 3]))  # a metric with state
    acc_before = module.train_acc.compute().clone()
    bn = module.features[1]
    stats_before = (bn.running_mean.clone(), bn.num_batches_tracked.clone())
    doc = search_batch_size(module, loader, device="cpu", max_size=32)
    assert doc["restored"] is True
    assert torch.equal(bn.running_mean, stats_before[0]) and torch.equal(bn.num_batches_tracked, stats_before[1])
    assert torch.equal(module.train_acc.compute(), acc_before)


@pytest.mark.filterwarnings("ignore")
def test_batch_size_limit_is_the_dataset_not_its_last_partial_batch():
    module, loader = zoo.batch_sampler_loader()  # 147 samples, a BatchSampler of the user's
    doc = search_batch_size(module, loader, device="cpu", max_size=4096, objective="max", margin=1.0)
    assert doc["max_fitting"] == 147, doc["trials"]


@pytest.mark.filterwarnings("ignore")
def test_batch_size_search_without_a_trainer_sets_up_the_datamodule():
    module, dm = zoo.datamodule_conv()
    assert dm.train_set is None
    doc = search_batch_size(module, dm, device="cpu", max_size=32)
    assert dm.hparams.batch_size == doc["batch_size"] and doc["written_to"] == "DataModule.hparams.batch_size"


def test_batch_size_search_refuses_when_nothing_holds_the_size():
    class NoSize(LightningDataModule):
        def train_dataloader(self):
            return DataLoader(zoo._vectors(), batch_size=8)

    with pytest.raises(FastloopError, match="neither the LightningModule nor the DataModule has a batch_size"):
        search_batch_size(zoo.Linear4(), NoSize(), device="cpu")
    search = BatchSizeSearch()
    _fit(lambda: (zoo.Linear4(), NoSize()), [search], steps=2)
    assert search.record.status == "skipped" and "batch_size attribute or hparam" in search.record.reason


@pytest.mark.filterwarnings("ignore")
def test_callbacks_batch_size_searches_and_records_what_it_chose():
    cbs = callbacks("batch_size,bf16")
    assert [type(c).__name__ for c in cbs] == ["SpeedupCallback", "BatchSizeSearch"]
    module, _, trainer, _ = _fit(zoo.bn_net, cbs, steps=2)
    rec = {r.name: r for r in records_of(trainer)}
    assert rec["batch_size"].status == "applied"
    # the fastest size under the margin is written to the module (on a loaded CPU the fastest may be
    # the module's own 16: which size wins is timing's, the search past 16 is not)
    assert module.hparams.batch_size == cbs[1].result["batch_size"] <= cbs[1].result["max_fitting"]
    assert cbs[1].result["max_fitting"] > 16 and f"batch size {module.hparams.batch_size}" in rec["batch_size"].detail
    with pytest.raises(ValueError, match="BatchSizeSearch"):
        SpeedupCallback("batch_size")


@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("precision", ["64-true", "bf16-true", "bf16-mixed"])
def test_bf16_keeps_the_precision_the_trainer_was_given(precision):
    cb = SpeedupCallback("bf16")
    module, _, trainer, _ = _fit(zoo.patch_mlp, [cb], steps=2, precision=precision)
    assert cb.record.status == "skipped" and precision in cb.record.reason
    assert str(trainer.precision) == precision
    if precision == "64-true":
        assert all(p.dtype == torch.float64 for p in module.parameters())


@pytest.mark.filterwarnings("ignore")
def test_channels_last_reaches_the_step_after_the_datamodules_batch_hook():
    cb = SpeedupCallback("channels_last")
    module, _, _, _ = _fit(zoo.datamodule_conv, [cb], steps=2)
    assert cb.record.status == "applied"
    assert module.last_input_channels_last is True
    plain, _, _, _ = _fit(zoo.datamodule_conv, steps=2)
    assert plain.last_input_channels_last is False


@pytest.mark.filterwarnings("ignore")
def test_compile_of_a_module_without_children_is_skipped():
    cb = SpeedupCallback("compile")
    _fit(zoo.own_params, [cb], steps=2)
    assert cb.record.status == "skipped" and "no child module with parameters" in cb.record.reason


@pytest.mark.filterwarnings("ignore")
def test_workers_keep_dropout_and_shuffles_over_several_epochs():
    """bn_net has dropout and 6 batches per epoch: 14 steps span three epochs."""
    _, _, _, plain = _fit(zoo.bn_net, steps=14)
    cb = SpeedupCallback("workers:2")
    module, _, trainer, losses = _fit(zoo.bn_net, [cb], steps=14)
    assert cb.record.status == "applied" and losses == plain
    assert "train_dataloader" not in vars(module)
    assert trainer.train_dataloader.num_workers == 2
    assert getattr(trainer.train_dataloader, "_iterator", None) is None, "the workers outlived the fit"


@pytest.mark.filterwarnings("ignore")
def test_run_counts_batches_with_manual_optimization():
    doc = run_configuration("tests/zoo.py:gan", "none", steps=10, warmup=2, device="cpu", steady_warmup=False)
    assert doc["steps"] == 10 and len(doc["losses"]) == 12
    assert all(v is not None and v > 0 for v in doc["losses"])
    assert "manual_backward" in doc["loss_definition"]


@pytest.mark.filterwarnings("ignore")
def test_run_keeps_steps_whose_training_step_returned_none():
    doc = run_configuration("tests/zoo.py:sometimes_none", "none", steps=9, warmup=0, device="cpu", steady_warmup=False)
    assert doc["steps"] == 9 and len(doc["losses"]) == 9
    assert [v is None for v in doc["losses"]] == [False, False, True] * 3
    assert any("returned None in 3 of 9 steps" in w for w in doc["warnings"])


@pytest.mark.filterwarnings("ignore")
def test_scheduler_monitoring_val_loss_is_held_not_an_error():
    doc = run_configuration("tests/zoo.py:plateau", "bf16", steps=6, warmup=1, device="cpu", steady_warmup=False)
    assert doc["steps"] == 6
    assert any("monitors 'val_loss'" in w for w in doc["warnings"])


def test_ab_verdict_names_both_sides_and_prints_the_ratio_one_way():
    # B/A = 0.30 (B slower) is said as B's ratio, "slower", not "A is 3.33x faster"
    ci = RatioCI(ratio=0.3, ci_low=0.25, ci_high=0.4, confidence=0.97, significant=True, runs=5)
    assert verdict(ci, label_a="none", label_b="bf16") == "bf16 is slower than none: 0.30x (97% CI 0.250-0.400)"
    ci = RatioCI(ratio=2.0, ci_low=1.8, ci_high=2.2, confidence=0.97, significant=True, runs=5)
    assert verdict(ci) == "B is 2.00x faster than A (97% CI 1.800-2.200)"
    ci = RatioCI(ratio=0.98, ci_low=0.9, ci_high=1.05, confidence=0.97, significant=False, runs=5)
    assert verdict(ci).startswith("no significant difference, a tie (0.980x")


@pytest.mark.filterwarnings("ignore")
def test_batch_size_search_with_a_resumed_adam_state():
    """Adam keeps a 0-dim ``step`` tensor once it has stepped (as after a resume)."""
    module, loader = zoo.lstm_lm()
    opt = torch.optim.Adam(module.parameters())
    module.training_step(next(iter(loader)), 0).backward()
    opt.step()
    assert opt.state and all(s["step"].dim() == 0 for s in opt.state.values())
    doc = search_batch_size(module, loader, device="cpu", max_size=16, trainer_optimizers=[opt])
    assert doc["restored"] is True
