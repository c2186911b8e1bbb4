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


def test_lightning_logger_connector_privates_of_deferred_logging():
    """What deferred_logging overrides in Lightning's logger connector (their kinds), the names it
    reads there, and the one name of Lightning's result module it swaps while ``metrics`` runs."""
    import importlib
    import inspect

    from fastloop._compat import Callback, pl
    from tests.targets import Classifier

    connector_cls = importlib.import_module(
        f"{pl.__name__}.trainer.connectors.logger_connector.logger_connector"
    )._LoggerConnector
    for name, kind in lp.LOGGER_CONNECTOR_OVERRIDES.items():
        member = inspect.getattr_static(connector_cls, name, None)
        ok = isinstance(member, property) if kind == "property" else inspect.isfunction(member)
        assert ok, f"_LoggerConnector.{name} is no longer a {kind}: update fastloop/adapters/lightning_logging.py"
    assert list(inspect.signature(connector_cls.log_metrics).parameters) == ["self", "metrics", "step"]
    result = lp._result_module()
    assert "convert_tensors_to_scalars" in result._ResultCollection.metrics.__code__.co_names, (
        "_ResultCollection.metrics no longer converts the progress bar's values through the module's "
        "convert_tensors_to_scalars: update fastloop/adapters/_lightning_private.progress_bar_values_as_tensors"
    )

    class Shown(Classifier):
        def training_step(self, batch, batch_idx):
            out = super().training_step(batch, batch_idx)
            self.log("shown", out["loss"], prog_bar=True)
            return out

    seen: dict = {"stepped": [], "in_batch": [], "at_end": []}

    class Probe(Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            connector = lp.logger_connector(trainer)
            seen["stepped"].append(lp.batches_that_stepped(trainer))
            seen["in_batch"].append(lp.at_epoch_level(connector))
            with lp.progress_bar_values_as_tensors():
                seen["kept"] = connector.metrics["pbar"]["shown"]
            seen["read"] = connector.metrics["pbar"]["shown"]

        def on_train_epoch_end(self, trainer, pl_module):
            seen["at_end"].append(lp.at_epoch_level(lp.logger_connector(trainer)))

    torch.manual_seed(0)
    trainer = Trainer(
        max_steps=3,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[Probe()],
        accelerator="cpu",
    )
    connector = lp.logger_connector(trainer)
    restore = lp.swap_logger_connector(trainer, type("Mixin", (), {}))
    assert type(connector).__name__ == "Mixin_LoggerConnector" and isinstance(connector, connector_cls)
    restore()
    assert type(connector) is connector_cls and trainer._logger_connector is connector
    trainer.fit(Shown(), train_dataloaders=_loader_of_16())
    assert torch.is_tensor(seen["kept"]) and isinstance(seen["read"], float), "the progress bar's values changed"
    assert result.convert_tensors_to_scalars.__name__ == "convert_tensors_to_scalars"  # put back
    assert seen["stepped"] == [0, 1, 2], "fit_loop.epoch_loop._batches_that_stepped changed"
    assert seen["in_batch"] == [False] * 3 and seen["at_end"] == [True], "_LoggerConnector._first_loop_iter changed"
    assert lp.progress_bar_values(connector) is trainer.progress_bar_metrics, "_progress_bar_metrics changed"
    assert lp.logged_values(connector) is trainer.logged_metrics, "_logged_metrics changed"


def _loader_of_16():
    g = torch.Generator().manual_seed(0)
    return DataLoader(
        TensorDataset(torch.randn(48, 16, generator=g), torch.randint(0, 4, (48,), generator=g)), batch_size=16
    )


def test_the_fit_clocks_lightning_privates_see_a_validation_run_and_each_metric_write():
    """``fastloop fit`` wraps the validation loop's ``run`` and the logger connector's ``log_metrics``."""
    from tests.targets import fit_tiny

    module, data, _ = fit_tiny()
    seen = {"validation": 0, "logged": 0}

    def counting(key):
        def wrap(fn):
            def counted(*args, **kwargs):
                seen[key] += 1
                return fn(*args, **kwargs)

            return counted

        return wrap

    trainer = Trainer(
        max_epochs=1,
        log_every_n_steps=4,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        accelerator="cpu",
        default_root_dir=str(__import__("tempfile").mkdtemp()),
    )
    undo = [
        lp.wrap_validation_loop(trainer, counting("validation")),
        lp.wrap_logged_metrics(trainer, counting("logged")),
    ]
    trainer.fit(module, datamodule=data)
    assert seen["validation"] == 2, (
        "trainer.fit_loop.epoch_loop.val_loop.run moved (the sanity check and the epoch's run)"
    )
    assert seen["logged"] >= 4, (
        "trainer._logger_connector.log_metrics moved: update fastloop/adapters/_lightning_private.py"
    )
    for u in undo:
        u()
    assert "run" not in vars(trainer.fit_loop.epoch_loop.val_loop) and "log_metrics" not in vars(
        trainer._logger_connector
    )


def test_dynamos_compile_hooks_see_each_compile_begin_and_end():
    events = []
    undo = tp.compile_event_hooks(lambda a: events.append(("start", a)), lambda a: events.append(("end", a)))
    try:
        torch.compile(lambda x: x * 2 + 1, backend="eager")(torch.ones(3))
    finally:
        undo()
    assert [e for e, _ in events] == ["start", "end"], (
        "torch._dynamo.callback changed: update fastloop/_torch_private.py"
    )
    assert events[0][1].callback_trigger.name == "DYNAMO"
    torch.compile(lambda x: x * 3, backend="eager")(torch.ones(3))
    assert len(events) == 2  # undone: no more events


def test_lightning_prepares_a_training_loader_with_its_distributed_sampler_and_worker_seeding(monkeypatch):
    from torch.utils.data.distributed import DistributedSampler

    trainer = Trainer(accelerator="cpu", devices=2, strategy="ddp", logger=False)  # not launched: rank 0 of 2
    monkeypatch.setenv("PL_SEED_WORKERS", "1")  # what seed_everything(workers=True) sets
    loader = _loader()
    prepared = lp.prepare_train_loader(trainer, loader)
    assert isinstance(prepared.sampler, DistributedSampler) and prepared.sampler.num_replicas == 2, (
        "Lightning's _data_connector._prepare_dataloader changed: update fastloop/adapters/_lightning_private.py"
    )
    assert prepared.worker_init_fn is not None, "fabric's _auto_add_worker_init_fn changed"
    assert loader.worker_init_fn is None and lp.prepare_train_loader(trainer, prepared) is prepared
    one = Trainer(accelerator="cpu", devices=1, logger=False)
    assert lp.prepare_train_loader(one, loader) is loader  # one process: Lightning adds no sampler


def test_compiled_draws_as_eager_sets_inductors_fallback_random():
    import torch._inductor.config as config

    # config.patch, not monkeypatch: monkeypatch undoes a module attribute it read through
    # __getattr__ with delattr, which hides the setting from Inductor for the rest of the process
    with config.patch(fallback_random=False):
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
