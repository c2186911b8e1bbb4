"""A zoo module with a wall clock outside fastloop: a plain Lightning callback that reads the
host clock (``time.perf_counter``) at the end of every training batch and writes the readings
to the file named by ``ZOO_CLOCK_FILE`` when the fit ends. It does not synchronize (that would
change the step): in steady state the host runs ahead of the GPU by a constant queue, so the
difference of two readings N steps apart is the time of those N steps to within a step or two
of queue jitter at each end, small against a 2 s window."""

from __future__ import annotations

import importlib
import json
import os
import time

try:
    from lightning.pytorch import Callback
except ImportError:  # pragma: no cover
    from pytorch_lightning import Callback  # type: ignore[no-redef]


class WallClock(Callback):
    def __init__(self) -> None:
        self.t: list[float] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.t.append(time.perf_counter())

    def on_train_end(self, trainer, pl_module) -> None:
        path = os.environ.get("ZOO_CLOCK_FILE")
        if path:
            with open(path, "w") as f:
                json.dump({"batch_end_s": self.t}, f)


def make(module: str = "cifar_resnet", **kwargs):
    out = importlib.import_module(f"benchmarks.zoo.{module}").make(**kwargs)
    model, data = out[0], out[1]
    trainer_kwargs = dict(out[2]) if len(out) == 3 else {}
    trainer_kwargs["callbacks"] = [*trainer_kwargs.get("callbacks", []), WallClock()]
    return model, data, trainer_kwargs
