"""A CPU stand-in for the CUDA graphs of the captured-step engine, for tests without a GPU.

It keeps what a real graph means for training: a capture runs the step's Python once (as a real
capture does: the closure's result, the logged tensors and the loss exist afterwards) and records
its tensor operations (a ``TorchDispatchMode`` sees forward, backward and the optimizer's update),
changing no weight or optimizer state; a replay runs the recorded operations again on the same
tensors with the same Python numbers, without the step's Python. A graph that keeps an lr or a
momentum the scheduler changed therefore trains differently here, as it would on the GPU, and a
value the step logs or returns is the tensor the replay wrote.

``install(monkeypatch)`` makes every run of the process use it and lets ``cuda_graph`` apply
without CUDA.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from fastloop.speedups.cuda_graph import captured_step, cuda_graph
from fastloop.speedups.cuda_graph.graph_capture import StepGraphs, draw_reason
from fastloop.speedups.cuda_graph.graph_guard import HostDraws


class StandInGraph(TorchDispatchMode):
    """One recorded step, as a CUDA graph records it: the sequence of tensor operations with the
    tensors they read and wrote and the Python numbers they were called with. ``replay()`` runs
    the operations again on the same tensors (reading their current values: a tensor lr, the
    batch copied into the static buffers) with the same numbers (an lr or a momentum that was a
    Python float stays what it was at capture), writing each result into the tensor the capture
    made for it (the loss, the logged values, the gradients)."""

    def __init__(self) -> None:
        super().__init__()
        self.tape: list[tuple[Any, tuple, dict, Any]] = []
        self.replays = 0
        self.written: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        """Each tensor the capture wrote in place, with its value before (put back after it)."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        for t in _written(func, args, kwargs):
            if id(t) not in self.written:
                self.written[id(t)] = (t, t.detach().clone())
        out = func(*args, **kwargs)
        self.tape.append((func, args, kwargs, out))
        return out

    def replay(self) -> None:
        with torch.no_grad():
            for func, args, kwargs, out in self.tape:
                res = func(*args, **kwargs)
                for o, r in zip(_flat(out), _flat(res)):
                    if o is not r and not _shares(o, r):
                        o.copy_(r)
        self.replays += 1


_UNDECLARED_WRITES = {"aten::native_batch_norm": ("running_mean", "running_var")}
"""Operators that write arguments their schema does not mark as written (BatchNorm's statistics)."""


def _written(func: Any, args: tuple, kwargs: dict) -> list[torch.Tensor]:
    """The tensors ``func`` writes in place (its schema's mutable arguments)."""
    out: list[torch.Tensor] = []
    undeclared = _UNDECLARED_WRITES.get(func._schema.name, ())
    for i, arg in enumerate(func._schema.arguments):
        if (arg.alias_info is not None and arg.alias_info.is_write) or arg.name in undeclared:
            out += _flat(args[i] if i < len(args) else kwargs.get(arg.name))
    return out


def _flat(x: Any) -> list[torch.Tensor]:
    if torch.is_tensor(x):
        return [x]
    if isinstance(x, (list, tuple)):
        return [t for v in x for t in _flat(v)]
    return []


def _shares(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Views of one storage (an op that returns a view): nothing to copy."""
    return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


def _state(optimizer: torch.optim.Optimizer | None) -> list[torch.Tensor]:
    return [v for st in optimizer.state.values() for v in st.values() if torch.is_tensor(v)] if optimizer else []


class StandInGraphs(StepGraphs):
    """:class:`StepGraphs` with the stand-in's capture and a checked step that sees host draws
    (a CPU run has no sync to see)."""

    optimizer: Any = None
    """Set by :func:`install`: a function giving the optimizer the current run prepared."""

    @staticmethod
    def checked(step: Any, draws: HostDraws | None = None) -> tuple[Any, str | None]:
        draws = draws or HostDraws()
        rng = draws.snapshot()
        out = step()
        drew = draws.changed(rng)
        return out, (draw_reason(drew) if drew else None)

    def capture(self, step: Any) -> tuple[StandInGraph, Any]:
        """Record ``step()``; every tensor it wrote in place (the weights, the optimizer's state,
        BatchNorm's running statistics) is put back afterwards (a CUDA graph records its kernels
        without running them; the engine replays the graph at once). The gradients stay the
        capture's tensors, as they are a real graph's."""
        opt = StandInGraphs.optimizer() if StandInGraphs.optimizer else None
        params = [p for g in opt.param_groups for p in g["params"]] if opt is not None else []
        saved = [(p, p.detach().clone()) for p in params] + [(t, t.detach().clone()) for t in _state(opt)]
        graph = StandInGraph()
        with torch.random.fork_rng(devices=[]), graph:
            out = step()
        with torch.no_grad():
            for t, v in [*saved, *graph.written.values()]:
                t.copy_(v)
        return graph, out

    @staticmethod
    def synchronize() -> None:
        return None


def install(monkeypatch: Any) -> None:
    """Every captured step of this test on the stand-in; ``cuda_graph`` applies without CUDA."""
    engines: list[captured_step.CapturedStep] = []
    original = captured_step.CapturedStep.prepare

    def prepare(self: Any, optimizer: Any, *args: Any, **kwargs: Any) -> bool:
        engines.append(self)
        return original(self, optimizer, *args, **kwargs)

    StandInGraphs.optimizer = staticmethod(
        lambda: next((e.prepared.optimizer for e in reversed(engines) if e.prepared is not None), None)
    )
    monkeypatch.setattr(captured_step, "GRAPH_CORE", StandInGraphs)
    monkeypatch.setattr(captured_step.CapturedStep, "prepare", prepare)
    monkeypatch.setattr(cuda_graph.CudaGraph, "needs_cuda", False)
    monkeypatch.setattr(cuda_graph, "common_blocker", lambda *, cuda, scale_loss: None if not scale_loss else "fp16")
    for mod in ("fastloop.adapters.loop", "fastloop.adapters.lightning_run"):
        monkeypatch.setattr(f"{mod}.common_blocker", lambda *, cuda, scale_loss: None if not scale_loss else "fp16")
