"""A zoo module with a wall clock outside fastloop: a plain Lightning callback that synchronizes
the GPU and reads the host clock (``time.perf_counter``) at the start and at the end of every
training batch, and writes the readings to the file named by ``ZOO_CLOCK_FILE`` when the fit
ends. The synchronizations slow the step a little, but fastloop measures the same (slowed)
steps in the same run, so the two clocks must agree: from the start of the first measured step
(after fastloop's garbage collection that ends the warm-up) to the end of the last one."""

from __future__ import annotations

import importlib
import json
import os
import time

import torch

try:
    from lightning.pytorch import Callback
except ImportError:  # pragma: no cover
    from pytorch_lightning import Callback  # type: ignore[no-redef]


class WallClock(Callback):
    def __init__(self) -> None:
        self.start: list[float] = []
        self.end: list[float] = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        torch.cuda.synchronize()
        self.start.append(time.perf_counter())

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        torch.cuda.synchronize()
        self.end.append(time.perf_counter())

    def on_train_end(self, trainer, pl_module) -> None:
        path = os.environ.get("ZOO_CLOCK_FILE")
        if path:
            with open(path, "w") as f:
                json.dump({"batch_start_s": self.start, "batch_end_s": self.end}, f)


def make(module: str = "cifar_resnet", **kwargs):
    out = importlib.import_module(f"benchmarks.zoo.{module}").make(**kwargs)
    model, data = out[0], out[1]
    trainer_kwargs = dict(out[2]) if len(out) == 3 else {}
    trainer_kwargs["callbacks"] = [*trainer_kwargs.get("callbacks", []), WallClock()]
    return model, data, trainer_kwargs
