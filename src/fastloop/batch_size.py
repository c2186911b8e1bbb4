"""Batch-size search that survives OOM, torch.compile and DDP.

Exponential growth from the current size, then bisection, finds the largest batch that fits
(``max_fitting``); a margin (default 0.9) keeps the chosen size clear of the edge, since a real
run fragments memory more than a few trial steps do. With ``objective="throughput"`` (default)
the size with the best measured samples/s among those under the margin is chosen: bigger is
not always faster.

- OOM: CUDA, cuDNN and CPU-allocator out-of-memory errors are recognised (:func:`is_oom`), and
  only those; anything else propagates unchanged. After an OOM everything the failed step held
  (outputs, gradients, the trial optimizer and its state, cached blocks) is freed first.
- State: trials run on the module with a throwaway optimizer from ``configure_optimizers``;
  the module's weights and buffers, the RNG states, and any Trainer optimizer/scheduler are
  bitwise as before afterwards (checked, reported as ``restored``). No files are written.
- compile: the search runs eagerly and compiling happens once afterwards, so no trial
  recompiles; the search's wall time is reported.
- DDP: after every trial the ranks all-reduce "did anyone OOM" and the slowest step time, so
  they take the same branch and never hang.

Example:
    >>> is_oom(RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB"))
    True
    >>> is_oom(RuntimeError("mat1 and mat2 shapes cannot be multiplied"))
    False
"""

from __future__ import annotations

import contextlib
import gc
import hashlib
import random
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader

from fastloop._compat import LightningDataModule, LightningModule
from fastloop.data import first_tensor, rebuild_loader, to_device
from fastloop.errors import FastloopError

__all__ = ["is_oom", "search_batch_size", "set_batch_size"]

_OOM_MARKERS = (
    "cuda out of memory",                 # torch.cuda.OutOfMemoryError
    "cudnn_status_alloc_failed",          # cuDNN workspace allocation
    "cudnn_status_not_supported. this error may appear if you passed in a non-contiguous input",  # cuDNN OOM in disguise
    "cublas_status_alloc_failed",
    "defaultcpuallocator: can't allocate memory",
    "defaultcpuallocator: not enough memory",
    "out of memory",
)


def is_oom(err: BaseException) -> bool:
    """True for CUDA, cuDNN, cuBLAS and CPU-allocator out-of-memory errors, False otherwise."""
    if isinstance(err, torch.cuda.OutOfMemoryError):
        return True
    if not isinstance(err, (RuntimeError, MemoryError)):
        return False
    if isinstance(err, MemoryError):
        return True
    msg = str(err).lower()
    return any(m in msg for m in _OOM_MARKERS)


def _free(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()


def _digest(module: torch.nn.Module, optimizers: list) -> str:
    h = hashlib.sha256()
    for k, v in module.state_dict().items():
        h.update(k.encode())
        h.update(v.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes() if v.numel() else b"")
    for opt in optimizers:
        for st in opt.state.values():
            for k, v in sorted(st.items()):
                h.update(k.encode())
                h.update(v.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes() if torch.is_tensor(v) else repr(v).encode())
        h.update(repr([{k: v for k, v in g.items() if k != "params"} for g in opt.param_groups]).encode())
    return h.hexdigest()


def _rng_state() -> dict:
    st = {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        st["cuda"] = torch.cuda.get_rng_state_all()
    return st


def _set_rng_state(st: dict) -> None:
    torch.set_rng_state(st["torch"])
    np.random.set_state(st["numpy"])
    random.setstate(st["python"])
    if "cuda" in st:
        torch.cuda.set_rng_state_all(st["cuda"])


def _holder(module: LightningModule, data: Any) -> tuple[Any, str] | None:
    """Where the target keeps its batch size (Lightning's convention): datamodule, module, hparams."""
    if isinstance(data, LightningDataModule) and hasattr(data, "batch_size"):
        return data, "attr"
    if hasattr(module, "batch_size"):
        return module, "attr"
    if "batch_size" in getattr(module, "hparams", {}):
        return module.hparams, "item"
    return None


def set_batch_size(module: LightningModule, data: Any, size: int) -> str:
    """Write ``size`` where the target keeps its batch size; returns where it went."""
    where = _holder(module, data)
    if where is None:
        return "nowhere (no batch_size attribute or hparam; the DataLoader is rebuilt instead)"
    obj, kind = where
    if kind == "item":
        obj["batch_size"] = size
        return "LightningModule.hparams.batch_size"
    obj.batch_size = size
    if obj is module and "batch_size" in getattr(module, "hparams", {}):
        module.hparams["batch_size"] = size
    return f"{type(obj).__name__}.batch_size"


def _loader_for(module: LightningModule, data: Any, size: int) -> Any:
    if isinstance(data, LightningDataModule):
        if hasattr(data, "batch_size"):
            data.batch_size = size
            return data.train_dataloader()
        raise FastloopError("the DataModule has no batch_size attribute to search over")
    if isinstance(data, DataLoader):
        return rebuild_loader(data, batch_size=size)
    raise FastloopError(f"cannot search batch sizes of a {type(data).__name__}")


def _agree(flag: bool, step_s: float, device: torch.device) -> tuple[bool, float]:
    """Under torch.distributed: OOM on any rank counts for all; the slowest rank's step time."""
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return flag, step_s
    backend_dev = device if torch.distributed.get_backend() == "nccl" else torch.device("cpu")
    t = torch.tensor([float(flag), step_s], dtype=torch.float64, device=backend_dev)
    torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MAX)
    return bool(t[0].item()), float(t[1].item())


@contextlib.contextmanager
def _trial_steps_unlogged(module: LightningModule):
    """Trial steps are not training: ``self.log`` in the user's ``training_step`` is a no-op
    during the search (Lightning refuses logging from ``on_fit_start``, where the callback runs)."""
    saved = {k: vars(module)[k] for k in ("log", "log_dict") if k in vars(module)}
    module.log = lambda *a, **k: None  # type: ignore[method-assign]
    module.log_dict = lambda *a, **k: None  # type: ignore[method-assign]
    try:
        yield
    finally:
        for k in ("log", "log_dict"):
            if k in saved:
                setattr(module, k, saved[k])
            else:
                delattr(module, k)


def _trial(module: LightningModule, data: Any, size: int, device: torch.device, steps: int,
           autocast: torch.dtype | None) -> tuple[float, int]:
    """Run ``steps`` train steps at ``size``; returns (median step time of steps after the first, batch)."""
    loader = _loader_for(module, data, size)
    it = iter(loader)
    opt_conf = module.configure_optimizers()
    opts = _optimizers_from(opt_conf)
    ctx = torch.autocast(device.type, dtype=autocast) if autocast else contextlib.nullcontext()
    times, got = [], size
    try:
        for i in range(steps):
            try:
                host = next(it)
            except StopIteration:  # fewer batches than trial steps: start the epoch again
                it = iter(loader)
                host = next(it)
            batch = to_device(host, device)
            t = first_tensor(batch)
            got = int(t.shape[0]) if t is not None else size
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            t0 = time.perf_counter()
            with ctx, _trial_steps_unlogged(module):
                out = module.training_step(batch, i)
            loss = out["loss"] if isinstance(out, dict) else out
            loss.backward()
            for o in opts:
                o.step()
                o.zero_grad(set_to_none=True)
            del out, loss, batch
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            times.append(time.perf_counter() - t0)
    finally:
        module.zero_grad(set_to_none=True)
        for o in opts:
            o.state.clear()
        del opts, opt_conf, it, loader
    rest = sorted(times[1:] or times)
    return rest[len(rest) // 2], got


def _optimizers_from(conf: Any) -> list[torch.optim.Optimizer]:
    if isinstance(conf, torch.optim.Optimizer):
        return [conf]
    if isinstance(conf, dict):
        return [conf["optimizer"]]
    if isinstance(conf, (list, tuple)):
        out = []
        for c in conf:
            if isinstance(c, torch.optim.Optimizer):
                out.append(c)
            elif isinstance(c, dict):
                out.append(c["optimizer"])
            elif isinstance(c, (list, tuple)):
                out += [x for x in c if isinstance(x, torch.optim.Optimizer)]
        return out
    raise FastloopError(f"configure_optimizers returned {type(conf).__name__}; cannot build a trial optimizer")


def search_batch_size(module: LightningModule, data: Any, *, speedups: str | list | None = None,
                      device: str = "auto", init: int | None = None, max_size: int = 4096,
                      objective: str = "throughput", margin: float = 0.9, trial_steps: int = 3,
                      precision: float = 0.0625, trainer_optimizers: list | None = None,
                      progress: Callable[[str], None] | None = None) -> dict:
    """Find the batch size; write it where the target keeps it; return the JSON document part.

    Args:
        init: first size tried (default: the target's current batch size).
        max_size: never try above this.
        objective: ``"max"`` (largest under the margin) or ``"throughput"`` (fastest under it).
        margin: the chosen size is at most ``margin * max_fitting``.
        precision: bisection stops when the gap between fitting and failing sizes is at most this
            fraction of the failing size (1/16: the largest fitting size is found within ~6%).
    """
    from fastloop.loop import resolve_device
    from fastloop.speedups.base import resolve

    if objective not in ("max", "throughput"):
        raise FastloopError(f"--objective must be max or throughput, got {objective!r}")
    if not 0 < margin <= 1:
        raise FastloopError(f"--margin must be in (0, 1], got {margin}")
    if max_size < 1:
        raise FastloopError(f"--max must be >= 1, got {max_size}")
    names = {s.name for s in resolve(speedups)}
    dev = resolve_device(device)
    autocast = torch.bfloat16 if "bf16" in names else (torch.float16 if "fp16" in names and dev.type == "cuda" else None)
    holder = _holder(module, data)
    current = (holder[0]["batch_size"] if holder and holder[1] == "item" else getattr(holder[0], "batch_size", None)) if holder else None
    if current is None and isinstance(data, DataLoader):
        current = data.batch_size
    start = max(1, min(int(init or current or 1), max_size))
    module.to(dev)
    was_training = module.training
    before = _digest(module, trainer_optimizers or [])
    rng = _rng_state()
    state = {k: v.detach().clone() for k, v in module.state_dict().items()}
    mem0 = torch.cuda.memory_allocated(dev) if dev.type == "cuda" else None
    t_start = time.perf_counter()
    trials: list[dict] = []
    limit: list[int | None] = [None]  # the data's own batch limit (a dataset smaller than the batch)

    def attempt(size: int) -> bool:
        if progress:
            progress(f"trying batch size {size}")
        oom, step_s, got, t0 = False, 0.0, size, time.perf_counter()
        try:
            step_s, got = _trial(module, data, size, dev, trial_steps, autocast)
        except Exception as err:  # noqa: BLE001 - re-raised unless it is an OOM
            if not is_oom(err):
                raise
            oom = True
        if oom:
            _free(dev)  # outside the except block: the traceback no longer pins the failed step's tensors
        oom, step_s = _agree(oom, step_s, dev)
        ok = not oom
        trials.append({"batch_size": size, "ok": ok, "step_s": step_s if ok else None,
                       "throughput": got / step_s if ok and step_s > 0 else None, "trial_s": time.perf_counter() - t0})
        if ok and got < size:
            trials[-1]["note"] = f"the data yields only {got} samples per batch"
            limit[0] = got if limit[0] is None else min(limit[0], got)
        return ok

    try:
        module.train()
        if not attempt(start):
            if start == 1:
                raise FastloopError("batch size 1 does not fit in memory: the model itself is too large for this device "
                                    "(try bf16, a smaller model, or more GPUs via FSDP)")
            lo, hi = 0, start
        else:
            lo, hi = start, None
            while hi is None and limit[0] is None:
                nxt = min(lo * 2, max_size)
                if nxt == lo:
                    break
                if attempt(nxt):
                    lo = nxt
                else:
                    hi = nxt
        if hi is not None:
            while hi - lo > max(1, int(precision * hi)):
                mid = (lo + hi) // 2
                if attempt(mid):
                    lo = mid
                else:
                    hi = mid
        if lo == 0:
            lo = 1
            if not attempt(1):
                raise FastloopError("batch size 1 does not fit in memory: the model itself is too large for this device")
        max_fitting = lo if limit[0] is None else min(lo, limit[0])
        cap = max(1, int(margin * max_fitting))
        ok = [t for t in trials if t["ok"] and t["batch_size"] <= cap]
        if objective == "throughput" and not any(t["batch_size"] == cap for t in ok) and cap != max_fitting:
            attempt(cap)
            ok = [t for t in trials if t["ok"] and t["batch_size"] <= cap]
        if objective == "max" or not ok:
            chosen = cap
        else:
            best = max(t["throughput"] or 0 for t in ok)
            # the largest size within 2% of the best throughput: noise should not pick a tiny batch
            chosen = max(t["batch_size"] for t in ok if (t["throughput"] or 0) >= 0.98 * best)
    finally:
        with torch.no_grad():
            module.load_state_dict(state)
        module.zero_grad(set_to_none=True)
        module.train(was_training)
        _set_rng_state(rng)
        _free(dev)
    written = set_batch_size(module, data, chosen)
    mem1 = torch.cuda.memory_allocated(dev) if dev.type == "cuda" else None
    return {
        "batch_size": chosen, "max_fitting": max_fitting, "objective": objective, "margin": margin,
        "trials": trials, "search_s": time.perf_counter() - t_start,
        "restored": _digest(module, trainer_optimizers or []) == before, "written_to": written,
        "memory_allocated_before": mem0, "memory_allocated_after": mem1,
        "compile_note": "trials run eagerly; compile (if requested) happens once afterwards, so no trial recompiles",
    }
