"""compile on the models users write: a model the user already compiled (``torch.compile``
returned a wrapper) is left as the user compiled it, and the record says so, in both adapters;
children the user did not compile are still compiled; blocks the step iterates in a ModuleList
are compiled one by one."""

from __future__ import annotations

import torch
from torch.utils.data import DataLoader, TensorDataset

from fastloop._compat import Trainer
from fastloop.lightning import callbacks, records_of
from fastloop.loop import FastLoop
from fastloop.speedups.compile.compile import compiled_by_user
from tests.targets import tiny_mlp


def _data():
    return DataLoader(TensorDataset(torch.randn(64, 8), torch.randint(0, 2, (64,))), batch_size=16)


def test_the_plain_loop_leaves_a_model_the_user_compiled():
    model = torch.compile(torch.nn.Linear(8, 2))
    assert compiled_by_user(model) and not compiled_by_user(torch.nn.Linear(8, 2))
    result = FastLoop(
        model,
        torch.optim.SGD(model.parameters(), lr=0.1),
        _data(),
        loss_fn=torch.nn.functional.cross_entropy,
        speedups="compile",
    ).train(steps=2, warmup=1)
    (rec,) = result.records
    assert rec.status == "skipped" and "already compiled by your code" in rec.reason


def test_lightning_compiles_only_the_children_the_user_did_not():
    module, loader = tiny_mlp()
    names = [n for n, c in module.named_children() if any(True for _ in c.parameters())]
    assert names, "tiny_mlp has a child with parameters"
    first = names[0]
    setattr(module, first, torch.compile(getattr(module, first)))
    module.extra = torch.nn.Linear(2, 2)  # a child of the user's that is not compiled (unused in the step)
    trainer = Trainer(
        callbacks=callbacks("compile"),
        max_steps=2,
        logger=False,
        accelerator="cpu",
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(module, loader)
    (rec,) = records_of(trainer)
    assert rec.status == "applied", rec
    assert f"{first} left as your code compiled it" in rec.detail and "extra (Linear)" in rec.detail, rec.detail

    only, loader = tiny_mlp()
    for n in names:
        setattr(only, n, torch.compile(getattr(only, n)))
    trainer = Trainer(
        callbacks=callbacks("compile"),
        max_steps=2,
        logger=False,
        accelerator="cpu",
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(only, loader)
    (rec,) = records_of(trainer)
    assert rec.status == "skipped" and "your code already compiles" in rec.reason, rec


def test_blocks_the_step_iterates_in_a_module_list_are_compiled_one_by_one():
    """A ModuleList has no forward of its own: compiling it compiled nothing the step calls (the
    record said "compiled blocks (ModuleList)" while every block ran eagerly)."""
    from fastloop._compat import LightningModule
    from fastloop._torch_private import compiled_call

    class Stack(LightningModule):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.blocks = torch.nn.ModuleList(
                torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.GELU()) for _ in range(3)
            )
            self.head = torch.nn.Linear(8, 2)
            self.compiled_seen, self.losses = [], []

        def training_step(self, batch, batch_idx):
            x, y = batch
            self.compiled_seen.append([compiled_call(b) is not None for b in self.blocks])
            for block in self.blocks:
                x = block(x)
            loss = torch.nn.functional.cross_entropy(self.head(x), y)
            self.losses.append(float(loss))
            return loss

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    def fit(cbs):
        module = Stack()
        trainer = Trainer(
            callbacks=cbs,
            max_steps=3,
            logger=False,
            accelerator="cpu",
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
        )
        trainer.fit(module, _data())
        return module, trainer

    eager, _ = fit([])
    compiled, trainer = fit(callbacks("compile"))
    (rec,) = records_of(trainer)
    assert rec.status == "applied" and rec.detail == "compiled blocks.0-2 (Sequential), head (Linear)", rec.detail
    assert compiled.compiled_seen[0] == [True, True, True] and eager.compiled_seen[0] == [False, False, False]
    assert all(abs(a - b) <= 1e-5 * abs(a) for a, b in zip(eager.losses, compiled.losses)), (
        eager.losses,
        compiled.losses,
    )
    assert [compiled_call(b) for b in compiled.blocks] == [None, None, None]  # put back after the fit


def test_a_target_that_returns_a_compiled_lightning_module_is_told_what_to_return():
    import pytest

    from fastloop.drivers.targets import build_target
    from fastloop.errors import FastloopError

    with pytest.raises(
        FastloopError,
        match="returned OptimizedModule where a LightningModule was expected; "
        "torch.compile wraps the module it is given",
    ):
        build_target("tests/targets.py:compiled_module")
