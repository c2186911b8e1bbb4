"""The one Run interface: each speedup makes its whole change through it, both adapters
implement it once, one ``apply_all`` records every speedup, and a speedup that did not apply
leaves nothing changed."""

from __future__ import annotations

import dataclasses
import inspect

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from fastloop._compat import LightningModule, Trainer
from fastloop.adapters.lightning_run import LightningRun
from fastloop.adapters.loop import FastLoop, LoopRun
from fastloop.lightning import SpeedupCallback
from fastloop.speedups import REGISTRY, resolve
from fastloop.speedups.base import Context, Skip, Speedup, apply_all
from fastloop.speedups.options import Options, option
from fastloop.speedups.run import Run

CPU = torch.device("cpu")
CHANGES = [n for n, f in vars(Run).items() if inspect.isfunction(f) and not n.startswith("_")]


def test_both_adapters_implement_every_change_of_the_run_interface():
    assert {
        "change_model",
        "compile_step",
        "change_optimizers",
        "change_loader",
        "change_batch",
        "batches_arrive_on_device",
        "autocast",
        "graph_step",
        "hold",
    } <= set(CHANGES)
    for adapter in (LoopRun, LightningRun):
        missing = [n for n in CHANGES if getattr(adapter, n) is getattr(Run, n)]
        assert not missing, f"{adapter.__name__} does not implement {missing}"


def test_every_registered_speedup_applies_through_run_alone():
    """No speedup keeps the old per-stage methods as its way in: the adapters only call apply."""
    import fastloop.speedups.base as base

    assert not hasattr(base, "StepPlan")
    for name in ("apply_step", "apply_model", "apply_optimizer", "apply_loader"):
        assert not hasattr(Speedup, name), name
    for cls in REGISTRY.values():
        if not cls.prepares_run:  # the batch-size search runs before training, not through a Run
            assert cls.apply is not Speedup.apply, f"{cls.name} changes nothing through the Run"


class HalfInputs(Speedup):
    """Test-only: halves the inputs once on the device and counts the batches it saw."""

    name, changes, order = "test_half_inputs", "step", 99

    def __init__(self, **options):
        super().__init__(**options)
        self.seen = 0

    def apply(self, run: Run) -> None:
        def half(batch):
            self.seen += 1
            x, y = batch
            return x * 0.5, y

        run.change_batch(half)


def _data() -> DataLoader:
    g = torch.Generator().manual_seed(0)
    return DataLoader(
        TensorDataset(torch.randn(64, 4, generator=g), torch.randint(0, 2, (64,), generator=g)), batch_size=8
    )


def test_a_speedup_written_once_against_run_works_in_the_plain_loop():
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    s = HalfInputs()
    loop = FastLoop(
        model,
        torch.optim.SGD(model.parameters(), lr=0.1),
        _data(),
        torch.nn.functional.cross_entropy,
        speedups=[s],
        device="cpu",
    )
    out = loop.train(steps=3, warmup=1)
    assert [(r.name, r.status) for r in out.records] == [("test_half_inputs", "applied")] and s.seen == 4
    torch.manual_seed(0)  # the same loop with the inputs halved by hand: the same losses, exactly
    model2 = torch.nn.Linear(4, 2)
    plain = FastLoop(
        model2,
        torch.optim.SGD(model2.parameters(), lr=0.1),
        _data(),
        device="cpu",
        step_fn=lambda m, b: torch.nn.functional.cross_entropy(m(b[0] * 0.5), b[1]),
    )
    assert plain.train(steps=3, warmup=1).losses == out.losses


class Tiny(LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Linear(4, 2)
        self.inputs: list[torch.Tensor] = []

    def training_step(self, batch, batch_idx):
        self.inputs.append(batch[0].detach().clone())
        return torch.nn.functional.cross_entropy(self.net(batch[0]), batch[1])

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def train_dataloader(self):
        return _data()


def test_the_same_speedup_works_under_lightning_and_is_put_back_after_fit():
    s, module = HalfInputs(), Tiny()
    cb = SpeedupCallback(s)
    trainer = Trainer(
        max_steps=3,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[cb],
    )
    original = trainer.strategy.batch_to_device
    trainer.fit(module)
    assert cb.record.status == "applied" and s.seen == 3
    first = next(iter(_data()))[0]
    assert torch.equal(module.inputs[0], first * 0.5)
    assert trainer.strategy.batch_to_device == original  # the patch is gone after fit


@dataclasses.dataclass(frozen=True, kw_only=True)
class ModeOptions(Options):
    """The test speedups' one option."""

    speedup = "test"
    mode: str | None = option(None, "how the test speedup behaves")


class Breaks(Speedup):
    """Test-only: changes the model, then fails (with Skip or an error, by option)."""

    name, changes, order = "test_breaks", "model", 99
    options_type = ModeOptions

    def apply(self, run: Run) -> None:
        def change(model):
            model.flag = True
            run.ctx.undo.append(lambda: delattr(model, "flag"))
            return model

        run.change_model(change)
        if self.opts.mode == "skip":
            raise Skip("this model has no such layer")
        raise RuntimeError("the kernel is missing\nsecond line")


@pytest.mark.parametrize(
    "mode, status, reason",
    [
        ("skip", "skipped", "this model has no such layer"),
        ("error", "fallback", "RuntimeError: the kernel is missing"),
    ],
)
def test_apply_all_puts_back_what_a_speedup_that_did_not_apply_changed(mode, status, reason):
    model = torch.nn.Linear(2, 2)
    run = LoopRun(Context(CPU), model, None, None)
    apply_all([Breaks(mode=mode), *resolve("channels_last")], run)
    assert not hasattr(model, "flag")
    assert (run.ctx.records["test_breaks"].status, run.ctx.records["test_breaks"].reason) == (status, reason)
    assert run.ctx.records["channels_last"].status == "skipped"  # the next one is still decided


def test_a_change_the_run_cannot_make_is_a_skip_with_the_reason():
    run = LoopRun(Context(CPU), torch.nn.Linear(2, 2), None, None)  # no loader, no optimizer given
    apply_all(resolve("fused_optimizer"), run)
    rec = run.ctx.records["fused_optimizer"]
    assert rec.status == "skipped" and "optimizer" in rec.reason and "none was given" in rec.reason


class Switch(Speedup):
    """Test-only: holds a global switch while the run trains (as tf32 does); with the option
    ``then-skip`` it cannot apply after asking for it."""

    name, changes, order = "test_switch", "step", 99
    options_type = ModeOptions
    on: list[bool] = []

    def apply(self, run: Run) -> None:
        import contextlib

        @contextlib.contextmanager
        def switch():
            Switch.on.append(True)
            try:
                yield
            finally:
                Switch.on.pop()

        run.hold(switch)
        if self.opts.mode == "then-skip":
            raise Skip("not on this model")


class SeesSwitch(Tiny):
    def training_step(self, batch, batch_idx):
        self.inputs.append(torch.tensor(float(bool(Switch.on))))
        return torch.nn.functional.cross_entropy(self.net(batch[0]), batch[1])


@pytest.mark.parametrize("mode", [None, "then-skip"])
def test_a_held_context_is_on_while_the_run_trains_and_off_after(mode):
    seen = []
    model = torch.nn.Linear(4, 2)
    loop = FastLoop(
        model,
        torch.optim.SGD(model.parameters(), lr=0.1),
        _data(),
        device="cpu",
        step_fn=lambda m, b: (seen.append(bool(Switch.on)), torch.nn.functional.cross_entropy(m(b[0]), b[1]))[1],
        speedups=[Switch(mode=mode)],
    )
    loop.train(steps=2, warmup=0)
    assert seen == [mode is None] * 2 and not Switch.on
    module = SeesSwitch()
    cb = SpeedupCallback(Switch(mode=mode))
    trainer = Trainer(
        max_steps=2,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[cb],
    )
    trainer.fit(module)
    assert [bool(x) for x in module.inputs] == [mode is None] * 2 and not Switch.on
    assert cb.record.status == ("applied" if mode is None else "skipped")
