"""The whole-step CUDA graph for Lightning: which steps may be captured (CPU), and on the GPU
(``pytest -m gpu``) that a captured step trains exactly as Lightning's eager step does."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from fastloop._compat import Callback, LightningModule, Trainer
from fastloop.adapters.lightning_graph import whole_step_blocker


class Lit(LightningModule):
    """A small conv net as Lightning users write it: SGD with momentum, a per-step scheduler,
    the loss logged per step and per epoch."""

    def __init__(self, log_value: str = "loss", sync: bool = False) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = torch.nn.Sequential(
            torch.nn.Conv2d(3, 16, 3, padding=1),
            torch.nn.ReLU(),
            torch.nn.Conv2d(16, 16, 3, padding=1),
            torch.nn.ReLU(),
            torch.nn.AdaptiveAvgPool2d(1),
            torch.nn.Flatten(),
            torch.nn.Linear(16, 10),
        )
        self.log_value, self.sync = log_value, sync

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.cross_entropy(self(x), y)
        if self.sync and loss.item() > 1e6:  # a host sync inside the step
            print("large loss")
        self.log("train_loss", loss if self.log_value == "loss" else 0.5, on_step=True, on_epoch=True, prog_bar=True)
        return loss

    def configure_optimizers(self):
        opt = torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9, weight_decay=5e-4)
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=4, gamma=0.5)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


class AfterBackward(Lit):
    def on_after_backward(self):
        pass


class GradWatcher(Callback):
    def on_before_optimizer_step(self, trainer, pl_module, optimizer):
        pass


def _loader(n: int = 200, bs: int = 32):
    g = torch.Generator().manual_seed(1)
    ds = TensorDataset(torch.randn(n, 3, 16, 16, generator=g), torch.randint(0, 10, (n,), generator=g))
    return DataLoader(ds, batch_size=bs)  # 200 = 6 x 32 + 8: a short last batch each epoch


def test_blocker_names_hooks_that_run_inside_the_step():
    t = Trainer(accelerator="cpu", logger=False, enable_progress_bar=False)
    assert whole_step_blocker(t, Lit()) is None
    assert "overrides on_after_backward" in whole_step_blocker(t, AfterBackward())
    t = Trainer(accelerator="cpu", logger=False, enable_progress_bar=False, callbacks=[GradWatcher()])
    assert "GradWatcher.on_before_optimizer_step" in whole_step_blocker(t, Lit())
    from fastloop.measure.callback import MeasureCallback

    class Profiled(MeasureCallback):  # inherits fastloop's on_before_backward (manual optimization only)
        pass

    t = Trainer(accelerator="cpu", logger=False, enable_progress_bar=False, callbacks=[Profiled()])
    assert whole_step_blocker(t, Lit()) is None
    manual = Lit()
    manual.automatic_optimization = False
    assert "manual optimization" in whole_step_blocker(Trainer(accelerator="cpu", logger=False), manual)


class _Losses(Callback):
    def __init__(self):
        self.losses = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.losses.append(outputs["loss"].detach().clone())


def _fit(module, speedups: str | None, epochs: int = 3):
    from fastloop.lightning import callbacks, records_of

    probe = _Losses()
    extra = callbacks(speedups) if speedups else []
    trainer = Trainer(
        max_epochs=epochs,
        accelerator="gpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[probe, *extra],
    )
    trainer.fit(module, train_dataloaders=_loader())
    recs = {r.name: r for r in records_of(trainer)}
    losses = [float(v) for v in probe.losses]
    return losses, trainer, recs


@pytest.mark.gpu
def test_whole_step_graph_trains_as_the_eager_step():
    """fp32, SGD with momentum and weight decay, a scheduler stepping every batch, a short last
    batch every epoch, the loss logged per step and per epoch: the captured step gives the same
    losses, logged values and weights as Lightning's eager step (fused SGD vs for-each SGD:
    rounding only)."""
    torch.backends.cudnn.deterministic = True
    eager_module, graph_module = Lit(), Lit()
    eager, t_eager, _ = _fit(eager_module, None)
    graphed, t_graph, recs = _fit(graph_module, "cuda_graph")
    rec = recs["cuda_graph"]
    assert rec.status == "applied" and "whole step" in rec.detail and "replays" in rec.detail, rec
    assert "steps of another batch shape or state eager" in rec.detail, rec  # the short last batches
    assert len(graphed) == len(eager) == 21
    diff = max(abs(a - b) / abs(a) for a, b in zip(eager, graphed))
    assert diff < 1e-4, (diff, eager, graphed)
    for key in ("train_loss_step", "train_loss_epoch"):
        a, b = float(t_eager.callback_metrics[key]), float(t_graph.callback_metrics[key])
        assert abs(a - b) <= 1e-4 * abs(a), (key, a, b)
    for (n, p), q in zip(eager_module.named_parameters(), graph_module.parameters()):
        assert torch.allclose(p, q, rtol=1e-4, atol=1e-6), n
    # the scheduler reached the graph: lr is a float again after the fit, at the same value
    lr = t_graph.optimizers[0].param_groups[0]["lr"]
    # (the graph read it as a float32 tensor: equal to float32 precision)
    want = t_eager.optimizers[0].param_groups[0]["lr"]
    assert isinstance(lr, float) and abs(lr - want) <= 1e-6 * want, (lr, want)


@pytest.mark.gpu
@pytest.mark.parametrize(
    "module,cause",
    [
        (Lit(sync=True), "synchronizes with the host at test_lightning_graph.py:32 in training_step"),
        # Lightning turns a logged Python number into a device tensor: a host-to-device copy, a sync
        # (the site: the self.log line of training_step, inside Lightning)
        (Lit(log_value="float"), "synchronizes with the host at test_lightning_graph.py:"),
    ],
)
def test_whole_step_graph_falls_back_with_the_cause(module, cause):
    """Found while the run is under way: the steps drop one tier (compile's CUDA graphs of forward
    and backward), not to eager; the record names the tier and why the whole step did not run."""
    eager, _, _ = _fit(Lit(sync=module.sync, log_value=module.log_value), None, epochs=1)
    got, _, recs = _fit(module, "cuda_graph", epochs=1)
    rec = recs["cuda_graph"]
    assert rec.status == "applied" and rec.detail.startswith("forward+backward graphed (whole step: "), rec
    assert cause in rec.detail, rec
    assert max(abs(a - b) / abs(a) for a, b in zip(eager, got)) < 1e-4


@pytest.mark.gpu
def test_a_hook_inside_the_step_keeps_compiles_graphs():
    _, _, recs = _fit(AfterBackward(), "cuda_graph", epochs=1)
    rec = recs["cuda_graph"]
    assert rec.status == "applied" and rec.detail.startswith("forward+backward graphed (whole step: "), rec
    assert "on_after_backward" in rec.detail, rec


def test_make_capturable_turns_lr_into_a_tensor_a_scheduler_reaches():
    from fastloop.errors import GraphIneligible
    from fastloop.speedups.cuda_graph.graph_capture import make_capturable, sync_lr

    p = [torch.nn.Parameter(torch.randn(3))]
    fused_sgd = torch.optim.SGD(p, lr=0.1, momentum=0.9, fused=True)
    pairs = make_capturable(fused_sgd)
    lr = fused_sgd.param_groups[0]["lr"]
    assert torch.is_tensor(lr) and float(lr) == pytest.approx(0.1)
    assert [(p.group, p.tensor) for p in pairs] == [(fused_sgd.param_groups[0], lr)]
    fused_sgd.param_groups[0]["lr"] = 0.05  # a scheduler that assigns a float
    sync_lr(pairs)
    assert fused_sgd.param_groups[0]["lr"] is lr and float(lr) == pytest.approx(0.05)
    sched = torch.optim.lr_scheduler.StepLR(fused_sgd, step_size=1, gamma=0.5)  # fills the tensor in place
    p[0].grad = torch.zeros(3)
    fused_sgd.step()
    sched.step()
    sync_lr(pairs)
    assert fused_sgd.param_groups[0]["lr"] is lr and float(lr) == pytest.approx(0.025)
    plain_sgd = torch.optim.SGD(p, lr=0.1, foreach=True)  # reads a float lr: it stays one (baked in)
    assert make_capturable(plain_sgd) == [] and plain_sgd.param_groups[0]["lr"] == 0.1
    adam = torch.optim.AdamW(p, lr=1e-3)
    make_capturable(adam)
    assert adam.param_groups[0]["capturable"] is True and torch.is_tensor(adam.param_groups[0]["lr"])
    with pytest.raises(GraphIneligible, match="LBFGS has no capturable implementation"):
        make_capturable(torch.optim.LBFGS(p))
