"""Whole-step CUDA graph capture for the plain loop (forward + backward + optimizer step).

Follows PyTorch's "whole network capture" recipe: warm up on a side stream, capture one step
into a graph with static input buffers and a capturable optimizer, then per step copy the batch
into the static buffers and replay. The warm-up steps change the weights, so the model's and
optimizer's state are restored in place afterwards: the first replay starts from exactly the
state the eager loop would have started from.
"""

from __future__ import annotations

import contextlib
import time
import traceback
from collections.abc import Callable
from typing import Any

import torch

from fastloop.adapters.step_source import host_rng_changed, host_rng_snapshot
from fastloop.measure.sync_site import user_site
from fastloop.data import map_tensors
from fastloop.errors import GraphIneligible
from fastloop.speedups.cuda_graph import MAX_GRAPHS

__all__ = ["GraphIneligible", "GraphedStep", "make_capturable", "sync_lr"]


def _state_tensors(opt: torch.optim.Optimizer) -> list[torch.Tensor]:
    return [v for st in opt.state.values() for v in st.values() if torch.is_tensor(v)]


def shapes_of(batch: Any) -> list:
    out: list = []
    map_tensors(lambda t: (out.append((tuple(t.shape), t.dtype, t.device)), t)[1], batch)
    return out


def copy_into(static: Any, batch: Any) -> None:
    dst: list[torch.Tensor] = []
    map_tensors(lambda t: (dst.append(t), t)[1], static)
    src: list[torch.Tensor] = []
    map_tensors(lambda t: (src.append(t), t)[1], batch)
    for d, s in zip(dst, src):
        d.copy_(s, non_blocking=True)


def make_capturable(opt: torch.optim.Optimizer) -> list[tuple[dict, torch.Tensor]]:
    """Prepare ``opt`` for capture in place: ``capturable=True`` where the optimizer has it, its
    step counters on the parameters' device, and its lr a device tensor where the implementation
    reads one (capturable or fused), so that a scheduler's new lr reaches the graph. Returns the
    (param group, lr tensor) pairs for :func:`sync_lr`. Raises GraphIneligible for an optimizer
    with no capturable implementation."""
    if "capturable" not in opt.defaults and not isinstance(opt, torch.optim.SGD):
        raise GraphIneligible(f"{type(opt).__name__} has no capturable implementation")
    device = next(p.device for g in opt.param_groups for p in g["params"])
    pairs = []
    for g in opt.param_groups:
        if "capturable" in g:
            g["capturable"] = True
        # a float lr would be baked into the graph; a tensor lr can follow a scheduler
        if ("capturable" in g or g.get("fused")) and not torch.is_tensor(g["lr"]):
            g["lr"] = torch.tensor(float(g["lr"]), device=device)
        if torch.is_tensor(g["lr"]):
            pairs.append((g, g["lr"]))
    for p, st in opt.state.items():
        if "step" in st and torch.is_tensor(st["step"]) and st["step"].device != p.device:
            st["step"] = st["step"].to(p.device)
    return pairs


def sync_lr(pairs: list[tuple[dict, torch.Tensor]]) -> None:
    """Where a scheduler put a float lr back into a param group, copy it into the group's lr
    tensor (no host sync) and put the tensor back."""
    for g, t in pairs:
        if g["lr"] is not t:
            t.fill_(float(g["lr"]))
            g["lr"] = t


class GraphedStep:
    """Capture ``loss = step_fn(model, batch); loss.backward(); optimizer.step()`` once.

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
        self.graph: torch.cuda.CUDAGraph | None = None
        self.static_batch: Any = None
        self.static_loss: torch.Tensor | None = None
        self._shape_key: list | None = None
        self._lr_tensors: list[tuple[dict, torch.Tensor]] = []
        self._graphs: dict[tuple, tuple] = {}  # batch shape -> (graph, static batch, static loss)
        self._seen_once: set[tuple] = set()  # shapes met once after the first capture (captured at the second)
        self._no_graph: set[tuple] = set()  # shapes whose capture failed: eager
        self._pool: Any = None
        self.late_captures: list[float] = []  # seconds of each capture after the first

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

    def _make_capturable(self) -> None:
        self._lr_tensors = make_capturable(self.optimizer)

    def sync_lr(self) -> None:
        """After an LR scheduler step: copy the new float lr into the graph's lr tensor."""
        sync_lr(self._lr_tensors)

    def capture(self, batch: Any) -> float:
        """Warm up, capture and restore state; returns the capture wall time in seconds.

        Raises GraphIneligible (state restored, nothing captured) if the step synchronizes with
        the host or cannot be captured.
        """
        t0 = time.perf_counter()
        self._make_capturable()
        params = [*self.model.parameters(), *self.model.buffers()]
        saved_params = [t.detach().clone() for t in params]
        before = {id(t): t.detach().clone() for t in _state_tensors(self.optimizer)}
        self.static_batch = map_tensors(lambda t: t.clone(), batch)
        self._shape_key = shapes_of(batch)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        prev_mode = torch.cuda.get_sync_debug_mode()
        try:
            torch.cuda.set_sync_debug_mode("error")  # a host sync in the step now raises
            rng = host_rng_snapshot()
            with torch.cuda.stream(side):
                for _ in range(self.warmup):
                    self.optimizer.zero_grad(set_to_none=True)
                    self._one(self.static_batch)
            torch.cuda.current_stream().wait_stream(side)
            drew = host_rng_changed(rng)
            if drew:
                raise GraphIneligible(f"the step draws random numbers on the host ({drew}): a graph would replay "
                                      f"the first draw")
            torch.cuda.set_sync_debug_mode(prev_mode)
            self.optimizer.zero_grad(set_to_none=True)
            graph = torch.cuda.CUDAGraph()
            if self._pool is None:
                self._pool = torch.cuda.graph_pool_handle()  # one pool for the graphs of every shape
            with torch.cuda.graph(graph, pool=self._pool, capture_error_mode="thread_local"):
                self.static_loss = self._one(self.static_batch)
            self.graph = graph
            self._graphs[tuple(self._shape_key)] = (graph, self.static_batch, self.static_loss)
        except RuntimeError as err:
            torch.cuda.set_sync_debug_mode(prev_mode)
            torch.cuda.synchronize()
            self.graph = None
            if isinstance(err, GraphIneligible):
                raise
            msg = str(err).splitlines()[0]
            if "synchroniz" in msg or "capturing" in msg or "not permitted" in msg:
                site = user_site(traceback.extract_tb(err.__traceback__))
                where = f" at {site}" if site else ""
                raise GraphIneligible(f"the step synchronizes with the host{where} (e.g. .item(), .cpu(), printing a "
                                      f"tensor): {msg}") from None
            raise GraphIneligible(f"capture failed: {msg}") from None
        finally:
            with torch.no_grad():
                for t, s in zip(params, saved_params):
                    t.copy_(s)
                for t in _state_tensors(self.optimizer):
                    if id(t) in before:
                        t.copy_(before[id(t)])
                    else:
                        t.zero_()  # fresh optimizer state: zero moments, step 0
            torch.cuda.synchronize()
        return time.perf_counter() - t0

    def fits(self, batch: Any) -> bool:
        return tuple(shapes_of(batch)) in self._graphs

    def __call__(self, batch: Any) -> torch.Tensor:
        """Run one step: replay the graph of the batch's shape; a shape met for the second time
        (a bucket of ``pad_buckets``) is captured first, up to ``MAX_GRAPHS``; else eagerly."""
        key = tuple(shapes_of(batch))
        if key not in self._graphs and self._graphs and key in self._seen_once and len(self._graphs) < MAX_GRAPHS:
            self._seen_once.discard(key)
            try:
                self.late_captures.append(self.capture(batch))
            except GraphIneligible:
                self._no_graph.add(key)
        if key in self._graphs:
            graph, static_batch, static_loss = self._graphs[key]
            copy_into(static_batch, batch)
            graph.replay()
            return static_loss.detach().clone()
        if self._graphs and key not in self._no_graph:
            self._seen_once.add(key)
        self.optimizer.zero_grad(set_to_none=True)
        return self._one(batch).detach()

    def shapes_captured(self) -> dict:
        """The graphs per batch shape, as the Lightning capture reports them."""
        return {"graphs": len(self._graphs), "late_captures": len(self.late_captures),
                "late_capture_s": round(sum(self.late_captures), 3), "late_failed": None}
