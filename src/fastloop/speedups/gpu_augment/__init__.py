"""``gpu_augment``: a torchvision crop/flip/normalize pipeline on in-memory images run as batched
GPU ops (:mod:`.ops`, usable on their own).
"""

from fastloop.speedups.gpu_augment.gpu_augment import (
    Fused,
    GPUAugment,
    GPUAugmentLoader,
    Op,
    as_chw,
    make_augmented,
    run_ops,
    translate,
)

__all__ = [
    "Fused",
    "GPUAugment",
    "GPUAugmentLoader",
    "Op",
    "as_chw",
    "make_augmented",
    "run_ops",
    "translate",
]
