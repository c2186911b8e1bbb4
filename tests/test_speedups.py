import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from fastloop import FastloopError
from fastloop._compat import Trainer
from fastloop.lightning import callbacks, records_of
from fastloop.loop import FastLoop
from fastloop.speedups import REGISTRY, resolve, speedup_names
from tests.targets import tiny_conv


def _setup(conv=False, workers=0, bs=16, n=128):
    torch.manual_seed(0)
    if conv:
        model = torch.nn.Sequential(
            torch.nn.Conv2d(3, 8, 3, padding=1),
            torch.nn.ReLU(),
            torch.nn.AdaptiveAvgPool2d(2),
            torch.nn.Flatten(),
            torch.nn.Linear(32, 4),
        )
        x = torch.randn(n, 3, 8, 8, generator=torch.Generator().manual_seed(1))
    else:
        model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4))
        x = torch.randn(n, 16, generator=torch.Generator().manual_seed(1))
    y = torch.randint(0, 4, (n,), generator=torch.Generator().manual_seed(2))
    return model, DataLoader(TensorDataset(x, y), batch_size=bs, num_workers=workers)


def _losses(speedups, conv=False, steps=12):
    model, loader = _setup(conv)
    loop = FastLoop(
        model,
        torch.optim.AdamW(model.parameters(), lr=1e-2),
        loader,
        loss_fn=torch.nn.functional.cross_entropy,
        speedups=speedups,
        device="cpu",
    )
    return loop.train(steps=steps).losses, loop


def test_registry_has_the_design_names():
    for name in (
        "tf32",
        "workers",
        "pin_memory",
        "prefetch",
        "bf16",
        "fp16",
        "channels_last",
        "compile",
        "cuda_graph",
        "fused_optimizer",
        "batch_size",
    ):
        assert name in REGISTRY
        assert f"docs/speedups/{name}.md" in (REGISTRY[name].__doc__ or "")  # one copy of the card: the docs page
        assert REGISTRY[name].changes in ("model", "optimizer", "data", "step")


@pytest.mark.parametrize(
    "spec,msg",
    [
        ("bf16,warp_drive", "unknown speedup 'warp_drive'; valid names: gpu_augment, gpu_resident, workers"),
        ("bf16,fp16", "cannot be combined"),
        ("bf16,bf16", "speedup given twice: bf16"),
        ("bf16,,compile", "malformed speedup list"),
        ("none,bf16", "'none' means the baseline"),
    ],
)
def test_bad_speedup_lists(spec, msg):
    with pytest.raises(FastloopError, match=msg):
        resolve(spec)


def test_resolve_orders_like_the_ladder():
    assert [s.name for s in resolve("compile,bf16,workers")] == ["workers", "bf16", "compile"]
    assert resolve("none") == [] and speedup_names()[:3] == ["gpu_augment", "gpu_resident", "workers"]


def test_workers_exact_equivalence():
    base, _ = _losses("none")
    model, loader = _setup(workers=0)
    loop = FastLoop(
        model,
        torch.optim.AdamW(model.parameters(), lr=1e-2),
        loader,
        loss_fn=torch.nn.functional.cross_entropy,
        speedups="workers:2",
        device="cpu",
    )
    assert loop.loader.num_workers == 2 and loop.loader.persistent_workers
    assert loop.train(steps=12).losses == base  # same batches, same order: bitwise equal


@pytest.mark.parametrize("name", ["pin_memory", "prefetch", "cuda_graph", "tf32", "fp16", "cudnn_benchmark"])
def test_cuda_only_speedups_skip_on_cpu_and_run_goes_on(name):
    base, _ = _losses("none")
    got, loop = _losses(name)
    rec = loop.records[0]
    assert rec.status == "skipped" and rec.reason.startswith("no CUDA")
    assert got == base


@pytest.mark.parametrize(
    "spec,conv,rtol",
    [
        ("fused_optimizer", False, 1e-5),  # same math, fused kernel: rounding only
        ("bf16", False, 5e-2),  # bf16 rounding in matmuls
        ("channels_last", True, 1e-5),  # same math, other memory layout
    ],
)
def test_equivalence_within_tolerance(spec, conv, rtol):
    base, _ = _losses("none", conv=conv)
    got, loop = _losses(spec, conv=conv)
    assert loop.records[0].status == "applied"
    diff = max(abs(a - b) / abs(a) for a, b in zip(base, got))
    assert diff <= rtol, diff
    assert got != [] and len(got) == len(base)


@pytest.mark.slow
def test_compile_equivalence_cpu():
    base, _ = _losses("none")
    got, loop = _losses("compile")
    assert loop.records[0].status == "applied"
    assert max(abs(a - b) / abs(a) for a, b in zip(base, got)) <= 1e-4


def test_channels_last_skipped_without_conv():
    _, loop = _losses("channels_last")
    assert loop.records[0].status == "skipped" and "no Conv2d" in loop.records[0].reason


def test_fused_optimizer_keeps_state_and_scheduler():
    model, loader = _setup()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    sched = torch.optim.lr_scheduler.StepLR(opt, 2, 0.5)
    loop = FastLoop(
        model,
        opt,
        loader,
        loss_fn=torch.nn.functional.cross_entropy,
        speedups="fused_optimizer",
        device="cpu",
        scheduler=sched,
    )
    assert loop.optimizer is opt and opt.param_groups[0]["fused"] is True
    loop.train(steps=4)
    assert opt.param_groups[0]["lr"] == pytest.approx(0.025)


def test_fused_optimizer_skips_unfusable():
    model, loader = _setup()
    loop = FastLoop(
        model,
        torch.optim.RMSprop(model.parameters()),
        loader,
        loss_fn=torch.nn.functional.cross_entropy,
        speedups="fused_optimizer",
        device="cpu",
    )
    assert loop.records[0].status == "skipped" and "RMSprop" in loop.records[0].reason


def test_fused_optimizer_under_lightning_is_the_speedups_own_change_and_skip():
    """The Lightning adapter applies the speedup's own ``apply_optimizer`` to each of the
    Trainer's optimizers: fused where it can (while it trains; put back after), and the same
    skip with the same reason where not."""
    from fastloop._compat import Callback
    from tests.targets import tiny_mlp

    fused_in_steps = []

    class Fused(Callback):
        def on_train_batch_end(self, trainer, *args) -> None:
            fused_in_steps.append(trainer.optimizers[0].param_groups[0].get("fused"))

    for make, status in (
        (lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9), "applied"),
        (lambda p: torch.optim.RMSprop(p), "skipped"),
    ):
        module, loader = tiny_mlp()
        module.configure_optimizers = lambda m=module, make=make: make(m.parameters())
        fused_in_steps.clear()
        trainer = Trainer(
            callbacks=[*callbacks("fused_optimizer"), Fused()],
            max_steps=2,
            logger=False,
            accelerator="cpu",
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
        )
        trainer.fit(module, loader)
        (rec,) = records_of(trainer)
        assert rec.status == status, rec
        if status == "applied":
            assert fused_in_steps == [True, True] and rec.detail == "fused SGD"
            assert trainer.optimizers[0].param_groups[0]["fused"] is None  # as configure_optimizers made it
        else:
            assert "RMSprop" in rec.reason


def test_lightning_drop_in_with_all_cpu_speedups():
    """An ordinary LightningModule (logging, scheduler, dict from training_step) + callbacks."""
    module, loader = tiny_conv()
    cbs = callbacks("workers:2,pin_memory,prefetch,bf16,fused_optimizer,channels_last,cuda_graph")
    trainer = Trainer(
        max_steps=8,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=cbs,
    )
    trainer.fit(module, train_dataloaders=loader)
    recs = {r.name: r for r in records_of(trainer)}
    assert {n for n, r in recs.items() if r.status == "applied"} == {
        "workers",
        "bf16",
        "fused_optimizer",
        "channels_last",
    }
    assert recs["prefetch"].reason == "no CUDA" and recs["cuda_graph"].reason == "no CUDA"
    assert trainer.global_step == 8
    # applied while it trained, put back after fit (tests/test_drop_in.py compares everything)
    assert trainer.optimizers[0].param_groups[0]["fused"] is None and trainer.precision == "32-true"
    assert next(module.net[0].parameters()).is_contiguous()
    assert torch.isfinite(trainer.callback_metrics["train_loss"])


def test_lightning_callbacks_match_plain_lightning_losses():
    from fastloop.drivers.runner import run_configuration

    a = run_configuration("tests/targets.py:tiny_mlp", "none", steps=8, warmup=0, device="cpu")
    b = run_configuration("tests/targets.py:tiny_mlp", "workers:2", steps=8, warmup=0, device="cpu")
    # 2 workers x prefetch_factor 2 = 4 buffered batches: the warm-up grows by 8 steps to drain them
    assert a["warmup_drain_steps"] == 0 and b["warmup_drain_steps"] == 8 and b["warmup_steps"] == 8
    assert b["steps"] == 8 and a["losses"] == b["losses"][:8]


def test_plain_loop_rejects_bad_arguments():
    model, loader = _setup()
    with pytest.raises(ValueError, match="exactly one of loss_fn"):
        FastLoop(model, torch.optim.SGD(model.parameters(), lr=0.1), loader, device="cpu")
    loop = FastLoop(
        model,
        torch.optim.SGD(model.parameters(), lr=0.1),
        loader,
        loss_fn=torch.nn.functional.cross_entropy,
        device="cpu",
    )
    with pytest.raises(FastloopError, match="steps must be >= 1"):
        loop.train(steps=0)
    with pytest.raises(FastloopError, match="no CUDA device"):
        FastLoop(
            model,
            torch.optim.SGD(model.parameters(), lr=0.1),
            loader,
            loss_fn=torch.nn.functional.cross_entropy,
            device="cuda",
        )


def test_nested_batches_moved_and_mapped():
    from dataclasses import dataclass

    from fastloop.data import map_tensors

    @dataclass
    class B:
        x: torch.Tensor
        tags: list

    out = map_tensors(lambda t: t * 2, {"a": (torch.ones(2), [B(torch.ones(1), ["s"])])})
    assert out["a"][0].sum() == 4 and out["a"][1][0].x.item() == 2 and out["a"][1][0].tags == ["s"]


def test_lightning_fp16_counts_skipped_steps_and_holds_the_scheduler(monkeypatch):
    """fp16 is a CUDA speedup; its Lightning mechanics (scaler, skip count, scheduler hold) are
    exercised here on the CPU, where torch's GradScaler and fp16 autocast also run."""
    from fastloop._compat import LightningModule
    from fastloop.speedups.precision import FP16

    monkeypatch.setattr(FP16, "why_not", lambda self, ctx: None)
    calls = []

    class Overflowing(LightningModule):
        def __init__(self):
            super().__init__()
            self.net = torch.nn.Linear(16, 4)

        def training_step(self, batch, i):
            x, y = batch
            return torch.nn.functional.cross_entropy(self.net(x), y) * 6e4  # fp16 grads overflow at scale 65536

        def configure_optimizers(self):
            opt = torch.optim.SGD(self.parameters(), lr=1e-3)
            sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: (calls.append(s), 1.0)[1])
            return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}

    _, loader = _setup()
    cbs = callbacks("fp16")
    trainer = Trainer(
        max_steps=12,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=cbs,
    )
    trainer.fit(Overflowing(), train_dataloaders=loader)
    stats = cbs[0].ctx.stats
    assert cbs[0].record.status == "applied"
    skipped = stats["fp16_skipped_steps"]
    assert skipped >= 1
    assert stats["fp16_scheduler_steps_held"] == skipped
    assert len(calls) - 1 == 12 - skipped  # LambdaLR calls once at construction


def test_default_ladders_per_recipe_and_device():
    from fastloop.drivers.ladder import DEFAULT_RUNGS, default_rungs
    from fastloop.drivers.targets import recipe_rungs

    RECIPE_RUNGS = {n: recipe_rungs(n)[1] for n in ("gpt", "imagenet")}

    cpu = default_rungs("cpu", "imagenet")
    assert "cudnn_benchmark" not in cpu and "pin_memory" not in cpu and "gpu_resident" not in cpu  # CUDA-only
    try:
        import nvidia.dali  # noqa: F401  (the dali extra: CPU pipelines run here)

        assert cpu[-1] == "dali"
    except ImportError:  # without the extra the rung cannot apply, so it is left out
        assert "dali" not in cpu
    assert "cudnn_benchmark" not in default_rungs("cpu", "gpt")  # dali is a rung of every default ladder where
    # DALI is installed: a user's image folder translates; elsewhere the run's data rules it out unmeasured
    full = [s.name for s in resolve(DEFAULT_RUNGS + RECIPE_RUNGS["imagenet"])]  # what a GPU machine runs
    assert full[-1] == "dali" and full[:6] == [
        "gpu_augment",
        "gpu_resident",
        "workers",
        "pad_buckets",
        "pin_memory",
        "prefetch",
    ]
    assert full.index("tf32") < full.index("cudnn_benchmark") < full.index("bf16") < full.index("compile")


def test_none_means_the_baseline_in_every_public_entry_point():
    """One rule for None across the Python API: callbacks, FastLoop and resolve."""
    import torch

    from fastloop.lightning import callbacks
    from fastloop.loop import FastLoop
    from fastloop.speedups.base import resolve

    for empty in (None, "none", "", []):
        assert resolve(empty) == []
        assert callbacks(empty) == []
        model = torch.nn.Linear(2, 2)
        loop = FastLoop(
            model,
            torch.optim.SGD(model.parameters(), lr=0.1),
            [(torch.zeros(2, 2), torch.zeros(2, dtype=torch.long))],
            loss_fn=torch.nn.functional.cross_entropy,
            speedups=empty,
            device="cpu",
        )
        assert loop.speedups == []
    import pytest

    with pytest.raises(TypeError, match="or None"):
        callbacks(3)  # type: ignore[arg-type]


@pytest.mark.slow
@pytest.mark.parametrize("shapes, graphs", [("static", 3), ("auto", 2)])
def test_compile_shapes_static_compiles_one_graph_per_shape(shapes, graphs):
    """Three batch lengths: ``static`` specialises a graph to each; torch's ``auto`` recompiles
    once, on the second, with dynamic sizes that serve the third too."""
    from fastloop.speedups.compile.compile import apply_compile, compile_counters

    torch._dynamo.reset()
    model = apply_compile(torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU()), "default", shapes)
    before = compile_counters()["unique_graphs"]
    for n in (16, 32, 48, 16):
        model(torch.randn(4, n, 8))
    assert compile_counters()["unique_graphs"] - before == graphs


class _Recurrent(torch.nn.Module):
    def __init__(self, kind: type) -> None:
        super().__init__()
        self.rnn, self.head = kind(8, 8, batch_first=True), torch.nn.Linear(8, 4)

    def forward(self, x):
        return self.head(self.rnn(x)[0][:, -1])


@pytest.mark.parametrize("broken", [False, True], ids=["probe-runs", "probe-fails"])
def test_bf16_skips_a_recurrent_layer_this_cpu_cannot_run_and_trains_as_fp32(monkeypatch, broken):
    """bf16 on the CPU with an LSTM: where oneDNN has no bf16 LSTM kernel for this CPU (it raises
    "could not create a primitive descriptor" in the first forward), bf16 is skipped with torch's
    reason and the fit trains exactly as without it; where the kernel runs, bf16 applies. Both
    paths are forced through the probe's memo, whatever this CPU does."""
    from fastloop.speedups import precision

    monkeypatch.setattr(precision, "_RNN_PROBES", {("LSTM", False, False): "no kernel" if broken else None})

    def fit(spec):
        torch.manual_seed(0)
        model = _Recurrent(torch.nn.LSTM)
        data = TensorDataset(torch.randn(32, 5, 8), torch.randint(0, 4, (32,)))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        loop = FastLoop(
            model,
            opt,
            DataLoader(data, batch_size=8),
            loss_fn=torch.nn.functional.cross_entropy,
            speedups=spec,
            device="cpu",
        )
        try:
            return loop.train(steps=4).losses, loop.records
        except RuntimeError as err:  # the kernel this CPU lacks, where the memo said it runs
            assert not broken and "primitive descriptor" in str(err)
            return None, None

    base, _ = fit("none")
    got, records = fit("bf16")
    if broken:
        assert (
            records[0].status == "skipped"
            and "cannot run LSTM under bf16 autocast (torch: no kernel)" in records[0].reason
        )
        assert got == base
    elif records is not None:
        assert records[0].status == "applied" and got != base


def test_bf16_probe_leaves_the_random_streams_and_caches_per_kind(monkeypatch):
    from fastloop.speedups import precision

    monkeypatch.setattr(precision, "_RNN_PROBES", {})
    model = _Recurrent(torch.nn.GRU)
    torch.manual_seed(3)
    before = torch.get_rng_state()
    try:
        precision._cpu_runs_its_recurrent_layers_in_bf16(model)
    except Exception as err:  # this CPU: a Skip with the reason, never the kernel's error
        assert type(err).__name__ == "Skip" and "GRU" in str(err)
    assert torch.equal(torch.get_rng_state(), before)
    assert list(precision._RNN_PROBES) == [("GRU", False, False)]
