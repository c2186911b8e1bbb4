"""``dali``: a user's image folder decoded and augmented on the GPU by NVIDIA DALI; the folder
reader that translates the torchvision pipeline (:mod:`.folder`).
"""

from fastloop.speedups.dali.dali import (
    Dali,
)

__all__ = [
    "Dali",
]
