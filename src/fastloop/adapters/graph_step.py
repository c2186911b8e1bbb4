"""The plain loop's driver of the whole-step graph (forward + backward + optimizer step): the
engine is :class:`fastloop.speedups.cuda_graph.captured_step.CapturedStep`, the same for Lightning; this
module hands it the loop's step function and batch.

The warm-up steps are real steps (the engine's rule, as under Lightning): nothing is rolled
back, and a run graphed from its fourth step trains as the eager run does. The engine guards the
model (its modes and Python attributes, which parameters train) and searches the model and the
step function (its closure, the globals it names) for host generators.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable
from typing import Any

import torch

from fastloop.speedups.cuda_graph.captured_step import CapturedStep, Entry

__all__ = ["GraphedStep"]


class GraphedStep:
    """``loss = step_fn(model, batch); loss.backward(); optimizer.step()`` through the captured-step
    engine, one graph per batch shape.

    Args:
        model, optimizer: the training objects (the optimizer is prepared by the engine: fused or
            capturable, its lr a device tensor the scheduler fills).
        step_fn: ``step_fn(model, batch) -> loss``.
        autocast_dtype: autocast dtype inside the step (None for fp32).
        schedulers: the run's schedulers (the engine refuses the whole step where a graph could
            not follow them).
        on_fallback: called once with the reason when the whole step stops replaying.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        step_fn: Callable[[torch.nn.Module, Any], torch.Tensor],
        autocast_dtype: torch.dtype | None = None,
        *,
        schedulers: Iterable[Any] = (),
        on_fallback: Callable[[str], None] | None = None,
    ) -> None:
        self.model, self.optimizer, self.step_fn = model, optimizer, step_fn
        self.autocast_dtype = autocast_dtype
        self.engine = CapturedStep(on_fallback=on_fallback)
        self.engine.prepare(optimizer, schedulers, model=model, roots=[step_fn])

    def _autocast(self) -> contextlib.AbstractContextManager:
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        # no weight cache: a graph must not keep casts made at capture of weights the step updates
        return torch.autocast("cuda", dtype=self.autocast_dtype, cache_enabled=False)

    def _one(self, batch: Any) -> torch.Tensor:
        self.optimizer.zero_grad(set_to_none=True)
        with self._autocast():
            loss = self.step_fn(self.model, batch)
        loss.backward()
        self.optimizer.step()
        return loss.detach()

    @staticmethod
    def _replayed(entry: Entry) -> torch.Tensor:
        return entry.out.clone()  # the graph's loss buffer is overwritten by the next replay

    def __call__(self, batch: Any) -> torch.Tensor:
        """Run one step the way the engine routes it: eager, checked, captured or replayed."""
        batch = self.engine.batch(batch)
        return self.engine.step(lambda: self._one(batch), replayed=self._replayed)
