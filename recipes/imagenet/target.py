"""``fastloop run imagenet``: ResNet-50 on an ImageFolder tree (default: generated JPEGs).

Environment overrides for benchmarks: FASTLOOP_IMAGENET_ROOT, FASTLOOP_IMAGENET_BATCH,
FASTLOOP_IMAGENET_LOADER (torchvision|dali|synthetic), FASTLOOP_IMAGENET_WORKERS,
FASTLOOP_IMAGENET_DALI (DALI pipeline options, e.g. ``num_threads=12,hw_decoder_load=0.99``).
"""

from __future__ import annotations

import os

import torch

from fastloop.errors import FastloopError
from fastloop.recipes.imagenet.data import ImageData
from fastloop.recipes.imagenet.module import ImageClassifier

EXTRA_RUNGS = ["cudnn_benchmark"]
"""Recipe-level speedups this recipe's default ladder adds to the generic rungs."""

__all__ = ["make", "parse_options"]


def _value(text: str):
    low = text.lower()
    if low in ("true", "false"):
        return low == "true"
    if low in ("float16", "float32"):
        return getattr(torch, low)
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    raise FastloopError(f"cannot read option value {text!r} (accepted: numbers, true/false, float16/float32)")


def parse_options(text: str) -> dict:
    """``"a=1,b=true"`` -> ``{"a": 1, "b": True}``.

    >>> parse_options("num_threads=12,hw_decoder_load=0.99,affine=false")
    {'num_threads': 12, 'hw_decoder_load': 0.99, 'affine': False}
    """
    out = {}
    for item in filter(None, (t.strip() for t in text.split(","))):
        key, sep, val = item.partition("=")
        if not sep or not key.strip():
            raise FastloopError(f"option {item!r} is not key=value")
        out[key.strip()] = _value(val.strip())
    return out


def make(
    root: str | None = None,
    arch: str | None = None,
    batch_size: int | None = None,
    loader: str | None = None,
    num_workers: int | None = None,
    crop: int | None = None,
    seed: int = 0,
    dali_options: dict | None = None,
):
    cuda = torch.cuda.is_available()
    env = os.environ.get
    root = root or env("FASTLOOP_IMAGENET_ROOT")
    arch = arch or ("resnet50" if cuda else "resnet18")
    batch_size = batch_size or int(env("FASTLOOP_IMAGENET_BATCH", 256 if cuda else 16))
    loader = loader or env("FASTLOOP_IMAGENET_LOADER", "torchvision")
    num_workers = int(env("FASTLOOP_IMAGENET_WORKERS", 0)) if num_workers is None else num_workers
    crop = crop or (224 if cuda else 112)
    torch.manual_seed(seed)
    if dali_options is None:
        dali_options = parse_options(env("FASTLOOP_IMAGENET_DALI", ""))
    data = ImageData(
        root,
        loader=loader,
        batch_size=batch_size,
        crop=crop,
        num_workers=num_workers,
        seed=seed,
        dali_options=dali_options,
    )
    module = ImageClassifier(arch=arch, num_classes=data.num_classes, batch_size=batch_size)
    return module, data
