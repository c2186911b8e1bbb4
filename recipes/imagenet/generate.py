"""Generate the ImageNet recipe's default data: real JPEG files in ImageFolder layout.

Images are sized like ImageNet's (about 400x350 px, 80-110 kB each at quality 92) and
learnable: each class has its own stripe orientation, frequency and colour cast, hidden under
per-image noise, random blobs and brightness, so a short run rises clearly above chance while
the decoder does the same work as on photographs of that size.

    python -m fastloop.recipes.imagenet.generate --out ~/.cache/fastloop/imagenet-gen --classes 10 --train 100 --val 20
"""

from __future__ import annotations

import argparse
import os
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

__all__ = ["default_dataset", "generate", "make_image"]


def make_image(cls: int, n_classes: int, seed: int) -> np.ndarray:
    """One HxWx3 uint8 image of class ``cls``."""
    rng = np.random.default_rng(seed)
    h, w = int(rng.integers(300, 420)), int(rng.integers(360, 500))
    angle = np.pi * cls / n_classes
    freq = 0.03 + 0.05 * ((cls * 7) % n_classes) / n_classes
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
    stripes = np.sin(freq * (xx * np.cos(angle) + yy * np.sin(angle)) + rng.uniform(0, 2 * np.pi))
    hue = np.array(
        [
            np.cos(2 * np.pi * cls / n_classes),
            np.cos(2 * np.pi * cls / n_classes + 2.1),
            np.cos(2 * np.pi * cls / n_classes + 4.2),
        ],
        dtype=np.float32,
    )
    img = 128 + 45 * stripes[..., None] * (0.6 + 0.4 * hue) + 25 * hue
    for _ in range(int(rng.integers(2, 6))):  # distractor blobs
        cy, cx, r = rng.uniform(0, h), rng.uniform(0, w), rng.uniform(20, 90)
        mask = ((yy - cy) ** 2 + (xx - cx) ** 2) < r * r
        img[mask] = rng.uniform(0, 255, 3)
    img = img * rng.uniform(0.7, 1.2) + rng.normal(0, 17, img.shape)
    return np.clip(img, 0, 255).astype(np.uint8)


def _write(args: tuple[str, int, int, int, int]) -> int:
    from PIL import Image

    path, cls, n_classes, seed, quality = args
    Image.fromarray(make_image(cls, n_classes, seed)).save(path, "JPEG", quality=quality)
    return os.path.getsize(path)


def generate(
    out: str | os.PathLike,
    classes: int = 10,
    train: int = 100,
    val: int = 20,
    quality: int = 92,
    workers: int | None = None,
    seed: int = 0,
) -> Path:
    """Write ``out/train/<class>/*.jpg`` and ``out/val/<class>/*.jpg``; returns ``out``."""
    if classes < 2 or train < 1 or val < 0:
        raise ValueError("need classes >= 2, train >= 1 and val >= 0")
    root = Path(out)
    jobs = []
    for split, n, base in (("train", train, 0), ("val", val, 10_000_000)):
        for c in range(classes):
            d = root / split / f"class_{c:04d}"
            d.mkdir(parents=True, exist_ok=True)
            for i in range(n):
                jobs.append((str(d / f"{i:06d}.jpg"), c, classes, seed * 1_000_003 + base + c * 100_000 + i, quality))
    with ProcessPoolExecutor(max_workers=workers or os.cpu_count()) as ex:
        sizes = list(ex.map(_write, jobs, chunksize=16))
    (root / "MANIFEST").write_text(f"classes={classes} train={train} val={val} mean_bytes={int(np.mean(sizes))}\n")
    return root


def default_dataset(classes: int = 10, train: int = 100, val: int = 20) -> Path:
    """The cached default dataset (generated on first use)."""
    cache = (
        Path(os.environ.get("FASTLOOP_CACHE", Path.home() / ".cache" / "fastloop"))
        / f"imagenet-gen-{classes}-{train}-{val}"
    )
    if not (cache / "MANIFEST").exists():
        tmp = cache.with_name(cache.name + f".tmp{os.getpid()}")
        generate(tmp, classes, train, val)
        try:
            os.replace(tmp, cache)
        except OSError:  # another process finished first
            import shutil

            shutil.rmtree(tmp, ignore_errors=True)
    return cache


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True)
    p.add_argument("--classes", type=int, default=10)
    p.add_argument("--train", type=int, default=100, help="images per class in train/")
    p.add_argument("--val", type=int, default=20, help="images per class in val/")
    p.add_argument("--quality", type=int, default=92)
    a = p.parse_args(argv)
    root = generate(a.out, a.classes, a.train, a.val, a.quality)
    print((root / "MANIFEST").read_text().strip())


if __name__ == "__main__":
    main()
