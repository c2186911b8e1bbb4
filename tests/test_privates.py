"""Pins every Lightning and torch private fastloop uses (fastloop/adapters/_lightning_private.py and
fastloop/_torch_private.py): when a release moves one, this fails and says which."""

from __future__ import annotations

import torch
from torch.utils.data import DataLoader, TensorDataset

from fastloop import _torch_private as tp
from fastloop._compat import Trainer
from fastloop.adapters import _lightning_private as lp


def _loader():
    return DataLoader(
        TensorDataset(torch.randn(8, 4), torch.zeros(8, dtype=torch.long)),
        batch_size=4,
        shuffle=True,
        generator=torch.Generator().manual_seed(0),
    )


def test_lightning_train_source_is_where_fit_put_it():
    from tests.targets import tiny_mlp

    module, loader = tiny_mlp()
    seen = {}

    class Probe(__import__("fastloop._compat", fromlist=["Callback"]).Callback):
        def setup(self, trainer, pl_module, stage):
            seen["source"] = lp.train_source(trainer)
            lp.set_train_source(trainer, seen["source"])

    trainer = Trainer(
        max_steps=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[Probe()],
        accelerator="cpu",
    )
    trainer.fit(module, train_dataloaders=loader)
    assert seen["source"] is loader, (
        "Lightning moved trainer.fit_loop._data_source.instance: update fastloop/adapters/_lightning_private.py"
    )


def test_grad_scaler_privates():
    scaler = torch.amp.GradScaler("cpu", init_scale=4.0)
    assert tp.scaler_scale(scaler) is None  # lazily created at the first step
    model = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler.scale(model(torch.randn(3, 2)).sum()).backward()
    scaler.step(opt)
    found = tp.found_inf(scaler, opt)
    assert torch.is_tensor(found) and found.item() == 0, "GradScaler._found_inf_per_device changed"
    scaler.update()
    assert torch.is_tensor(tp.scaler_scale(scaler)), "GradScaler._scale changed: update fastloop/_torch_private.py"


def test_conv_types_cover_every_conv():
    for conv in (
        torch.nn.Conv1d(1, 1, 1),
        torch.nn.Conv2d(1, 1, 1),
        torch.nn.Conv3d(1, 1, 1),
        torch.nn.ConvTranspose2d(1, 1, 1),
    ):
        assert isinstance(conv, tp.CONV_TYPES), "torch.nn.modules.conv._ConvNd changed"
    assert not isinstance(torch.nn.Linear(1, 1), tp.CONV_TYPES)


def test_dynamo_counters_have_the_keys_we_read():
    counters = tp.dynamo_counters()
    for key in ("stats", "graph_break"):
        assert hasattr(counters[key], "get"), f"torch._dynamo.utils.counters[{key!r}] changed"


def test_loader_auto_collation_and_base_seed_order():
    assert tp.loader_auto_collation(_loader()) is True
    assert tp.loader_auto_collation(DataLoader(list(range(4)), batch_size=None)) is False

    def indexed():
        return DataLoader(
            TensorDataset(torch.arange(16)), batch_size=16, shuffle=True, generator=torch.Generator().manual_seed(5)
        )

    want = next(iter(indexed()))[0].tolist()  # the order the loader's own iterator gives
    imitation = indexed()
    tp.draw_loader_base_seed(imitation)
    assert list(iter(imitation.sampler)) == want, (
        "a DataLoader iterator no longer draws one base seed before its sampler: update "
        "fastloop/_torch_private.draw_loader_base_seed"
    )
    plain = indexed()
    assert list(iter(plain.sampler)) != want  # without the draw the order differs: the pin can fail


def test_lightning_ddp_kwargs_reach_distributed_data_parallel():
    from fastloop._compat import DDPStrategy

    strategy = DDPStrategy(bucket_cap_mb=7)
    kwargs = lp.ddp_kwargs(strategy)
    assert kwargs == {"bucket_cap_mb": 7}, (
        "DDPStrategy._ddp_kwargs changed: update fastloop/adapters/_lightning_private.py"
    )
    assert lp.ddp_kwargs(object()) is None


def test_lightning_closure_result_and_current_hook():
    from fastloop._compat import Callback
    from tests.targets import tiny_mlp

    module, loader = tiny_mlp()
    seen: dict = {}
    original = module.optimizer_step

    def optimizer_step(epoch, batch_idx, optimizer, closure):
        original(epoch, batch_idx, optimizer, closure)  # runs the closure
        res = lp.peek_closure_result(closure)
        seen["loss"] = res.closure_loss.detach().clone()
        lp.closure_result(closure, res)  # what Lightning consumes next: a copy of res
        seen["hook"] = lp.current_hook(module)
        lp.set_current_hook(module, "training_step")
        seen["set"] = lp.current_hook(module)
        lp.set_current_hook(module, seen["hook"])

    module.optimizer_step = optimizer_step

    class Probe(Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            seen["out"] = outputs["loss"]

    trainer = Trainer(
        max_steps=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[Probe()],
        accelerator="cpu",
    )
    trainer.fit(module, train_dataloaders=loader)
    assert torch.equal(seen["out"], seen["loss"]), "Lightning moved Closure._result or ClosureResult"
    assert seen["hook"] == "optimizer_step" and seen["set"] == "training_step", (
        "Lightning moved LightningModule._current_fx_name: update fastloop/adapters/_lightning_private.py"
    )


def test_a_failed_rank_makes_rank_zero_leave_with_a_status_not_sigkill():
    """Lightning's observer of the ranks it started (``_ChildProcessObserver``): with fastloop's
    patch, a child that ended with an error is followed by ``leave()`` in rank 0 (after the
    other children are killed), not by SIGKILL of rank 0 itself; the patch is undone after."""
    import os
    import subprocess
    import sys

    cls = lp._observer()
    original = cls._terminate_all
    left: list[str] = []
    restore = lp.on_a_failed_rank(lambda: left.append("left"), grace_s=0.0)
    try:
        failed = subprocess.Popen([sys.executable, "-c", "raise SystemExit(1)"])
        alive = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        failed.wait()
        observer = cls(main_pid=os.getpid(), child_processes=[failed, alive], sleep_period=0)
        assert observer._run() is True  # it saw the failed child and terminated: we are still here
        assert left == ["left"]
        assert alive.wait(timeout=10) != 0  # the other rank was killed as Lightning does
    finally:
        restore()
    assert cls._terminate_all is original


def test_dynamos_recompile_limit_is_read():
    import torch._dynamo.config as config

    limit, dynamic = tp.recompile_limit()
    assert limit == getattr(config, "recompile_limit", getattr(config, "cache_size_limit", None)) and limit >= 1
    assert dynamic is config.automatic_dynamic_shapes


def test_compiled_draws_as_eager_sets_inductors_fallback_random(monkeypatch):
    import torch._inductor.config as config

    monkeypatch.setattr(config, "fallback_random", False)
    tp.compiled_draws_as_eager()
    assert config.fallback_random is True


def test_a_dataloaders_iterators_draw_their_indices_from_its_index_sampler():
    """``DataLoader._index_sampler`` is what its iterators take indices from: bounded at its length,
    a seeded RandomSampler is not asked past its last index (its generator draws no extra permutation)."""
    import inspect

    from torch.utils.data import DataLoader

    assert isinstance(inspect.getattr_static(DataLoader, "_index_sampler"), property)

    class Bounded(tp.IndexSamplerAtLength, DataLoader):
        pass

    def states(cls: type) -> tuple:
        loader = cls(list(range(8)), batch_size=4, shuffle=True, generator=torch.Generator().manual_seed(0))
        batches = [b.tolist() for b in loader]  # to the end: the iterator asks for one batch more
        return batches, loader.generator.get_state()

    plain, bounded = states(DataLoader), states(Bounded)
    assert plain[0] == bounded[0] and not torch.equal(plain[1], bounded[1])  # one permutation fewer drawn
