"""``pad_buckets``: text padded per batch padded to a few bucket lengths, checked before it applies
(:mod:`.check`).
"""

from fastloop.speedups.pad_buckets.pad_buckets import (
    PadBuckets,
    PaddedCollate,
    PadOptions,
    PadPlan,
    TensorPad,
    find_padding,
    tensor_names,
)

__all__ = [
    "PadBuckets",
    "PadOptions",
    "PadPlan",
    "PaddedCollate",
    "TensorPad",
    "find_padding",
    "tensor_names",
]
