"""What fastloop reads of a user's dataset and torchvision transforms, shared by the speedups that
translate a transform pipeline (``gpu_augment``'s batched ops, ``dali``'s folder reader).

Example:
    >>> from torchvision.transforms import RandomCrop
    >>> torchvision_padding(RandomCrop(8, padding=2))
    (2, 2, 2, 2)
"""

from __future__ import annotations

__all__ = ["PADDING_MODES", "torchvision_padding", "unwrap_subsets"]


def unwrap_subsets(dataset: object) -> tuple[object, list[int] | None]:
    """The dataset inside ``torch.utils.data.Subset`` wrappers (what ``random_split`` returns), and
    the indices into it that the wrappers select (None: no wrapper). The transform lives there.

    >>> import torch
    >>> from torch.utils.data import Subset, TensorDataset
    >>> inner = TensorDataset(torch.arange(10))
    >>> ds, idx = unwrap_subsets(Subset(Subset(inner, [9, 7, 5, 3]), [1, 3]))
    >>> ds is inner, idx
    (True, [7, 3])
    """
    from torch.utils.data import Subset

    indices: list[int] | None = None
    while isinstance(dataset, Subset):
        own = [int(i) for i in dataset.indices]
        indices = own if indices is None else [own[i] for i in indices]
        dataset = dataset.dataset
    return dataset, indices


def torchvision_padding(op: object) -> tuple[int, int, int, int]:
    """A torchvision ``RandomCrop``'s padding as (left, top, right, bottom): v2 keeps [left, right,
    top, bottom]; v1 what it was given (an int, (left/right, top/bottom) or (left, top, right, bottom)).

    >>> from torchvision.transforms import RandomCrop, v2
    >>> torchvision_padding(RandomCrop(8, padding=(1, 2))), torchvision_padding(v2.RandomCrop(8, padding=(1, 2)))
    ((1, 2, 1, 2), (1, 2, 1, 2))
    """
    p = getattr(op, "padding", None)
    if p is None:
        return 0, 0, 0, 0
    if ".v2." in type(op).__module__:
        left, right, top, bottom = (int(v) for v in p)
        return left, top, right, bottom
    v = [int(p)] if isinstance(p, int) else [int(x) for x in p]
    v = v * 4 if len(v) == 1 else v * 2 if len(v) == 2 else v
    return v[0], v[1], v[2], v[3]


PADDING_MODES = {"constant": "constant", "reflect": "reflect", "edge": "replicate"}
"""torchvision's ``padding_mode`` names and torch's ``F.pad`` modes that pad alike."""
