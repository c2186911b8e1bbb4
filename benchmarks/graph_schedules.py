"""Does the whole-step CUDA graph follow the scheduler (issue 63)? 16 steps eager and with
``cuda_graph`` on the same initial weights and batches, fp32 (TF32 off), through both adapters:

- (a) SGD(momentum=0.9) + StepLR(step_size=1, gamma=0.5): the lr halves every step; a graph that
  baked it in would keep the capture step's lr;
- (b) AdamW + OneCycleLR (cycle_momentum on, its default: beta1 cycles every step, which a graph
  bakes in): the whole step must be refused, naming the scheduler, and the run go one tier down.

For each: the tier and reason fastloop recorded, and the largest difference of the parameters
after the run from eager's, over the parameters' scale (must be <= 1e-5 in fp32). The CPU test
of the same runs on a stand-in for the graphs: tests/test_captured_step.py.

Usage: ``python3 benchmarks/run.py graph-schedules`` (a GPU; writes graph_schedules.json under $OUT).
"""

from __future__ import annotations

import json
import os
import sys

import torch
from torch.utils.data import DataLoader, TensorDataset

from fastloop._compat import LightningModule, Trainer
from fastloop.lightning import callbacks
from fastloop.loop import FastLoop

STEPS, BATCH, WIDTH = 16, 64, 512


def _sgd(params):
    return torch.optim.SGD(params, lr=0.1, momentum=0.9)


def _steplr(opt):
    return torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)


def _adamw(params):
    return torch.optim.AdamW(params, lr=1e-3)


def _onecycle(opt):
    return torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=1e-2, total_steps=4 * STEPS)


CASES = {"sgd_momentum_steplr": (_sgd, _steplr), "adamw_onecycle": (_adamw, _onecycle)}


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(WIDTH, WIDTH),
        torch.nn.GELU(),
        torch.nn.Linear(WIDTH, WIDTH),
        torch.nn.GELU(),
        torch.nn.Linear(WIDTH, 10),
    )


def _loader() -> DataLoader:
    g = torch.Generator().manual_seed(1)
    ds = TensorDataset(torch.randn(8 * BATCH, WIDTH, generator=g), torch.randint(0, 10, (8 * BATCH,), generator=g))
    return DataLoader(ds, batch_size=BATCH)


def plain(case: str, spec: str, device: str = "cuda") -> tuple[torch.nn.Module, dict]:
    make_opt, make_sched = CASES[case]
    model = _model().to(device)
    opt = make_opt(model.parameters())
    loop = FastLoop(
        model,
        opt,
        _loader(),
        loss_fn=torch.nn.functional.cross_entropy,
        speedups=spec,
        scheduler=make_sched(opt),
        device=device,
    )
    res = loop.train(steps=STEPS)
    rec = res.records[0] if res.records else None
    return model, {
        "tier": res.extra.get("cuda_graph_tier"),
        "why_not_whole": res.extra.get("cuda_graph_why_not_whole"),
        "status": rec.status if rec else None,
        "detail": rec.detail if rec else None,
        "lr_last": float(opt.param_groups[0]["lr"]),
        "extra": res.extra,
    }


class Lit(LightningModule):
    def __init__(self, case: str) -> None:
        super().__init__()
        self.net, self.case = _model(), case

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.cross_entropy(self.net(x), y)
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self):
        make_opt, make_sched = CASES[self.case]
        opt = make_opt(self.parameters())
        return {"optimizer": opt, "lr_scheduler": {"scheduler": make_sched(opt), "interval": "step"}}


def lightning(case: str, spec: str, accelerator: str = "gpu") -> tuple[torch.nn.Module, dict]:
    module = Lit(case)
    trainer = Trainer(
        max_steps=STEPS,
        accelerator=accelerator,
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=callbacks(spec),
    )
    trainer.fit(module, train_dataloaders=_loader())
    cb = next((c for c in trainer.callbacks if getattr(c, "ctx", None) is not None), None)
    stats = cb.ctx.stats if cb is not None else {}
    rec = cb.record if cb is not None else None
    return module.net, {
        "tier": stats.get("cuda_graph_tier"),
        "why_not_whole": stats.get("cuda_graph_why_not_whole"),
        "status": rec.status if rec else None,
        "detail": rec.detail if rec else None,
        "lr_last": float(trainer.optimizers[0].param_groups[0]["lr"]),
    }


def _diff(a: torch.nn.Module, b: torch.nn.Module) -> float:
    scale = max(p.abs().max().item() for p in a.parameters())
    return max((p - q).abs().max().item() for p, q in zip(a.parameters(), b.parameters())) / scale


def main() -> int:
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    rows = []
    for adapter, run in (("FastLoop", plain), ("Lightning", lightning)):
        for case in CASES:
            eager, base = run(case, "none")
            graphed, got = run(case, "cuda_graph")
            rows.append(
                {
                    "adapter": adapter,
                    "case": case,
                    "max_abs_diff_over_scale": _diff(eager, graphed),
                    "eager_lr_last": base["lr_last"],
                    **got,
                }
            )
    out = os.environ.get("OUT", ".")
    with open(os.path.join(out, "graph_schedules.json"), "w") as f:
        json.dump(
            {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "steps": STEPS, "rows": rows},
            f,
            indent=1,
        )
    print(f"{'adapter':10} {'case':20} {'tier':26} {'diff/scale':>10} {'lr last (eager / graph)':>24}  why not whole")
    ok = True
    for r in rows:
        print(
            f"{r['adapter']:10} {r['case']:20} {str(r['tier']):26} {r['max_abs_diff_over_scale']:10.2e} "
            f"{r['eager_lr_last']:11.3e} / {r['lr_last']:.3e}  {r['why_not_whole'] or '-'}"
        )
        ok &= r["max_abs_diff_over_scale"] <= 1e-5 and r["status"] == "applied"
    print("all within 1e-5 of the parameters' scale" if ok else "NOT all within 1e-5 of the parameters' scale")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
