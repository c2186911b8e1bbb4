"""Whole-step CUDA graph capture for the plain loop (forward + backward + optimizer step), on
the capture core both adapters share (:class:`fastloop.speedups.graph_capture.StepGraphs`).

Follows PyTorch's "whole network capture" recipe: checked warm-up steps on a side stream, one
step captured into a graph with static input buffers and a capturable optimizer, then per step
the batch copied into the static buffers and the graph replayed. The warm-up steps change the
weights, so the model's and optimizer's state are restored in place afterwards: the first replay
starts from exactly the state the eager loop would have started from.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import Any

import torch

from fastloop.data import map_tensors
from fastloop.errors import GraphIneligible
from fastloop.speedups.graph_capture import StepGraphs, copy_into, make_capturable, state_tensors, sync_lr

__all__ = ["GraphedStep"]


class GraphedStep:
    """Capture ``loss = step_fn(model, batch); loss.backward(); optimizer.step()``, one graph per
    batch shape.

    Args:
        model, optimizer: the training objects (the optimizer is switched to capturable).
        step_fn: ``step_fn(model, batch) -> loss``; must not synchronize with the host.
        autocast_dtype: autocast dtype inside the graph (None for fp32).
        warmup: eager warm-up iterations on a side stream before capture (PyTorch needs >= 1;
            DDP needs 11).
    """

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                 step_fn: Callable[[torch.nn.Module, Any], torch.Tensor],
                 autocast_dtype: torch.dtype | None = None, warmup: int = 3) -> None:
        self.model, self.optimizer, self.step_fn = model, optimizer, step_fn
        self.autocast_dtype = autocast_dtype
        self.warmup = warmup
        self.graphs = StepGraphs()
        self._lr_tensors: list[tuple[dict, torch.Tensor]] = []

    def _autocast(self):
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast("cuda", dtype=self.autocast_dtype, cache_enabled=False)

    def _one(self, batch: Any) -> torch.Tensor:
        with self._autocast():
            loss = self.step_fn(self.model, batch)
        loss.backward()
        self.optimizer.step()
        return loss

    def sync_lr(self) -> None:
        """After an LR scheduler step: copy the new float lr into the graph's lr tensor."""
        sync_lr(self._lr_tensors)

    def capture(self, batch: Any) -> float:
        """Warm up, capture the graph of ``batch``'s shape and restore state; returns the capture's
        wall time in seconds.

        Raises GraphIneligible (state restored, nothing captured) if the step synchronizes with
        the host, draws random numbers on the host, or cannot be captured.
        """
        t0 = time.perf_counter()
        self._lr_tensors = make_capturable(self.optimizer)
        params = [*self.model.parameters(), *self.model.buffers()]
        saved_params = [t.detach().clone() for t in params]
        before = {id(t): t.detach().clone() for t in state_tensors(self.optimizer)}
        static = map_tensors(lambda t: t.clone(), batch)
        try:
            for _ in range(self.warmup):
                self.optimizer.zero_grad(set_to_none=True)
                try:
                    _, why = StepGraphs.checked(lambda: self._one(static))
                except RuntimeError as err:
                    raise GraphIneligible(f"capture failed: {str(err).splitlines()[0]}") from None
                if why:
                    raise GraphIneligible(why)
            self.optimizer.zero_grad(set_to_none=True)
            graph, loss = self.graphs.capture(lambda: self._one(static))
        finally:
            with torch.no_grad():
                for t, s in zip(params, saved_params):
                    t.copy_(s)
                for t in state_tensors(self.optimizer):
                    if id(t) in before:
                        t.copy_(before[id(t)])
                    else:
                        t.zero_()  # fresh optimizer state: zero moments, step 0
            torch.cuda.synchronize()
        seconds = time.perf_counter() - t0
        self.graphs.add(StepGraphs.key(batch), (graph, static, loss), seconds)
        return seconds

    def __call__(self, batch: Any) -> torch.Tensor:
        """Run one step: replay the graph of the batch's shape; a shape met for the second time
        (a bucket of ``pad_buckets``) is captured first (the core's rule); else eagerly."""
        key = StepGraphs.key(batch)
        if self.graphs.route(key) == "capture":
            try:
                self.capture(batch)
            except GraphIneligible as err:
                self.graphs.refuse(key, str(err))
        entry = self.graphs.entries.get(key)
        if entry is not None:
            graph, static_batch, static_loss = entry
            copy_into(static_batch, batch)
            graph.replay()
            return static_loss.detach().clone()
        self.optimizer.zero_grad(set_to_none=True)
        return self._one(batch).detach()

    def shapes_captured(self) -> dict:
        """The graphs per batch shape, as the Lightning capture reports them."""
        return self.graphs.summary()
