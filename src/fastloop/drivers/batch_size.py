"""Batch-size search (the import path users know). The search core lives with its speedup in
:mod:`fastloop.speedups.batch_size`.

Example:
    >>> from fastloop.drivers.batch_size import is_oom
    >>> is_oom(RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB"))
    True
"""

from fastloop.speedups.batch_size import is_oom, search_batch_size, set_batch_size

__all__ = ["is_oom", "search_batch_size", "set_batch_size"]
