"""``batch_size``: search the batch size (:mod:`fastloop.batch_size`), then train at it.

Card:
- Helps: steps too small to fill the GPU; the search measures samples/s per size and keeps
  the fastest that fits with headroom.
- Hurts: optimization dynamics change with batch size (retune LR); memory headroom shrinks.
- Costs: the search's wall time (a few trial steps per size), reported.
Changes the data pipeline (the target's ``batch_size``). Applied by the runner before training.
"""

from __future__ import annotations

from fastloop.speedups.base import Speedup, register

__all__ = ["BatchSize"]


@register
class BatchSize(Speedup):
    __doc__ = __doc__
    name = "batch_size"
    changes = "data"
    order = 70
