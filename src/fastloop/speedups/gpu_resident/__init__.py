"""``gpu_resident``: an in-memory dataset kept on the GPU, batches cut there; a padding collate's
store (:mod:`.padded`).
"""

from fastloop.speedups.gpu_resident.gpu_resident import (
    GPUResident,
    GPUResidentLoader,
    NotResident,
    make_resident,
)

__all__ = [
    "GPUResident",
    "GPUResidentLoader",
    "NotResident",
    "make_resident",
]
