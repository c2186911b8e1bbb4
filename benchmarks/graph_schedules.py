"""Does a whole-step CUDA graph train what eager trains? Each case below runs the same steps eager
and with ``cuda_graph`` on the same initial weights and batches, fp32 (TF32 off), through each
adapter it applies to (``FastLoop`` and the Lightning callbacks). A graph replays what the step's
Python decided once, so every case changes something that Python reads mid-run (a scheduler's
lr, the param groups, which parameters train, a module's mode or attribute, the accumulation,
the batch's non-tensor content or key order, a host generator, a checkpoint's optimizer state).

For each: the tier fastloop recorded, the largest difference of the parameters after the run
from eager's over the parameters' scale (it must be <= 1e-5 in fp32, whatever the tier), and the
record's reason when the tier is below the whole step (a lower tier must name its cause). The CPU
test of the same cases on a stand-in for the graphs: tests/test_captured_step.py (it imports
:data:`CASES` from here, so the GPU run and CI exercise the same code).

Usage: ``python3 benchmarks/run.py graph-schedules [CASE ...]`` (a GPU; JSON under $OUT).
"""

from __future__ import annotations

import copy
import os
import sys
import tempfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from fastloop._compat import Callback, LightningModule, Trainer
from fastloop.lightning import callbacks
from fastloop.loop import FastLoop

BATCHES, BATCH, WIDTH = 8, 64, 512
"""Batches per epoch, rows per batch, the width of the models (the CPU tests pass a smaller one)."""
TOLERANCE = 1e-5
"""The largest difference of the parameters from eager's, over their scale (fp32)."""
ADAPTERS = ("FastLoop", "Lightning")


def _sgd(params: Iterable) -> torch.optim.Optimizer:
    return torch.optim.SGD(params, lr=0.1, momentum=0.9)


def _adamw(params: Iterable) -> torch.optim.Optimizer:
    return torch.optim.AdamW(params, lr=1e-3)


def _adamw_cpu_tensor_lr(params: Iterable) -> torch.optim.Optimizer:
    # PyTorch's recipe for a compiled optimizer with a scheduler: the lr a CPU tensor
    return torch.optim.AdamW(params, lr=torch.tensor(1e-3))


def _steplr(opt: torch.optim.Optimizer) -> Any:
    return torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)


def _steplr_slow(opt: torch.optim.Optimizer) -> Any:
    return torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.5)


def _onecycle(opt: torch.optim.Optimizer, cycle_momentum: bool = True) -> Any:
    return torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=1e-2, total_steps=64, cycle_momentum=cycle_momentum)


def _warmup(opt: torch.optim.Optimizer) -> Any:
    return torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 8))


def _restarts(opt: torch.optim.Optimizer) -> Any:
    return torch.optim.lr_scheduler.CosineAnnealingWarmRestarts(opt, T_0=4)


def _plateau(opt: torch.optim.Optimizer) -> Any:
    return torch.optim.lr_scheduler.ReduceLROnPlateau(opt, factor=0.5, patience=1)


class _OnPlateau:
    """ReduceLROnPlateau stepped with a metric that never improves (FastLoop steps a scheduler
    without arguments; Lightning passes the logged ``plateau_metric``, the same constant)."""

    def __init__(self, sched: Any) -> None:
        self.sched = sched

    def step(self) -> None:
        self.sched.step(1.0)


def _mlp(width: int) -> torch.nn.Module:
    return torch.nn.Sequential(
        torch.nn.Linear(width, width),
        torch.nn.GELU(),
        torch.nn.Linear(width, width),
        torch.nn.GELU(),
        torch.nn.Linear(width, 10),
    )


class _WithBackbone(torch.nn.Module):
    """A backbone and a head, as ``BackboneFinetuning`` expects (``module.backbone``)."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.backbone = torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.GELU())
        self.head = torch.nn.Linear(width, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.backbone(x))


class _Scaled(torch.nn.Module):
    """An MLP with BatchNorm and a Python number its forward reads (a dropout ``p`` stands for it)."""

    def __init__(self, width: int) -> None:
        super().__init__()
        # no bias before BatchNorm: its gradient is rounding noise, which Adam turns into steps of
        # +-lr whose signs differ between any two implementations
        self.inp = torch.nn.Linear(width, width, bias=False)
        self.bn = torch.nn.BatchNorm1d(width)
        self.out = torch.nn.Linear(width, 10)
        self.factor = 1.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(torch.nn.functional.gelu(self.bn(self.inp(x))) * self.factor)


def _denoiser(width: int) -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.GELU(), torch.nn.Linear(width, width))


def _xy(width: int, k: int, g: torch.Generator) -> Any:
    return torch.randn(BATCH, width, generator=g), torch.randint(0, 10, (BATCH,), generator=g)


def _multitask(width: int, k: int, g: torch.Generator) -> Any:
    # equal shapes and dtypes for both tasks: only the string tells the step which loss to take
    y = torch.randint(0, 10, (BATCH,), generator=g).float() if k % 2 == 0 else torch.randn(BATCH, generator=g)
    return {"task": "cls" if k % 2 == 0 else "reg", "x": torch.randn(BATCH, width, generator=g), "y": y}


def _two_orders(width: int, k: int, g: torch.Generator) -> Any:
    clean = torch.randn(BATCH, width, generator=g)
    noisy = clean + 0.1 * torch.randn(BATCH, width, generator=g)
    return {"noisy": noisy, "clean": clean} if k % 2 == 0 else {"clean": clean, "noisy": noisy}


def _ce(state: dict, net: torch.nn.Module, batch: Any) -> torch.Tensor:
    x, y = batch
    return torch.nn.functional.cross_entropy(net(x), y)


def _task_loss(state: dict, net: torch.nn.Module, batch: dict) -> torch.Tensor:
    out = net(batch["x"])
    if batch["task"] == "cls":
        return torch.nn.functional.cross_entropy(out, batch["y"].long())
    return torch.nn.functional.mse_loss(out[:, 0], batch["y"])


def _denoise_loss(state: dict, net: torch.nn.Module, batch: dict) -> torch.Tensor:
    return torch.nn.functional.mse_loss(net(batch["noisy"]), batch["clean"])


def _rng_state() -> dict:
    return {"rng": np.random.default_rng(0)}


def _drawing_loss(state: dict, net: torch.nn.Module, batch: Any) -> torch.Tensor:
    x, y = batch
    scale = float(state["rng"].uniform(0.5, 1.5))  # a host draw the step uses as a Python number
    return torch.nn.functional.cross_entropy(net(x * scale), y)


def _freeze(net: torch.nn.Module) -> None:
    for p in net.backbone.parameters():
        p.requires_grad_(False)


def _unfreeze_backbone(net: torch.nn.Module, opt: torch.optim.Optimizer) -> None:
    """What ``BackboneFinetuning`` does at its epoch, in a plain loop."""
    for p in net.backbone.parameters():
        p.requires_grad_(True)
    opt.add_param_group({"params": list(net.backbone.parameters()), "lr": 1e-4})


def _requires_grad(value: bool) -> Callable[[torch.nn.Module, Any], None]:
    def toggle(net: torch.nn.Module, opt: Any) -> None:
        for p in net[0].parameters():
            p.requires_grad_(value)

    return toggle


def _backbone_callbacks() -> list:
    from fastloop._compat import pl

    return [pl.callbacks.BackboneFinetuning(unfreeze_backbone_at_epoch=1)]


def _accumulation_callbacks() -> list:
    from fastloop._compat import pl

    return [pl.callbacks.GradientAccumulationScheduler({0: 1, 2: 4})]


@dataclass(frozen=True)
class Case:
    """One scenario: what trains, what changes mid-run, and in which adapters."""

    what: str
    optimizer: Callable[[Iterable], torch.optim.Optimizer] = _adamw
    scheduler: Callable[[torch.optim.Optimizer], Any] | None = None
    model: Callable[[int], torch.nn.Module] = _mlp
    batch: Callable[[int, int, torch.Generator], Any] = _xy
    loss: Callable[[dict, torch.nn.Module, Any], torch.Tensor] = _ce
    state: Callable[[], dict] = dict
    """Per-run state the loss reads (a generator), built afresh for each run."""
    events: dict[int, Callable[[torch.nn.Module, torch.optim.Optimizer], None]] = field(default_factory=dict)
    """Changes made before the step of that index (FastLoop: as the loader yields its batch;
    Lightning: in ``on_train_batch_start``, after the batch reached the device)."""
    plain_events: dict[int, Callable] | None = None
    """FastLoop's events where they differ (what a Lightning callback of the case does by hand)."""
    plain_setup: Callable[[torch.nn.Module], None] | None = None
    """Done to the model before FastLoop's optimizer is built (what the callback does in setup)."""
    trains: Callable[[torch.nn.Module], Iterable] | None = None
    """The parameters the optimizer is built over (None: all that require grad)."""
    lightning_callbacks: Callable[[], list] = list
    adapters: tuple[str, ...] = ADAPTERS
    epochs: int = 2
    monitor: bool = False
    """Lightning steps the scheduler with a logged metric (ReduceLROnPlateau)."""
    resume: bool = False
    """Resumed from a checkpoint written by an eager run of one epoch."""
    whole: bool = True
    """The whole step is replayed (else the record names why it is not, before or during the run)."""
    why: str | None = None
    """Words of the reason recorded when the whole step is not replayed."""
    change: tuple[str, ...] = ()
    """Words of the state change the record names, with its step (a graph captured for the new state)."""


CASES: dict[str, Case] = {
    "sgd_momentum_steplr": Case("SGD(momentum) + StepLR halving the lr every step", _sgd, _steplr),
    "adamw_onecycle": Case(
        "AdamW + OneCycleLR with cycle_momentum=False (the lr cycles, the betas stay)",
        _adamw,
        lambda o: _onecycle(o, cycle_momentum=False),
    ),
    "adamw_onecycle_betas": Case(
        "AdamW + OneCycleLR cycling the betas (refused before step 1)",
        _adamw,
        _onecycle,
        whole=False,
        why="OneCycleLR cycles AdamW's betas",
    ),
    "cpu_tensor_lr_steplr": Case("AdamW(lr=torch.tensor(1e-3)) + StepLR", _adamw_cpu_tensor_lr, _steplr_slow),
    "lambdalr_warmup": Case("AdamW + LambdaLR warm-up over 8 steps", _adamw, _warmup),
    "cosine_warm_restarts": Case("SGD(momentum) + CosineAnnealingWarmRestarts(T_0=4)", _sgd, _restarts),
    "reduce_on_plateau": Case(
        "AdamW + ReduceLROnPlateau (a metric that never improves)", _adamw, _plateau, monitor=True
    ),
    "backbone_finetuning": Case(
        "BackboneFinetuning unfreezing the backbone at epoch 1 (add_param_group)",
        model=_WithBackbone,
        lightning_callbacks=_backbone_callbacks,
        plain_setup=_freeze,
        plain_events={BATCHES: _unfreeze_backbone},
        epochs=3,
        change=(f"step {BATCHES}: param groups 1 -> 2", "backbone.0.weight, ", "now require grad"),
    ),
    "param_group_added": Case(
        "a param group added at step 7 for parameters that already required grad",
        model=_WithBackbone,
        trains=lambda net: net.head.parameters(),
        events={7: lambda net, opt: opt.add_param_group({"params": list(net.backbone.parameters()), "lr": 1e-4})},
        change=("step 7: param groups 1 -> 2",),
    ),
    "requires_grad_toggle": Case(
        "the first layer frozen at step 5, unfrozen at step 11",
        events={5: _requires_grad(False), 11: _requires_grad(True)},
        change=("step 5: ", "0.bias no longer require grad", "step 11: ", "0.bias now require grad"),
    ),
    "submodule_eval": Case(
        "BatchNorm put in eval() at step 6",
        model=_Scaled,
        events={6: lambda net, opt: net.bn.eval()},
        change=("step 6: ", "bn.training True -> False"),
    ),
    "module_attribute": Case(
        "a Python number forward reads changed at step 6",
        model=_Scaled,
        events={6: lambda net, opt: setattr(net, "factor", 0.5)},
        change=("step 6: ", "factor 1.0 -> 0.5"),
    ),
    "accumulation_schedule": Case(
        "GradientAccumulationScheduler({0: 1, 2: 4})",
        lightning_callbacks=_accumulation_callbacks,
        adapters=("Lightning",),
        epochs=3,
        whole=False,
        why="accumulate_grad_batches became 4",
    ),
    "multitask_string": Case("a dict batch whose 'task' string alternates", batch=_multitask, loss=_task_loss),
    "dict_key_orders": Case(
        "dict batches of two same-shaped tensors in two key orders",
        model=_denoiser,
        batch=_two_orders,
        loss=_denoise_loss,
    ),
    "numpy_generator": Case(
        "the step draws from np.random.default_rng",
        loss=_drawing_loss,
        state=_rng_state,
        whole=False,
        why="draws random numbers on the host",
    ),
    "resumed_fit": Case("resumed from an eager run's checkpoint", _sgd, _steplr_slow, resume=True),
}


class _Batches(Dataset):
    """Pre-made batches (a DataLoader with batch_size=None hands them over as they are)."""

    def __init__(self, case: Case, width: int) -> None:
        g = torch.Generator().manual_seed(1)
        self.items = [case.batch(width, k, g) for k in range(BATCHES)]

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, k: int) -> Any:
        return self.items[k]


def _loader(case: Case, width: int) -> DataLoader:
    return DataLoader(_Batches(case, width), batch_size=None)


class _Evented:
    """FastLoop's loader with the case's events made before the step of their index."""

    def __init__(self, loader: DataLoader, fire: Callable[[int], None]) -> None:
        self.loader, self.fire, self.k = loader, fire, 0

    def __iter__(self) -> Any:
        for batch in self.loader:
            self.fire(self.k)
            self.k += 1
            yield batch


def _build(case: Case, width: int) -> torch.nn.Module:
    torch.manual_seed(0)
    return case.model(width)


def _plain_checkpoint(case: Case, width: int, device: str) -> dict:
    """The state after one eager epoch (the resumed runs load it after FastLoop was built)."""
    model, opt, sched = _plain_objects(case, width, device)
    state = case.state()
    FastLoop(
        model, opt, _loader(case, width), step_fn=lambda m, b: case.loss(state, m, b), scheduler=sched, device=device
    ).train(steps=BATCHES)
    return copy.deepcopy({"model": model.state_dict(), "opt": opt.state_dict(), "sched": sched.state_dict()})


def _plain_objects(case: Case, width: int, device: str) -> tuple:
    model = _build(case, width).to(device)
    if case.plain_setup is not None:
        case.plain_setup(model)
    opt = case.optimizer(_trained(case, model))
    sched = case.scheduler(opt) if case.scheduler is not None else None
    return model, opt, sched


def _trained(case: Case, net: torch.nn.Module) -> list:
    return list(case.trains(net)) if case.trains is not None else [p for p in net.parameters() if p.requires_grad]


def plain(name: str, spec: str, device: str = "cuda", width: int = WIDTH) -> tuple[torch.nn.Module, dict]:
    """The case through FastLoop: the trained model and what fastloop recorded."""
    case = CASES[name]
    ckpt = _plain_checkpoint(case, width, device) if case.resume else None
    model, opt, sched = _plain_objects(case, width, device)
    events = dict(case.events if case.plain_events is None else case.plain_events)
    if ckpt is not None:  # a resume after FastLoop prepared the optimizer: load_state_dict replaces its groups

        def load(net: torch.nn.Module, o: torch.optim.Optimizer) -> None:
            net.load_state_dict(ckpt["model"])
            o.load_state_dict(ckpt["opt"])
            sched.load_state_dict(ckpt["sched"])

        events[0] = load
    state = case.state()
    loop = FastLoop(
        model,
        opt,
        _Evented(_loader(case, width), lambda k: events[k](model, opt) if k in events else None),
        step_fn=lambda m, b: case.loss(state, m, b),
        speedups=spec,
        scheduler=_OnPlateau(sched) if case.monitor else sched,
        device=device,
    )
    res = loop.train(steps=case.epochs * BATCHES)
    rec = res.records[0] if res.records else None
    return model, {
        "tier": res.extra.get("cuda_graph_tier"),
        "why_not_whole": res.extra.get("cuda_graph_why_not_whole"),
        "status": rec.status if rec else None,
        "detail": rec.detail if rec else None,
        "extra": res.extra,
        "engine": loop.graphed.engine if loop.graphed is not None else None,
    }


class Lit(LightningModule):
    def __init__(self, case: Case, width: int) -> None:
        super().__init__()
        self.case = case
        self.net = _build(case, width)
        if hasattr(self.net, "backbone"):
            self.backbone = self.net.backbone
        self.state = case.state()

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        loss = self.case.loss(self.state, self.net, batch)
        self.log("train_loss", loss)
        if self.case.monitor:
            self.log("plateau_metric", loss.detach() * 0 + 1)
        return loss

    def configure_optimizers(self) -> Any:
        opt = self.case.optimizer(_trained(self.case, self.net))
        if self.case.scheduler is None:
            return opt
        conf = {"scheduler": self.case.scheduler(opt), "interval": "step"}
        if self.case.monitor:
            conf["monitor"] = "plateau_metric"
        return {"optimizer": opt, "lr_scheduler": conf}


class _Events(Callback):
    """The case's events, before the step of their index (after the batch reached the device)."""

    def __init__(self, case: Case) -> None:
        self.case, self.k = case, 0

    def on_train_batch_start(self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int) -> None:
        event = self.case.events.get(self.k)
        if event is not None:
            event(pl_module.net, trainer.optimizers[0])
        self.k += 1


def _trainer(case: Case, accelerator: str, extra: list, **kwargs: Any) -> Trainer:
    return Trainer(
        accelerator=accelerator,
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[*case.lightning_callbacks(), _Events(case), *extra],
        **kwargs,
    )


def lightning(name: str, spec: str, accelerator: str = "gpu", width: int = WIDTH) -> tuple[torch.nn.Module, dict]:
    """The case through the Lightning callbacks: the trained net and what fastloop recorded."""
    case = CASES[name]
    module = Lit(case, width)
    extra = callbacks(spec) if spec != "none" else []
    with tempfile.TemporaryDirectory() as tmp:
        if case.resume:  # an eager epoch, its checkpoint, then the fit resumed from it
            first = _trainer(case, accelerator, [], max_steps=BATCHES)
            first.fit(Lit(case, width), train_dataloaders=_loader(case, width))
            path = os.path.join(tmp, "epoch.ckpt")
            first.save_checkpoint(path)
            trainer = _trainer(case, accelerator, extra, max_steps=(1 + case.epochs) * BATCHES)
            trainer.fit(module, train_dataloaders=_loader(case, width), ckpt_path=path)
        else:
            trainer = _trainer(case, accelerator, extra, max_epochs=case.epochs)
            trainer.fit(module, train_dataloaders=_loader(case, width))
    cb = next((c for c in trainer.callbacks if getattr(c, "ctx", None) is not None), None)
    stats = cb.ctx.stats if cb is not None else {}
    rec = cb.record if cb is not None else None
    graph = cb.run.graph if cb is not None and cb.run is not None else None
    return module.net, {
        "tier": stats.get("cuda_graph_tier"),
        "why_not_whole": stats.get("cuda_graph_why_not_whole"),
        "status": rec.status if rec else None,
        "detail": rec.detail if rec else None,
        "extra": dict(stats),
        "engine": graph.engine if graph is not None else None,
    }


def max_diff_over_scale(a: torch.nn.Module, b: torch.nn.Module) -> float:
    """The largest difference of two models' parameters over the first's largest magnitude."""
    scale = max(p.abs().max().item() for p in a.parameters())
    return max((p - q).abs().max().item() for p, q in zip(a.parameters(), b.parameters())) / scale


def run_case(name: str, adapter: str, device: str, width: int = WIDTH) -> dict:
    """The case eager and with cuda_graph through one adapter: the row the table prints."""
    runner = plain if adapter == "FastLoop" else lightning
    where = device if adapter == "FastLoop" else ("gpu" if device == "cuda" else device)
    eager, _ = runner(name, "none", where, width)
    graphed, got = runner(name, "cuda_graph", where, width)
    engine = got.pop("engine")
    diff = max_diff_over_scale(eager, graphed)
    tier = got["tier"]
    why = got["why_not_whole"]
    ok = diff <= TOLERANCE and got["status"] == "applied" and (tier == "whole step" or bool(why))
    case = CASES[name]
    as_expected = (tier == "whole step") == case.whole and (case.why is None or case.why in (why or ""))
    return {
        "adapter": adapter,
        "case": name,
        "what": CASES[name].what,
        "max_abs_diff_over_scale": diff,
        "ok": ok,
        "as_expected": as_expected,
        "replays": engine.replays if engine is not None else 0,
        "state_changes": list(engine.changes) if engine is not None else [],
        **{k: v for k, v in got.items() if k != "extra"},
    }


def main(argv: list[str]) -> int:
    from benchmarks._common import emit

    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    names = argv or list(CASES)
    unknown = sorted(set(names) - set(CASES))
    if unknown:
        sys.stderr.write(f"unknown case {', '.join(unknown)}; the cases: {', '.join(CASES)}\n")
        return 2
    rows = []
    for n in names:
        for a in CASES[n].adapters:
            rows.append(run_case(n, a, "cuda"))
            r = rows[-1]
            print(f"done: {a} {n}: {r['tier']}, {r['max_abs_diff_over_scale']:.2e}", flush=True)
    emit("graph_schedules", {"device": torch.cuda.get_device_name(), "tolerance": TOLERANCE, "rows": rows})
    print(f"\n{'adapter':10} {'case':22} {'tier':26} {'diff/scale':>10} {'replays':>7}  why not the whole step")
    for r in rows:
        note = "" if r["as_expected"] else "  (not the tier this case expects)"
        print(
            f"{r['adapter']:10} {r['case']:22} {str(r['tier']):26} {r['max_abs_diff_over_scale']:10.2e} "
            f"{r['replays']:7d}  {r['why_not_whole'] or '-'}{note}"
        )
        for change in r["state_changes"]:
            print(f"{'':10} {'':22} new state, new graph: {change}")
    bad = [f"{r['adapter']} {r['case']}" for r in rows if not r["ok"]]
    print(f"all within {TOLERANCE:g} of the parameters' scale" if not bad else f"NOT within {TOLERANCE:g}: {bad}")
    return 0 if not bad else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
