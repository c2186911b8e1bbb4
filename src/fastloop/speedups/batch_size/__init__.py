"""``batch_size``: the batch-size search (:mod:`.batch_size`), its rule (:mod:`.rule`) and its
bookkeeping (:mod:`.state`).
"""

from fastloop.speedups.batch_size.batch_size import (
    BatchSize,
    is_oom,
    search_batch_size,
    set_batch_size,
)

__all__ = [
    "BatchSize",
    "is_oom",
    "search_batch_size",
    "set_batch_size",
]
