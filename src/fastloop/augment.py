"""Batched image augmentations on the device: the per-sample torchvision transforms a CIFAR-style
pipeline uses (random crop with padding, horizontal flip, normalize), done for a whole batch in
a few kernels, with the same per-sample distribution.

Use them where the batch is already on the GPU: in ``on_after_batch_transfer`` of a
LightningModule, or in a plain loop after :mod:`fastloop.speedups.gpu_resident` serves the batch.

Example:
    >>> import torch
    >>> g = torch.Generator().manual_seed(0)
    >>> x = torch.arange(2 * 1 * 4 * 4, dtype=torch.uint8).reshape(2, 1, 4, 4)
    >>> random_crop(x, 4, padding=1, generator=g).shape
    torch.Size([2, 1, 4, 4])
    >>> normalize(x, mean=[0.5], std=[0.25]).dtype
    torch.float32
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

__all__ = ["normalize", "random_crop", "random_flip"]


def _check(x: torch.Tensor) -> None:
    if not torch.is_tensor(x) or x.dim() != 4:
        raise ValueError(f"expected a batch of images shaped (N, C, H, W), got {getattr(x, 'shape', type(x).__name__)}")


def random_crop(x: torch.Tensor, size: int | tuple[int, int], *, padding: int = 0, fill: float = 0.0,
                generator: torch.Generator | None = None) -> torch.Tensor:
    """Per-sample random crop of ``size`` from the batch padded by ``padding`` on each side with
    ``fill`` (torchvision's ``RandomCrop(size, padding)``: every offset equally likely)."""
    _check(x)
    h, w = (size, size) if isinstance(size, int) else size
    if padding:
        x = F.pad(x, (padding, padding, padding, padding), value=fill)
    n, _, hp, wp = x.shape
    if h > hp or w > wp:
        raise ValueError(f"crop {h}x{w} is larger than the padded image {hp}x{wp}")
    dev = x.device
    top = torch.randint(0, hp - h + 1, (n,), generator=generator, device=generator.device if generator else dev).to(dev)
    left = torch.randint(0, wp - w + 1, (n,), generator=generator, device=generator.device if generator else dev).to(dev)
    rows = (top[:, None] + torch.arange(h, device=dev))[:, None, :, None]          # (N, 1, h, 1)
    cols = (left[:, None] + torch.arange(w, device=dev))[:, None, None, :]         # (N, 1, 1, w)
    batch = torch.arange(n, device=dev)[:, None, None, None]
    chans = torch.arange(x.shape[1], device=dev)[None, :, None, None]
    return x[batch, chans, rows, cols]


def random_flip(x: torch.Tensor, *, p: float = 0.5, generator: torch.Generator | None = None) -> torch.Tensor:
    """Flip each image left-right with probability ``p`` (torchvision's ``RandomHorizontalFlip``)."""
    _check(x)
    if not 0 <= p <= 1:
        raise ValueError(f"p must be in [0, 1], got {p}")
    flip = torch.rand(x.shape[0], generator=generator, device=generator.device if generator else x.device).to(x.device) < p
    return torch.where(flip[:, None, None, None], x.flip(-1), x)


def normalize(x: torch.Tensor, mean: Sequence[float], std: Sequence[float], *,
              dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """``(x / 255 - mean) / std`` for uint8 images (``ToTensor`` then ``Normalize``), or
    ``(x - mean) / std`` for floating images; the result in ``dtype``."""
    _check(x)
    if len(mean) != x.shape[1] or len(std) != x.shape[1]:
        raise ValueError(f"mean and std need one value per channel ({x.shape[1]}), got {len(mean)} and {len(std)}")
    if any(s <= 0 for s in std):
        raise ValueError(f"std must be > 0, got {list(std)}")
    y = x.to(dtype)
    if x.dtype == torch.uint8:
        y = y / 255.0
    m = torch.as_tensor(mean, dtype=dtype, device=x.device)[None, :, None, None]
    s = torch.as_tensor(std, dtype=dtype, device=x.device)[None, :, None, None]
    return (y - m) / s
