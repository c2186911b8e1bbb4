"""fast_validation (docs/speedups/fast_validation.md): the validation loop fed, compiled, warmed and
counted as the training step is, changing nothing that trains or what validation computes.

On the CPU the model is compiled by Dynamo with the "eager" backend (it traces, guards and recompiles
as with Inductor, and generates nothing), so that a fit takes seconds: every validation sample is
evaluated once with a short last batch, the metrics equal an eager validation exactly (in fp32) and
within bf16's band, the warm-up leaves no state behind (the training losses and the optimizer equal a
fit without it), no compile follows the warm-up where at least one does without it, the shared
recompile limit is raised, the validation loader gets workers under ``workers`` and each rank its
share under DDP. On the GPU (``-m gpu``): the validation step's CUDA graphs and the count."""

from __future__ import annotations

import random
import time
import warnings

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler

from fastloop._compat import Callback, Trainer
from fastloop.errors import FastloopError
from fastloop.lightning import callbacks, records_of
from fastloop.speedups import resolve
from fastloop.speedups.base import Context, Speedup
from fastloop.speedups.fast_validation import CompileCount, KeptState, epoch_batch_indices
from fastloop.speedups.ladder_traits import LadderTraits
from fastloop.speedups.run import Run
from tests.fast_validation_target import VAL, PaddedText, ShortBatches, loaders, padded_loaders

pytestmark = pytest.mark.filterwarnings("ignore")


class Seen(Callback):
    """The training loss of every step and the validation metrics of every validation run after the sanity check."""

    def __init__(self) -> None:
        self.losses: list[float] = []
        self.metrics: list[dict[str, float]] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.losses.append(outputs["loss"].item())

    def on_validation_end(self, trainer, pl_module) -> None:
        if not trainer.sanity_checking:
            self.metrics.append({k: v.item() for k, v in trainer.callback_metrics.items() if k.startswith("val_")})


def _stats(trainer: Trainer) -> dict:
    """The statistics of the fit's fast_validation callback ({} without one)."""
    found = [
        c.ctx.stats for c in trainer.callbacks if getattr(c, "speedup", None) and c.speedup.name == "fast_validation"
    ]
    return found[0] if found and found[0] is not None else {}


def _fit(spec: str | None, *, compiled: bool = True, epochs: int = 1, children: int = 1, **trainer_kw) -> dict:
    """One fit of tests/fast_validation_target.py from a cold compiler; what it trained and validated."""
    torch.compiler.reset()  # each fit compiles from nothing, as in its own process
    torch.manual_seed(0)
    module = ShortBatches(children)
    if compiled and children == 1:  # the user's own compile (more children: the compile speedup's)
        module.net = torch.compile(module.net, backend="eager")
    train, val = loaders()
    seen = Seen()
    trainer = Trainer(
        max_epochs=epochs,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[seen, *(callbacks(spec) if spec else [])],
        **trainer_kw,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(module, train_dataloaders=train, val_dataloaders=val)
    stats = _stats(trainer)
    return {
        "module": module,
        "trainer": trainer,
        "losses": seen.losses,
        "metrics": seen.metrics,
        "records": {r.name: r for r in records_of(trainer)},
        "stats": stats.get("fast_validation"),
        "optimizer": trainer.optimizers[0].state_dict(),
    }


@pytest.fixture(scope="module")
def fits() -> dict[str, dict]:
    """The fits the tests compare, each once (two epochs: a validation run after training moved on):
    eager, compiled, and compiled with fast_validation's rules."""
    return {
        "eager": _fit(None, compiled=False, epochs=2),
        "compiled": _fit(None, epochs=2),
        "measure": _fit("fast_validation", epochs=2),
        "eager_short": _fit("fast_validation:eager", epochs=2),
        "compile_short": _fit("fast_validation:compile", epochs=2),
        "cold": _fit("fast_validation:warm=false", epochs=2),
    }


WITH_IT = ("measure", "eager_short", "compile_short", "cold")


@pytest.mark.parametrize("name", WITH_IT)
def test_every_validation_sample_is_evaluated_once_per_run_with_a_short_last_batch(fits, name):
    fit = fits[name]
    assert fit["records"]["fast_validation"].status == "applied", fit["records"]
    runs = fit["module"].runs
    assert len(runs) == 3 and runs[0] == list(range(16))  # the sanity check's two batches, then one run an epoch
    for run in runs[1:]:
        assert sorted(run) == list(range(VAL)) and len(run) == VAL  # 4 batches of 8 and one of 5, each once


@pytest.mark.parametrize("name", WITH_IT)
def test_the_metrics_and_the_training_equal_an_eager_fit_exactly_in_fp32(fits, name):
    """Dynamo's eager backend runs the same kernels: the validation metrics, the training losses and
    the optimizer's state are those of the plain eager fit, bit for bit (the warm-up left nothing)."""
    fit, eager = fits[name], fits["eager"]
    assert len(fit["metrics"]) == 2 and fit["metrics"] == eager["metrics"]
    assert len(fit["losses"]) == 14 and fit["losses"] == eager["losses"] == fits["compiled"]["losses"]
    for key, state in fit["optimizer"]["state"].items():
        for k, v in state.items():
            assert torch.equal(v, eager["optimizer"]["state"][key][k]), (key, k)


def test_the_warm_up_compiles_every_shape_and_no_compile_follows_it(fits):
    """Warmed: the training step at 16 and 4 samples, the validation step at 8 and 5; no compile after.
    Without the warm-up the same fit compiles after that point (training's first batch, validation's
    short batch)."""
    stats = fits["measure"]["stats"]
    shapes = [(s["step"], s["batch"]) for s in stats["warmup"]["shapes"]]
    assert shapes == [("training", 16), ("training", 4), ("validation", 8), ("validation", 5)]
    assert stats["warmup"]["compiles"]["total"] >= 1
    after = stats["compiles_after_warmup"]
    assert (after["total"], after["eager_frames"]) == (0, 0), after
    assert "after the warm-up 0 compiles" in fits["measure"]["records"]["fast_validation"].detail
    cold = fits["cold"]["stats"]["compiles_after_warmup"]
    assert cold["total"] >= 1 and cold["train"] >= 1 and cold["validation"] >= 1, cold


@pytest.mark.parametrize("inference_mode", [True, False])
def test_without_a_sanity_check_the_validation_step_is_warmed_as_lightning_runs_it(inference_mode):
    """Nothing validated before the warm-up: its validation graphs are the only ones, made in Lightning's
    grad mode (``torch.inference_mode``, or ``no_grad``), after the module's ``on_validation_epoch_start``
    (the step appends to the list that hook starts: without it the warm-up's step would raise)."""
    fit = _fit("fast_validation", num_sanity_val_steps=0, inference_mode=inference_mode)
    assert fit["stats"]["compiles_after_warmup"]["total"] == 0, fit["stats"]["compiles_after_warmup"]
    assert [sorted(run) for run in fit["module"].runs] == [list(range(VAL))]


def _padded_fit(spec: str, **trainer_kw) -> tuple[dict, PaddedText]:
    torch.compiler.reset()
    torch.manual_seed(0)
    module = PaddedText()
    module.embed = torch.compile(module.embed, backend="eager")  # sees (batch, length): both vary
    train, val = padded_loaders()
    trainer = Trainer(
        max_epochs=1,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=callbacks(spec),
        **trainer_kw,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(module, train_dataloaders=train, val_dataloaders=val)
    return _stats(trainer)["fast_validation"], module


def test_batches_padded_per_batch_are_warmed_at_two_lengths_and_nothing_compiles_after():
    """Text padded to each batch's longest: a batch size met at one length only compiles again at the
    fit's next length. The warm-up runs each full batch size at a second length too (Dynamo makes the
    length dynamic, as the fit's second batch would): no compile after it. No sanity check here: its
    two validation batches would show the compiled frame two lengths before the warm-up."""
    stats, module = _padded_fit("fast_validation", num_sanity_val_steps=0)
    shapes = [(s["step"], s["batch"], s.get("shapes", 1)) for s in stats["warmup"]["shapes"]]
    assert shapes == [("training", 16, 2), ("validation", 8, 2), ("validation", 5, 1)], shapes
    assert stats["compiles_after_warmup"]["total"] == 0, stats["compiles_after_warmup"]
    assert [sorted(run) for run in module.runs] == [list(range(VAL))]
    cold, _ = _padded_fit("fast_validation:warm=false", num_sanity_val_steps=0)
    assert cold["compiles_after_warmup"]["total"] >= 1, cold["compiles_after_warmup"]


def test_the_short_batch_runs_as_measured_or_told(fits):
    """``eager``: the short validation batch is not compiled in the warm-up and runs eagerly (under
    force_eager: no compile after the warm-up either); ``compile`` and ``measure`` warm it."""
    eager = fits["eager_short"]["stats"]
    assert [(s["step"], s["batch"]) for s in eager["warmup"]["shapes"]][-1] == ("validation", 8)
    assert eager["short_batch"] == [{"loader": 0, "batch": 5, "runs": "eager", "rule": "eager"}]
    assert eager["compiles_after_warmup"]["total"] == 0, eager["compiles_after_warmup"]
    measured = fits["measure"]["stats"]["short_batch"]
    assert len(measured) == 1 and measured[0]["runs"] in ("compiled", "eager")
    assert measured[0]["compiled_s"] > 0 and measured[0]["eager_s"] > 0
    assert fits["compile_short"]["stats"]["short_batch"][0]["runs"] == "compiled"


def test_under_bf16_the_metrics_are_within_bf16s_band_of_an_eager_validation():
    eager = _fit("bf16", compiled=False, epochs=1)
    fast = _fit("bf16,fast_validation", epochs=1)
    assert fast["records"]["bf16"].status == fast["records"]["fast_validation"].status == "applied"
    assert fast["stats"]["compiles_after_warmup"]["total"] == 0
    for a, b in zip(fast["metrics"], eager["metrics"], strict=True):
        for key in a:
            assert abs(a[key] - b[key]) <= 2e-2 * max(abs(b[key]), 1.0), (key, a[key], b[key])


def test_modules_compiled_in_place_get_a_recompile_limit_each(monkeypatch):
    """Three children compiled by the compile speedup run one code object, whose Dynamo limit of 8 the
    training and eval shapes pass: a frame past it runs eagerly, silently. The limit is raised while
    the fit runs, and nothing is left eager; with torch's own limit kept, a frame is."""
    original = torch.nn.Module.compile
    monkeypatch.setattr(torch.nn.Module, "compile", lambda self, **kw: original(self, backend="eager"))
    fit = _fit("compile,fast_validation", children=3)
    assert fit["records"]["compile"].status == "applied", fit["records"]["compile"]
    after = fit["stats"]["compiles_after_warmup"]
    assert (after["total"], after["eager_frames"]) == (0, 0), after
    assert fit["stats"]["warmup"]["compiles"]["eager_frames"] == 0 and fit["stats"]["warmup"]["compiles"]["total"] >= 6

    import fastloop.adapters.lightning_validation as lv

    monkeypatch.setattr(lv, "recompile_budget", lambda *a, **k: 8)
    kept = _fit("compile,fast_validation", children=3)
    assert kept["stats"]["warmup"]["compiles"]["eager_frames"] >= 1, kept["stats"]["warmup"]


def test_the_validation_loader_is_fed_as_the_training_loader():
    """Under ``workers:2`` the validation loader gets 2 workers (the same samples, in order); the training
    loader's record is left as it was; with ``feed=false`` the validation loader keeps none."""
    plain = _fit(None, compiled=False, epochs=1)
    fed = _fit("workers:2,fast_validation", compiled=False, epochs=1)
    trainer = fed["trainer"]
    assert trainer.val_dataloaders.num_workers == 2 and trainer.train_dataloader.num_workers == 2
    assert fed["stats"]["feed"] == [{"name": "workers", "status": "applied", "detail": "2 worker processes"}]
    assert fed["records"]["workers"].detail == "2 worker processes"
    assert fed["metrics"] == plain["metrics"] and sorted(fed["module"].runs[-1]) == list(range(VAL))
    assert "nothing in the training step is compiled" in " ".join(fed["stats"]["warmup"]["not_warmed"])
    unfed = _fit("workers:2,fast_validation:feed=false", compiled=False, epochs=1)
    assert unfed["trainer"].val_dataloaders.num_workers == 0 and unfed["stats"]["feed"] == []


class Wrapped:
    """A feed that is not a DataLoader (as prefetch's thread and gpu_resident's store are): it hides the
    loader it reads from Lightning's preparation, keeping it as ``.loader``."""

    def __init__(self, loader: DataLoader) -> None:
        self.loader = loader

    def __iter__(self):
        return iter(self.loader)

    def __len__(self) -> int:
        return len(self.loader)


class WrappingFeed(Speedup):
    """Test-only: a feed speedup whose change holds for validation, wraps the loader and reports its size."""

    name, changes, order = "test_wrapping_feed", "data", 11
    ladder = LadderTraits(feeds=True)
    feeds_validation = True

    def apply(self, run: Run) -> None:
        run.change_loader(lambda loader: self.wrap(loader, run.ctx))

    def wrap(self, loader: DataLoader, ctx: Context) -> Wrapped:
        ctx.stats["samples"] = len(loader.sampler)
        ctx.describe(self.name, f"{len(loader.sampler)} samples")
        return Wrapped(loader)


def test_each_rank_validates_its_share_through_a_feed_that_is_not_a_dataloader():
    """Under DDP (2 processes, the Trainer not launched: rank 0, then rank 1 by its environment) the
    validation loader is prepared as Lightning prepares it, with an unshuffled DistributedSampler, before
    the feed hides it: the ranks read disjoint halves of 37 samples, padded to 19 each as Lightning's
    sampler pads them, in order."""
    from fastloop.adapters._lightning_private import set_train_source, val_source
    from fastloop.adapters.lightning_run import LightningRun

    train, val = loaders()
    shares = []
    for rank in (0, 1):
        trainer = Trainer(accelerator="cpu", devices=2, strategy="ddp", logger=False)
        trainer.strategy.cluster_environment.set_global_rank(rank)
        module = ShortBatches()
        set_train_source(trainer, train)  # what fit(module, train, val) attaches
        trainer.fit_loop.epoch_loop.val_loop._data_source.instance = val
        runs = []
        for speedup in (WrappingFeed(), *resolve("fast_validation")):
            run = LightningRun(trainer, module, Context(torch.device("cpu")), lambda *a: None)
            run.speedup = speedup
            speedup.apply(run)
            run.ctx.record(speedup.name, "applied")
            runs.append(run)
        fed = val_source(trainer)
        assert isinstance(fed, Wrapped)
        # the validation feed decided in a context of its own: the training's record is its own
        assert runs[0].ctx.stats["samples"] == 50 and runs[0].ctx.records[WrappingFeed.name].detail == "50 samples"
        assert "test_wrapping_feed (19 samples)" in runs[1].ctx.records["fast_validation"].detail
        sampler = fed.loader.sampler
        assert isinstance(sampler, DistributedSampler) and (sampler.rank, sampler.num_replicas) == (rank, 2)
        assert not sampler.shuffle
        shares.append([i for _, _, index in fed for i in index.tolist()])
        for run in reversed(runs):  # teardown
            while run.undo:
                run.undo.pop()()
        assert val_source(trainer) is val
    expected = [list(DistributedSampler(range(VAL), num_replicas=2, rank=r, shuffle=False)) for r in (0, 1)]
    assert shares == expected and sorted(set(shares[0]) | set(shares[1])) == list(range(VAL))


def test_the_warm_up_puts_every_state_back():
    """BatchNorm's statistics, the mode, dropout's and every generator's draws, a list and a dict, a
    tensor changed in place, an attribute added, an inference tensor, the gradients: as before."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8), torch.nn.Dropout(0.5))
    net(torch.randn(6, 4)).sum().backward()
    grads = [p.grad.clone() for p in net.parameters()]
    net.outputs, net.counts, net.total, net.calls = [1], {"a": 1}, torch.zeros(2), 0
    with torch.inference_mode():
        net.cache = torch.ones(2)
    generator = torch.Generator().manual_seed(3)
    buffers = {k: v.clone() for k, v in net.state_dict().items()}
    before = (torch.get_rng_state(), random.getstate(), np.random.get_state()[1].copy(), generator.get_state())
    with KeptState(net, [generator]):
        out = net(torch.randn(6, 4))
        out.sum().backward()
        net.outputs.append(out)
        net.counts["b"] = 2
        net.total += 5
        net.calls += 1
        net.added = True
        net.eval()
        with torch.inference_mode():
            net.cache.add_(1)
        random.random(), np.random.rand(), torch.rand(3, generator=generator)
    after = (torch.get_rng_state(), random.getstate(), np.random.get_state()[1], generator.get_state())
    assert all(torch.equal(v, net.state_dict()[k]) for k, v in buffers.items())
    assert torch.equal(before[0], after[0]) and before[1] == after[1] and (before[2] == after[2]).all()
    assert torch.equal(before[3], after[3])
    assert net.outputs == [1] and net.counts == {"a": 1} and net.calls == 0 and not hasattr(net, "added")
    assert torch.equal(net.total, torch.zeros(2)) and torch.equal(net.cache, torch.ones(2)) and net.training
    assert all(torch.equal(p.grad, g) for p, g in zip(net.parameters(), grads))


def test_an_epochs_batch_sizes_leave_the_loaders_generator_as_it_was():
    generator = torch.Generator().manual_seed(1)
    loader = DataLoader(list(range(37)), batch_size=8, shuffle=True, generator=generator)
    state = generator.get_state()
    shapes = epoch_batch_indices(loader)
    assert list(shapes) == [8, 5] and len(set(shapes[8])) == 8 and torch.equal(generator.get_state(), state)
    assert epoch_batch_indices(Wrapped(loader)) == {}  # not a DataLoader: the caller unwraps it


def test_the_count_stops_counting():
    count = CompileCount(lambda: "train")
    count.start()
    f = torch.compile(lambda x: x + 1, backend="eager")
    f(torch.ones(3))
    assert count.stop()["train"] == 1
    f(torch.ones(3, 2))  # a recompile after stop: not counted
    assert count.summary()["total"] == 1


def test_the_plain_loop_has_no_validation_loop():
    from fastloop.loop import FastLoop
    from tests.targets import tiny_mlp

    module, loader = tiny_mlp()
    optimizer = torch.optim.SGD(module.parameters(), lr=0.1)
    loop = FastLoop(module, optimizer, loader, step_fn=lambda m, b: m(b[0]).sum(), speedups="fast_validation")
    (record,) = loop.records
    assert (record.status, record.reason) == (
        "skipped",
        "the plain loop has no validation loop: FastLoop trains only, and what your code validates outside it "
        "is not FastLoop's to change",
    )


def test_a_fit_without_validation_skips_it_with_the_reason():
    from tests.targets import tiny_mlp

    module, loader = tiny_mlp()
    trainer = Trainer(
        max_steps=2,
        accelerator="cpu",
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        callbacks=callbacks("fast_validation"),
    )
    trainer.fit(module, train_dataloaders=loader)
    (record,) = records_of(trainer)
    assert record.status == "skipped" and "has no validation_step" in record.reason, record
    skipped = _fit("fast_validation", compiled=False, epochs=1, limit_val_batches=0)
    assert skipped["records"]["fast_validation"].reason == (
        "limit_val_batches=0: nothing is validated (as in a step benchmark, `fastloop run` or `ab` without --fit): "
        "fast_validation acts in whole fits"
    )


def test_bad_options_say_what_is_accepted():
    with pytest.raises(FastloopError, match="short must be one of measure, compile, eager, got 'sometimes'"):
        resolve("fast_validation:sometimes")
    with pytest.raises(FastloopError, match="warm must be true or false"):
        resolve("fast_validation:warm=maybe")


def test_the_fit_document_counts_the_compiles_after_the_warm_up(tmp_path):
    from fastloop.drivers.fit import FitOptions, fit_here, fit_result

    opts = FitOptions(target="tests/fast_validation_target.py:compiled_fit", speedups="fast_validation", epochs=2)
    torch.compiler.reset()
    t0 = time.monotonic()
    record, error = fit_here(opts, spawned_at=t0, root_dir=str(tmp_path / "fit"))
    assert error is None
    doc = fit_result(record, time.monotonic() - t0, opts).to_dict()
    counted = doc["extra"]["fast_validation"]["compiles_after_warmup"]
    assert (counted["train"], counted["validation"], counted["eager_frames"]) == (0, 0, 0), counted
    assert (
        "after the warm-up 0 compiles" in next(s for s in doc["speedups"] if s["name"] == "fast_validation")["detail"]
    )


@pytest.mark.gpu
def test_on_the_gpu_validation_replays_graphs_and_nothing_compiles_after_the_warm_up():
    """compile (Inductor, default mode) with fast_validation on CUDA: the validation step replays its own
    reduce-overhead graphs, recorded in the warm-up; the metrics are within fp32's rounding of an eager fit."""
    torch.compiler.reset()
    eager = _gpu_fit(None)
    fast = _gpu_fit("compile,fast_validation")
    stats = fast["stats"]
    assert stats["graphed"] and stats["compiles_after_warmup"]["total"] == 0, stats
    for a, b in zip(fast["metrics"], eager["metrics"], strict=True):
        for key in a:
            assert abs(a[key] - b[key]) <= 1e-3 * max(abs(b[key]), 1.0), (key, a[key], b[key])
    assert all(sorted(run) == list(range(VAL)) for run in fast["module"].runs[1:])


def _gpu_fit(spec: str | None) -> dict:
    torch.compiler.reset()
    torch.manual_seed(0)
    module = ShortBatches()
    train, val = loaders()
    seen = Seen()
    trainer = Trainer(
        max_epochs=2,
        accelerator="gpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[seen, *(callbacks(spec) if spec else [])],
    )
    trainer.fit(module, train_dataloaders=train, val_dataloaders=val)
    stats = _stats(trainer)
    return {"module": module, "metrics": seen.metrics, "stats": stats.get("fast_validation")}
