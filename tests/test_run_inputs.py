"""What a run declares to its speedups (``RunInputs``): one object per run, handed by the driver
and shared by all of the run's speedups; no environment variable, no marker on a loader."""

from __future__ import annotations

import pytest
import torch

from fastloop._compat import Trainer
from fastloop.lightning import callbacks
from fastloop.speedups import resolve
from fastloop.speedups.base import Context, RunInputs, Skip
from tests.targets import tiny_mlp


@pytest.mark.parametrize("name", ["workers", "pin_memory", "prefetch"])
def test_the_cpu_feed_stands_down_when_the_run_says_the_batches_are_on_the_device(name):
    loader = tiny_mlp()[1]
    (s,) = resolve(name)
    ctx = Context(torch.device("cpu"), inputs=RunInputs(batches_on_device="gpu_resident"))
    with pytest.raises(Skip) as skipped:  # the adapter records it as skipped, with this reason
        s.apply_loader(loader, ctx)
    assert (skipped.value.status, skipped.value.reason) == ("skipped", "the data is already on the GPU (gpu_resident)")


def test_one_trainers_callbacks_share_one_run_inputs_and_its_step_rate():
    module, loader = tiny_mlp()
    cbs = callbacks("fused_optimizer", step_rate=50.0) + callbacks("workers")  # two calls, one Trainer
    trainer = Trainer(
        callbacks=cbs,
        max_steps=2,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        accelerator="cpu",
    )
    trainer.fit(module, train_dataloaders=loader)
    assert cbs[0].ctx.inputs is cbs[1].ctx.inputs
    assert cbs[1].ctx.inputs.step_rate == 50.0 and cbs[1].ctx.inputs.batches_on_device is None


def test_a_step_rate_must_be_a_positive_number():
    for bad in (0, -1.0, float("inf"), True):
        with pytest.raises(ValueError, match="step_rate must be steps per second"):
            callbacks("workers", step_rate=bad)


def test_a_speedup_that_cannot_apply_to_the_trainers_loader_is_recorded_with_its_reason():
    """Under Lightning the loader is asked for when the fit starts: a speedup's ``Skip`` raised
    then (here ``Fallback``: the loader is no DataLoader) leaves the loader as it was and becomes
    its record."""
    from fastloop.lightning import records_of

    module, loader = tiny_mlp()

    class Batches:  # an iterable of batches, not a torch DataLoader
        def __init__(self, items: list) -> None:
            self.items = items

        def __iter__(self):
            return iter(self.items)

        def __len__(self) -> int:
            return len(self.items)

    batches = Batches(list(loader)[:4])
    cbs = callbacks("workers")
    trainer = Trainer(
        callbacks=cbs,
        max_steps=2,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        accelerator="cpu",
    )
    trainer.fit(module, batches)
    (rec,) = records_of(trainer)
    assert (rec.status, rec.reason) == ("fallback", "loader is a Batches, not a torch DataLoader")
    assert trainer.global_step == 2
