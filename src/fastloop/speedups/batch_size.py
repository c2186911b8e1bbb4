"""``batch_size``: train at a searched batch size. Registered so the name is reserved; the search
itself is not built yet, so it is always recorded as skipped with that reason.

Card:
- Helps: steps too small to fill the GPU; the search measures samples/s per size and keeps
  the fastest that fits with headroom.
- Hurts: optimization dynamics change with batch size (retune LR); memory headroom shrinks.
- Costs: the search's wall time (a few trial steps per size), reported.
Changes the data pipeline (the target's ``batch_size``). Applied by the runner before training.
"""

from __future__ import annotations

from fastloop.speedups.base import Context, Speedup, register

__all__ = ["BatchSize"]


@register
class BatchSize(Speedup):
    __doc__ = __doc__
    name = "batch_size"
    changes = "data"
    order = 70

    def why_not(self, ctx: Context) -> str | None:
        return "batch-size search is not implemented yet (tracked in issue 5)"
