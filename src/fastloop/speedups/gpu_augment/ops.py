"""Batched image augmentations on the device: the per-sample torchvision transforms a CIFAR- or
ImageNet-style pipeline uses (random crop with padding, random resized crop, horizontal flip,
normalize), done for a whole batch in a few kernels, with the same per-sample distribution.

Use them where the batch is already on the GPU: in ``on_after_batch_transfer`` of a
LightningModule, or in a plain loop after :mod:`fastloop.speedups.gpu_resident.gpu_resident` serves the batch.

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

import functools
from collections.abc import Callable, Sequence
from typing import NamedTuple

import torch
import torch.nn.functional as F

from fastloop.transforms import PADDING_MODES

__all__ = [
    "BoxMaps",
    "CropMaps",
    "draw_boxes",
    "draw_crop_maps",
    "gather_crops",
    "gather_resized",
    "normalize",
    "pixel_table",
    "random_crop",
    "random_flip",
    "random_resized_crop",
    "resized_crop_boxes",
]


def _check(x: torch.Tensor) -> None:
    if not torch.is_tensor(x) or x.dim() != 4:
        raise ValueError(f"expected a batch of images shaped (N, C, H, W), got {getattr(x, 'shape', type(x).__name__)}")


def _crop_params(
    size: int | Sequence[int], padding: int | Sequence[int], padding_mode: str
) -> tuple[int, int, tuple[int, ...]]:
    """A crop's height, width and padding (left, top, right, bottom), its padding mode checked."""
    if padding_mode not in PADDING_MODES:
        raise ValueError(f"padding_mode {padding_mode!r} is not one of {sorted(PADDING_MODES)}")
    h, w = (size, size) if isinstance(size, int) else size
    return h, w, (padding,) * 4 if isinstance(padding, int) else tuple(padding)


def random_crop(
    x: torch.Tensor,
    size: int | tuple[int, int],
    *,
    padding: int | Sequence[int] = 0,
    fill: float = 0.0,
    padding_mode: str = "constant",
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Per-sample random crop of ``size`` from the batch padded by ``padding`` (one number for every
    side, or left, top, right, bottom) with ``fill``, or by reflecting (``"reflect"``) or repeating
    (``"edge"``) the border (torchvision's ``RandomCrop(size, padding, fill, padding_mode)``: every
    offset equally likely)."""
    _check(x)
    h, w, (left, top, right, bottom) = _crop_params(size, padding, padding_mode)
    if left or top or right or bottom:
        pad = (left, right, top, bottom)
        x = F.pad(x, pad, value=fill) if padding_mode == "constant" else F.pad(x, pad, mode=PADDING_MODES[padding_mode])
    n, _, hp, wp = x.shape
    if h > hp or w > wp:
        raise ValueError(f"crop {h}x{w} is larger than the padded image {hp}x{wp}")
    dev = x.device
    top = torch.randint(0, hp - h + 1, (n,), generator=generator, device=generator.device if generator else dev).to(dev)
    left = torch.randint(0, wp - w + 1, (n,), generator=generator, device=generator.device if generator else dev).to(
        dev
    )
    rows = (top[:, None] + torch.arange(h, device=dev))[:, None, :, None]  # (N, 1, h, 1)
    cols = (left[:, None] + torch.arange(w, device=dev))[:, None, None, :]  # (N, 1, 1, w)
    batch = torch.arange(n, device=dev)[:, None, None, None]
    chans = torch.arange(x.shape[1], device=dev)[None, :, None, None]
    return x[batch, chans, rows, cols]


def resized_crop_boxes(
    n: int,
    height: int,
    width: int,
    scale: Sequence[float] = (0.08, 1.0),
    ratio: Sequence[float] = (3 / 4, 4 / 3),
    *,
    generator: torch.Generator | None = None,
    device: torch.device | str = "cpu",
) -> torch.Tensor:
    """``n`` crop boxes (top, left, height, width) drawn as torchvision's
    ``RandomResizedCrop.get_params`` draws each: up to 10 tries of an area fraction uniform in
    ``scale`` and a log-uniform aspect ratio in ``ratio``, the first that fits placed uniformly;
    where none fits, the centre crop clamped to ``ratio``."""
    dev = generator.device if generator is not None else torch.device(device)
    area = (
        torch.empty(n, 10, device=dev).uniform_(float(scale[0]), float(scale[1]), generator=generator) * height * width
    )
    lo, hi = torch.log(torch.tensor([float(ratio[0]), float(ratio[1])])).tolist()
    aspect = torch.exp(torch.empty(n, 10, device=dev).uniform_(lo, hi, generator=generator))
    w, h = torch.round(torch.sqrt(area * aspect)), torch.round(torch.sqrt(area / aspect))
    fits = (w > 0) & (w <= width) & (h > 0) & (h <= height)
    first = fits.float().argmax(dim=1, keepdim=True)
    w, h, found = w.gather(1, first)[:, 0], h.gather(1, first)[:, 0], fits.any(dim=1)
    if width / height < min(ratio):
        fw, fh = width, int(round(width / min(ratio)))
    elif width / height > max(ratio):
        fw, fh = int(round(height * max(ratio))), height
    else:
        fw, fh = width, height
    w, h = torch.where(found, w, float(fw)), torch.where(found, h, float(fh))
    u = torch.rand(n, 2, device=dev, generator=generator)
    top = torch.where(found, torch.floor(u[:, 0] * (height - h + 1)), float((height - fh) // 2))
    left = torch.where(found, torch.floor(u[:, 1] * (width - w + 1)), float((width - fw) // 2))
    return torch.stack([top, left, h, w], dim=1)


def random_resized_crop(
    x: torch.Tensor,
    size: int | tuple[int, int],
    scale: Sequence[float] = (0.08, 1.0),
    ratio: Sequence[float] = (3 / 4, 4 / 3),
    *,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """torchvision's ``RandomResizedCrop(size, scale, ratio)`` for each image of the batch with its
    own box (:func:`resized_crop_boxes`), in one kernel: ``torchvision.ops.roi_align`` samples
    each box bilinearly on pixel centres and averages ``ceil(box / size)`` samples per output
    pixel where the box is larger (torchvision antialiases there: the values differ slightly,
    ``tests/test_gpu_augment.py`` states how much). uint8 images come back uint8, rounded, as
    torchvision's resize returns them."""
    from torchvision.ops import roi_align

    _check(x)
    oh, ow = (size, size) if isinstance(size, int) else size
    boxes = resized_crop_boxes(
        x.shape[0], x.shape[2], x.shape[3], scale, ratio, generator=generator, device=x.device
    ).to(x.device)
    top, left, h, w = boxes.unbind(1)
    rois = torch.stack([torch.arange(x.shape[0], device=x.device, dtype=boxes.dtype), left, top, left + w, top + h], 1)
    out = roi_align(x.float(), rois, output_size=(oh, ow), spatial_scale=1.0, sampling_ratio=-1, aligned=True)
    return out.round().clamp(0, 255).to(torch.uint8) if x.dtype == torch.uint8 else out.to(x.dtype)


def random_flip(
    x: torch.Tensor, *, p: float = 0.5, vertical: bool = False, generator: torch.Generator | None = None
) -> torch.Tensor:
    """Flip each image left-right (top-bottom with ``vertical``) with probability ``p``
    (torchvision's ``RandomHorizontalFlip``, ``RandomVerticalFlip``)."""
    _check(x)
    if not 0 <= p <= 1:
        raise ValueError(f"p must be in [0, 1], got {p}")
    flip = (
        torch.rand(x.shape[0], generator=generator, device=generator.device if generator else x.device).to(x.device) < p
    )
    return torch.where(flip[:, None, None, None], x.flip(-2 if vertical else -1), x)


def normalize(
    x: torch.Tensor, mean: Sequence[float], std: Sequence[float], *, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
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
    m, s = _channel_stats(tuple(float(v) for v in mean), tuple(float(v) for v in std), dtype, x.device)
    return (y - m) / s


@functools.cache
def _channel_stats(
    mean: tuple[float, ...], std: tuple[float, ...], dtype: torch.dtype, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """``mean`` and ``std`` as (1, C, 1, 1) tensors on ``device``, made once per device and dtype:
    a tensor built from a list on a CUDA device is a copy from pageable memory, which waits for
    every kernel queued before it; once a batch, that sync kept the host from running ahead."""
    stats = tuple(torch.tensor(v, dtype=dtype).to(device)[None, :, None, None] for v in (mean, std))
    return stats  # type: ignore[return-value]


class CropMaps(NamedTuple):
    """Where each output pixel of a run of random crops and flips comes from, for ``len(rows)``
    samples: the source row of output row ``i`` is ``rows[k, 0, i, 0]``, the source column of output
    column ``j`` is ``cols[k, 0, 0, j]`` (shaped to index a batch as they are), and
    ``outside[k, 0, i, j]`` is True where a constant padding shows (None: none ever does)."""

    rows: torch.Tensor
    cols: torch.Tensor
    outside: torch.Tensor | None

    def __len__(self) -> int:  # type: ignore[override]
        return self.rows.shape[0]


def _crop_axis(
    src: torch.Tensor, ok: torch.Tensor | None, size: int, before: int, after: int, mode: str, offset: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One axis of a crop of ``size`` at ``offset`` in the axis padded by ``before`` and ``after``."""
    cur = src.shape[1]
    pos = offset[:, None] + torch.arange(size, device=src.device) - before
    inside = None
    if mode == "reflect":  # torch's reflect: -1 reads 1, cur reads cur - 2
        pos = pos.abs()
        pos = torch.where(pos > cur - 1, 2 * (cur - 1) - pos, pos)
    else:
        inside = ((pos >= 0) & (pos < cur)) if mode == "constant" and (before or after) else None
        pos = pos.clamp(0, cur - 1)
    ok = ok.gather(1, pos) if ok is not None else None
    ok = inside if ok is None else ok if inside is None else ok & inside
    return src.gather(1, pos), ok


def draw_crop_maps(
    k: int,
    height: int,
    width: int,
    steps: Sequence[tuple[str, dict]],
    *,
    generator: torch.Generator | None = None,
    device: torch.device | str = "cpu",
) -> CropMaps:
    """The source maps (:class:`CropMaps`) of ``steps`` for ``k`` images of ``height`` x ``width``,
    each with its own draws: a step is ``("crop", {"size", "padding", "padding_mode"})`` (padding
    as left, top, right, bottom) or ``("flip", {"p", "vertical"})``, as :func:`random_crop` and
    :func:`random_flip` take them, drawn in the same order from ``generator``: the same generator
    state gives the same crops and flips as those functions. A batch is then one gather
    (:func:`gather_crops`) instead of a pad, a gather and a flip, each with its index arithmetic.

    >>> m = draw_crop_maps(2, 4, 4, [("crop", {"size": (4, 4), "padding": (1, 1, 1, 1)})],
    ...                    generator=torch.Generator().manual_seed(0))
    >>> m.rows.shape, m.outside.shape
    (torch.Size([2, 1, 4, 1]), torch.Size([2, 1, 4, 4]))
    """
    dev = torch.device(device)
    gdev = generator.device if generator is not None else dev
    rows, cols = (torch.arange(n, device=dev).expand(k, n) for n in (height, width))
    rok: torch.Tensor | None = None
    cok: torch.Tensor | None = None
    for kind, p in steps:
        if kind == "crop":
            mode = p.get("padding_mode", "constant")
            h, w, (left, top, right, bottom) = _crop_params(p["size"], p.get("padding", 0), mode)
            hp, wp = rows.shape[1] + top + bottom, cols.shape[1] + left + right
            if h > hp or w > wp:
                raise ValueError(f"crop {h}x{w} is larger than the padded image {hp}x{wp}")
            if mode == "reflect" and (max(top, bottom) >= rows.shape[1] or max(left, right) >= cols.shape[1]):
                raise ValueError(
                    f"reflect padding {(left, top, right, bottom)} must be smaller than the image "
                    f"{rows.shape[1]}x{cols.shape[1]}"
                )
            at_top = torch.randint(0, hp - h + 1, (k,), generator=generator, device=gdev).to(dev)
            at_left = torch.randint(0, wp - w + 1, (k,), generator=generator, device=gdev).to(dev)
            rows, rok = _crop_axis(rows, rok, h, top, bottom, mode, at_top)
            cols, cok = _crop_axis(cols, cok, w, left, right, mode, at_left)
        elif kind == "flip":
            flip = (torch.rand(k, generator=generator, device=gdev).to(dev) < p["p"])[:, None]
            if p.get("vertical", False):
                rows, rok = (
                    torch.where(flip, rows.flip(1), rows),
                    None if rok is None else torch.where(flip, rok.flip(1), rok),
                )
            else:
                cols, cok = (
                    torch.where(flip, cols.flip(1), cols),
                    None if cok is None else torch.where(flip, cok.flip(1), cok),
                )
        else:
            raise ValueError(f"step {kind!r} is not a crop or a flip")
    outside = None
    if rok is not None or cok is not None:
        r = rok if rok is not None else torch.ones_like(rows, dtype=torch.bool)
        c = cok if cok is not None else torch.ones_like(cols, dtype=torch.bool)
        outside = ~(r[:, None, :, None] & c[:, None, None, :])
    return CropMaps(rows.contiguous()[:, None, :, None], cols.contiguous()[:, None, None, :], outside)


def gather_crops(
    x: torch.Tensor,
    maps: CropMaps,
    *,
    index: torch.Tensor | None = None,
    start: int = 0,
    fill: float = 0.0,
    table: torch.Tensor | None = None,
) -> torch.Tensor:
    """The crops and flips of ``maps`` (rows ``start`` on) of the images ``x[index]`` (all of ``x``
    where ``index`` is None), in one gather; ``fill`` where a constant padding shows; then, where
    ``table`` (:func:`pixel_table`) is given, each uint8 value looked up in its channel's row."""
    _check(x)
    n = x.shape[0] if index is None else index.shape[0]
    if start + n > len(maps):
        raise ValueError(f"{n} images from map {start} need {start + n} maps, there are {len(maps)}")
    b = (torch.arange(n, device=x.device) if index is None else index).view(n, 1, 1, 1)
    c = _channels(x.shape[1], x.device)
    out = x[b, c, maps.rows[start : start + n], maps.cols[start : start + n]]
    if maps.outside is not None:
        out = out.masked_fill_(maps.outside[start : start + n], fill)
    return out if table is None else table[c, out.long()]


def pixel_table(
    pixels: Callable[[torch.Tensor], torch.Tensor], channels: int, device: torch.device | str
) -> torch.Tensor:
    """Per-pixel work on uint8 images (``pixels``: a batch in, a batch out, the same shape: scaling to
    float, normalising) done once for every value: a (channels, 256) table whose row ``c``, column
    ``v`` is what ``pixels`` makes of the value ``v`` in channel ``c``, computed by the same
    operations, so looking values up gives the same bits.

    >>> pixel_table(lambda x: x.float() / 255.0, 1, "cpu")[0, 255].item()
    1.0
    """
    probe = torch.arange(256, dtype=torch.uint8, device=device).expand(1, channels, 1, 256).contiguous()
    out = pixels(probe)
    if out.shape != probe.shape:
        raise ValueError(f"the per-pixel work changed the shape {tuple(probe.shape)} to {tuple(out.shape)}")
    return out[0, :, 0, :].contiguous()


class BoxMaps(NamedTuple):
    """Random resized crops and the flips after them, drawn for ``len(rois)`` samples: each
    sample's box as ``roi_align`` takes it (x1, y1, x2, y2), and whether it is flipped
    left-right (``hflip``) or top-bottom (``vflip``), each (K, 1, 1, 1) or None (no such flip)."""

    rois: torch.Tensor
    hflip: torch.Tensor | None
    vflip: torch.Tensor | None

    def __len__(self) -> int:  # type: ignore[override]
        return self.rois.shape[0]


def draw_boxes(
    k: int,
    height: int,
    width: int,
    scale: Sequence[float],
    ratio: Sequence[float],
    flips: Sequence[tuple[float, bool]] = (),
    *,
    generator: torch.Generator | None = None,
    device: torch.device | str = "cpu",
) -> BoxMaps:
    """``k`` boxes of :func:`resized_crop_boxes` and the draws of the flips after them (``flips``:
    (p, vertical) each), in the order :func:`random_resized_crop` and :func:`random_flip` draw
    them: the same generator state gives the same crops and flips."""
    dev = torch.device(device)
    gdev = generator.device if generator is not None else dev
    top, left, h, w = (
        resized_crop_boxes(k, height, width, scale, ratio, generator=generator, device=dev).to(dev).unbind(1)
    )
    flipped: dict[bool, torch.Tensor | None] = {False: None, True: None}
    for p, vertical in flips:
        f = torch.rand(k, generator=generator, device=gdev).to(dev) < p
        flipped[vertical] = f if flipped[vertical] is None else flipped[vertical] ^ f  # two flips undo each other
    return BoxMaps(
        torch.stack([left, top, left + w, top + h], 1),
        *(None if f is None else f[:, None, None, None] for f in (flipped[False], flipped[True])),
    )


def gather_resized(
    x: torch.Tensor,
    maps: BoxMaps,
    size: tuple[int, int],
    *,
    index: torch.Tensor | None = None,
    start: int = 0,
    table: torch.Tensor | None = None,
) -> torch.Tensor:
    """The resized crops and flips of ``maps`` (rows ``start`` on) of the images ``x[index]``, as
    :func:`random_resized_crop` and :func:`random_flip` make them (one ``roi_align``); uint8 images
    rounded to uint8 values, then, where ``table`` (:func:`pixel_table`) is given, looked up."""
    from torchvision.ops import roi_align

    _check(x)
    imgs = x if index is None else x.index_select(0, index)
    n = imgs.shape[0]
    if start + n > len(maps):
        raise ValueError(f"{n} images from box {start} need {start + n} boxes, there are {len(maps)}")
    rois = torch.cat([_positions(n, maps.rois.dtype, x.device), maps.rois[start : start + n]], 1)
    out = roi_align(imgs.float(), rois, output_size=size, spatial_scale=1.0, sampling_ratio=-1, aligned=True)
    if x.dtype == torch.uint8:
        out = out.round_().clamp_(0, 255)
        out = out.to(torch.uint8) if table is None else table[_channels(x.shape[1], x.device), out.long()]
    else:
        out = out.to(x.dtype)
    for flip, dim in ((maps.hflip, -1), (maps.vflip, -2)):
        if flip is not None:
            out = torch.where(flip[start : start + n], out.flip(dim), out)
    return out


@functools.cache
def _positions(n: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """``arange(n)`` as an (n, 1) column of ``dtype`` on ``device``, made once per size."""
    return torch.arange(n, device=device, dtype=dtype)[:, None]


@functools.cache
def _channels(c: int, device: torch.device) -> torch.Tensor:
    """``arange(c)`` shaped (1, c, 1, 1) on ``device``, made once (a kernel saved every batch)."""
    return torch.arange(c, device=device)[None, :, None, None]
