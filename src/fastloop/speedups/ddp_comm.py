"""``ddp_comm``: DDP's own knobs for its gradient all-reduce, measured like any speedup.

``gradient_as_bucket_view=True`` (gradients live in the all-reduce buckets: one copy and its
memory saved per step) and, with ``ddp_comm:MB``, the bucket size (``bucket_cap_mb``, default 25
in torch): larger buckets mean fewer, larger all-reduces; smaller ones start overlapping with
the backward pass sooner. Applies only in a multi-rank run under Lightning's DDP strategy;
skipped otherwise with the reason.

The card (when it helps, when it hurts, what it costs, with measured figures): ``docs/speedups/ddp_comm.md``.
Changes the train step (the DDP wrapper).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fastloop.speedups.base import Context, Speedup, register
from fastloop.speedups.options import Options, option
from fastloop.speedups.run import Run

__all__ = ["DDPComm", "ddp_comm_kwargs"]


def ddp_comm_kwargs(bucket_mb: int | None = None) -> dict[str, Any]:
    """The ``DistributedDataParallel`` keyword arguments this speedup sets."""
    kw: dict[str, Any] = {"gradient_as_bucket_view": True}
    if bucket_mb is not None:
        kw["bucket_cap_mb"] = bucket_mb
    return kw


@dataclass(frozen=True, kw_only=True)
class DDPCommOptions(Options):
    """Options of ``ddp_comm``."""

    speedup = "ddp_comm"
    bucket_mb: int | None = option(None, "DDP gradient bucket size in MiB; none: DDP's default (25)", low=1, high=1024)


@register
class DDPComm(Speedup):
    __doc__ = __doc__
    name = "ddp_comm"
    trains = "reordered"  # other gradient buckets: the all-reduce sums in another order
    changes = "step"
    order = 66

    options_type = DDPCommOptions

    def why_not(self, ctx: Context) -> str | None:
        if ctx.ddp_kwargs is None:
            return "not a multi-rank DDP run (these are knobs of DDP's gradient all-reduce)"
        return None

    def apply(self, run: Run) -> None:
        ctx = run.ctx
        kwargs = ctx.ddp_kwargs
        assert kwargs is not None
        before = dict(kwargs)
        kwargs.update(ddp_comm_kwargs(self.opts.bucket_mb))
        ctx.undo.append(lambda: (kwargs.clear(), kwargs.update(before)))  # the user's strategy as it was
        ctx.describe(self.name, ", ".join(f"{k}={v}" for k, v in ddp_comm_kwargs(self.opts.bucket_mb).items()))
