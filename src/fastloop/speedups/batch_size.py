"""``batch_size``: search the batch size (:mod:`fastloop.batch_size`), then train at it.

Card:
- Helps: steps too small to fill the GPU; the search measures samples/s per size and keeps
  the fastest that fits with headroom.
- Hurts: optimization dynamics change with batch size (retune LR); memory headroom shrinks.
- Costs: the search's wall time (a few trial steps per size), reported.
Changes the data pipeline (the target's ``batch_size``). Applied by the runner before training.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils.data import DataLoader

from fastloop.data import rebuild_loader
from fastloop.speedups.base import Record, Speedup, register

__all__ = ["BatchSize"]


@register
class BatchSize(Speedup):
    __doc__ = __doc__
    name = "batch_size"
    changes = "data"
    order = 70
    prepares_run = True

    def prepare_run(self, module: Any, data: Any, others: list[str], device: torch.device) -> tuple[Any, Record, dict]:
        """Search with the other speedups on, then train at the size found (a DataLoader, fixed
        at build, is rebuilt at that size; a DataModule or module reads its ``batch_size``)."""
        from fastloop.batch_size import search_batch_size  # the search imports the speedups: no cycle at load

        search = search_batch_size(module, data, speedups=others, device=str(device))
        if isinstance(data, DataLoader) and data.batch_size != search["batch_size"]:
            data = rebuild_loader(data, batch_size=search["batch_size"])
        record = Record(self.name, "applied", detail=f"batch size {search['batch_size']} (largest fitting "
                                              f"{search['max_fitting']}, search {search['search_s']:.1f} s)")
        stats = {"batch_size_search": {k: search[k] for k in ("batch_size", "max_fitting", "search_s", "restored")}}
        return data, record, stats
