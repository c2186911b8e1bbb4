"""A speedup that changed nothing is not ``applied``, and cuda_graph drops one tier at a
time. CPU: the compile record of a model torch.compile cannot trace. GPU (marked): each common
pattern of ordinary Lightning code is captured whole or drops to forward+backward graphed, in
the same run, with the losses of eager training within the stated tolerance."""

from __future__ import annotations

import pytest
import torch

from fastloop.drivers.runner import run_configuration

T = "tests/targets.py"


def _record(doc: dict, name: str) -> dict:
    return next(r for r in doc["speedups"] if r["name"] == name)


def test_compile_that_compiled_nothing_is_a_fallback_with_the_reason():
    doc = run_configuration(f"{T}:untraceable", "compile", steps=4, warmup=2, device="cpu", steady_warmup=False)
    rec = _record(doc, "compile")
    assert rec["status"] == "fallback", rec
    assert "compiled no graph" in rec["reason"] and "disable" in rec["reason"]


def test_whole_step_blockers_of_manual_optimization_and_accumulation_are_named_before_the_first_step():
    from fastloop._compat import Trainer
    from fastloop.adapters.lightning_graph import whole_step_blocker
    from tests.targets import graph_gan, graph_pattern

    gan, _ = graph_gan()
    assert whole_step_blocker(Trainer(accelerator="cpu", logger=False), gan).startswith("manual optimization")
    module, _, kw = graph_pattern("accumulate")
    blocker = whole_step_blocker(Trainer(accelerator="cpu", logger=False, **kw), module)
    assert blocker.startswith("accumulate_grad_batches=2")
    plain, _ = graph_pattern("plain")
    assert whole_step_blocker(Trainer(accelerator="cpu", logger=False), plain) is None
    annealed, _ = graph_pattern("anneal")
    assert "training_step uses self.global_step: the graph would replay" in whole_step_blocker(
        Trainer(accelerator="cpu", logger=False), annealed
    )


def test_a_step_counter_read_by_the_step_or_a_method_it_calls_is_found(tmp_path):
    import importlib.util

    from fastloop.adapters.step_source import step_reads_counters

    source = """
import numpy as np
import torch
from lightning.pytorch import LightningModule

class Base(LightningModule):
    def shared(self, batch):
        return batch.sum() * (0.5 if self.trainer.current_epoch < 2 else 1.0)

class ViaMethod(Base):
    def training_step(self, batch, batch_idx):
        loss = self.shared(batch)
        self.log("loss", loss)
        return loss

class ViaIndex(LightningModule):
    def training_step(self, batch, i):
        return batch.sum() * (2.0 if i % 2 else 1.0)

class Neither(LightningModule):
    def training_step(self, batch, batch_idx):
        self.log("n", float(len(batch)))
        return batch.sum()

class OwnCounter(LightningModule):
    def __init__(self):
        super().__init__()
        self.seen, self.total = 0, torch.zeros(())

    def training_step(self, batch, batch_idx):
        self.seen += 1
        self.total += batch.sum().detach()  # a tensor's += is captured with the step
        return batch.sum() / self.seen

class TensorCounter(OwnCounter):
    def training_step(self, batch, batch_idx):
        self.total += batch.sum().detach()
        return batch.sum()

class Mixup(LightningModule):
    def training_step(self, batch, batch_idx):
        lam = float(np.random.beta(0.4, 0.4))
        return lam * batch.sum() + (1 - lam) * batch.flip(0).sum()

class CpuCoinFlip(LightningModule):
    def training_step(self, batch, batch_idx):
        flip = torch.rand(()) < 0.5  # a CPU draw: the captured step keeps the first flip
        return (batch.flip(0) if flip else batch).sum() * torch.rand((), device=batch.device)

class DeviceDraws(LightningModule):
    def training_step(self, batch, batch_idx):
        return (batch * torch.rand_like(batch)).sum() + torch.randn(3, device=batch.device).sum()

class StepsItsScheduler(LightningModule):
    def training_step(self, batch, batch_idx):
        self.lr_schedulers().step()
        return batch.sum()

class PassesItOn(Neither):
    def training_step(self, batch, batch_idx):
        return super().training_step(batch, batch_idx) + self.weighted(batch, step=batch_idx)

    def weighted(self, batch, step):
        return batch.mean()

class PassesItToOneThatReadsIt(PassesItOn):
    def weighted(self, batch, step):
        return batch.mean() * (0.1 if step < 10 else 1.0)
"""
    path = tmp_path / "user_modules.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("user_modules", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert step_reads_counters(mod.ViaMethod()) == "self.trainer.current_epoch (in shared)"
    assert step_reads_counters(mod.ViaIndex()) == "i"  # the batch index, whatever its name
    assert step_reads_counters(mod.Neither()) is None
    assert step_reads_counters(mod.OwnCounter()) == "self.seen (a Python number it updates every step)"
    assert step_reads_counters(mod.TensorCounter()) is None
    assert step_reads_counters(mod.Mixup()).startswith("np.random.beta() (a draw on the host")
    assert step_reads_counters(mod.StepsItsScheduler()).startswith("self.lr_schedulers()")
    assert step_reads_counters(mod.CpuCoinFlip()).startswith("torch.rand() (a draw on the host")
    assert step_reads_counters(mod.DeviceDraws()) is None  # draws on the GPU are replayed by the graph
    assert step_reads_counters(mod.PassesItOn()) is None  # passing the index along is not reading it
    assert step_reads_counters(mod.PassesItToOneThatReadsIt()) == "step (in weighted)"


def test_gradients_held_across_steps_are_copied_out_of_the_graph_pool_once_per_step():
    """compile's CUDA graphs leave the backward's outputs in their pool; a gradient kept in .grad
    across a step (accumulation, manual optimization) would be overwritten by the next replay
    (pytorch/pytorch#169545): it is copied before the step is marked, and only then."""
    from fastloop._compat import Trainer
    from fastloop.adapters.lightning import own_held_gradients
    from tests.targets import graph_gan, graph_pattern

    plain, _ = graph_pattern("plain")
    accumulating, _, kw = graph_pattern("accumulate")
    gan, _ = graph_gan()
    image = torch.randn(2, 3, 8, 8)
    for module in (plain, accumulating):
        module.net(image).sum().backward()
    gan.d(gan.g(torch.randn(2, 8))).sum().backward()
    one = Trainer(accelerator="cpu", logger=False)
    assert not own_held_gradients(one, plain, 0)  # Lightning clears them before the next backward
    grads = [p.grad for p in accumulating.parameters()]
    assert own_held_gradients(Trainer(accelerator="cpu", logger=False, **kw), accumulating, 1)
    assert all(p.grad is not g and torch.equal(p.grad, g) for p, g in zip(accumulating.parameters(), grads))
    assert not own_held_gradients(Trainer(accelerator="cpu", logger=False, **kw), accumulating, 1)  # once a step
    assert own_held_gradients(one, gan, 0)  # manual optimization: the step may hold them
    for p in gan.parameters():
        p.grad = None
    assert not own_held_gradients(one, gan, 1)  # nothing held: nothing copied


GPU_TOL = 2e-2
"""bf16 autocast differs from fp32 by up to ~1e-2 relative in these short runs; the graphed tiers
run the same bf16 math as the eager bf16 run they are compared with (within GPU_TOL)."""


def _losses(fn: str, spec: str, **kw):
    return run_configuration(
        f"{T}:{fn}", spec, steps=12, warmup=4, device="cuda", steady_warmup=False, target_kwargs=kw or None
    )


@pytest.mark.gpu
@pytest.mark.parametrize(
    "pattern,tier",
    [
        ("plain", "whole step"),
        ("momentum_cycling", "forward+backward graphed"),
        ("metric_object", "forward+backward graphed"),
        ("grad_clip", "whole step"),
        ("prog_bar", "whole step"),
        ("pageable", "whole step"),
        ("accumulate", "forward+backward graphed"),
        ("anneal", "forward+backward graphed"),
        ("hidden_draw", "forward+backward graphed"),
    ],
)
def test_each_pattern_is_captured_or_drops_one_tier(pattern, tier):
    eager = _losses("graph_pattern", "bf16", pattern=pattern)
    graphed = _losses("graph_pattern", "bf16,cuda_graph", pattern=pattern)
    rec = _record(graphed, "cuda_graph")
    assert rec["status"] == "applied", rec
    assert graphed["extra"].get("cuda_graph_tier") == tier, (rec, graphed["extra"])
    # the reason a step stays out of one graph is a statistic the doctor reads, not only prose
    assert bool(graphed["extra"].get("cuda_graph_why_not_whole")) == (tier != "whole step"), graphed["extra"]
    n = min(len(eager["losses"]), len(graphed["losses"]))
    diff = max(abs(a - b) / max(abs(a), 1e-6) for a, b in zip(eager["losses"][:n], graphed["losses"][:n]))
    assert diff <= GPU_TOL, f"{pattern}: losses differ by {diff:.2e} (> {GPU_TOL}) from eager"


@pytest.mark.gpu
def test_manual_optimization_with_two_optimizers_drops_one_tier():
    """A GAN (manual optimization, two optimizers, the discriminator called three times a step):
    not captured whole (the step calls the optimizers itself), forward and backward graphed, the
    losses of eager training (the sum of both losses each step)."""
    eager = run_configuration(f"{T}:graph_gan", "bf16", steps=12, warmup=4, device="cuda", steady_warmup=False)
    graphed = run_configuration(
        f"{T}:graph_gan", "bf16,cuda_graph", steps=12, warmup=4, device="cuda", steady_warmup=False
    )
    rec = _record(graphed, "cuda_graph")
    assert rec["status"] == "applied", rec
    assert graphed["extra"].get("cuda_graph_tier") == "forward+backward graphed", (rec, graphed["extra"])
    assert "manual optimization" in rec["detail"], rec
    n = min(len(eager["losses"]), len(graphed["losses"]))
    assert n >= 10
    diff = max(abs(a - b) / max(abs(a), 1e-6) for a, b in zip(eager["losses"][:n], graphed["losses"][:n]))
    assert diff <= GPU_TOL, f"losses differ by {diff:.2e} (> {GPU_TOL}) from eager"


def test_a_plain_step_function_without_host_draws_is_not_flagged():
    from fastloop.adapters.step_source import host_draws
    from tests.targets import mixup_step

    def step(model, batch):
        x, y = batch
        return torch.nn.functional.cross_entropy(model(x * torch.rand((), device=x.device)), y)  # a device draw

    assert host_draws(step) is None
    assert host_draws(mixup_step).startswith("np.random.beta() (a draw on the host")


@pytest.mark.gpu
def test_the_plain_loops_whole_step_is_not_captured_over_a_host_draw():
    import numpy as np

    from fastloop.loop import FastLoop
    from tests.targets import mixup_step, tiny_conv

    losses = {}
    for spec in ("none", "cuda_graph"):
        module, loader = tiny_conv()
        model = module.net.cuda()
        np.random.seed(0)
        loop = FastLoop(
            model,
            torch.optim.SGD(model.parameters(), lr=0.05),
            loader,
            step_fn=mixup_step,
            speedups=spec,
            device="cuda",
        )
        result = loop.train(steps=8, warmup=2)
        losses[spec] = result.losses
        if spec == "cuda_graph":
            rec = {r.name: r for r in result.records}["cuda_graph"]
            # one tier down, as under Lightning: the draw stays outside compile's graphs of the model
            assert rec.status == "applied" and rec.detail.startswith("forward+backward graphed (whole step: "), rec
            assert "np.random.beta()" in rec.detail, rec
    assert losses["none"] == pytest.approx(losses["cuda_graph"], rel=1e-4)  # the same draws (compiled fp32: 1e-4)


def test_a_draw_on_any_host_generator_is_seen_whatever_code_drew_it():
    import random

    import numpy as np

    from fastloop.adapters.step_source import step_reads_counters
    from fastloop.speedups.cuda_graph.graph_capture import host_rng_changed, host_rng_snapshot
    from tests.targets import graph_pattern

    hidden, _ = graph_pattern("hidden_draw")
    assert step_reads_counters(hidden) is None  # the draw is in a helper outside the module: only the run sees it
    for draw, which in (
        (lambda: hidden.training_step((torch.randn(2, 3, 8, 8), torch.tensor([0, 1])), 0), "torch's CPU generator"),
        (lambda: random.random(), "Python's random"),
        (lambda: np.random.beta(0.4, 0.4), "numpy's"),
    ):
        snap = host_rng_snapshot()
        draw()
        assert which in host_rng_changed(snap)
    snap = host_rng_snapshot()
    hidden.net(torch.randn(2, 3, 8, 8, generator=torch.Generator().manual_seed(0)))  # an own generator: not global
    assert host_rng_changed(snap) is None


def test_under_ddp_held_gradients_keep_compiles_graphs_out():
    """Several processes with accumulation or manual optimization: the gradients between steps are
    DDP's and cannot be copied out of the graph pool, so the tier below runs (compiled, no graphs)."""
    from fastloop._compat import Trainer
    from fastloop.adapters.lightning_run import graphs_unsafe
    from tests.targets import graph_gan, graph_pattern

    gan, _ = graph_gan()
    plain, _ = graph_pattern("plain")
    ddp = dict(accelerator="cpu", devices=2, strategy="ddp", logger=False)
    assert graphs_unsafe(Trainer(**ddp), gan).startswith("2 processes with manual optimization")
    assert graphs_unsafe(Trainer(**ddp), plain) is None  # DDP alone: the second tier is safe
    assert graphs_unsafe(Trainer(accelerator="cpu", logger=False), gan) is None  # one process: copied out instead
