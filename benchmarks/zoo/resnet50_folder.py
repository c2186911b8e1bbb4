"""A ResNet-50 trained the way most vision users start: ``torchvision.datasets.ImageFolder`` over a
folder of JPEGs with the standard training transforms (RandomResizedCrop(224),
RandomHorizontalFlip, ToTensor, Normalize) decoded by 8 loader workers, SGD with momentum and a
cosine schedule stepped per batch, batch 128.

The folder is generated once (no download): ``ZOO_JPEG_DIR`` (default ``/tmp/zoo_jpegs``), 100
classes, ``ZOO_JPEG_N`` images (default 20,000) of ImageNet-like sizes (300-450 x 400-600 px,
about 500x375 on average), smooth random content so that the files weigh what photographs weigh.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

import torch
import torch.nn.functional as F
import torchvision
from torch.utils.data import DataLoader

try:
    from lightning.pytorch import LightningModule
except ImportError:  # pragma: no cover
    from pytorch_lightning import LightningModule  # type: ignore[no-redef]

MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]
CLASSES = 100


def _root() -> Path:
    return Path(os.environ.get("ZOO_JPEG_DIR", "/tmp/zoo_jpegs"))


def _write(args: tuple[str, int]) -> None:
    import numpy as np
    from PIL import Image

    path, seed = args
    rng = np.random.default_rng(seed)
    h, w = int(rng.integers(300, 451)), int(rng.integers(400, 601))
    small = rng.integers(0, 256, (h // 16 + 1, w // 16 + 1, 3), dtype=np.uint8)
    img = Image.fromarray(small).resize((w, h), Image.BICUBIC)
    arr = np.asarray(img, dtype=np.int16) + rng.integers(-12, 13, (h, w, 3), dtype=np.int16)
    Image.fromarray(arr.clip(0, 255).astype(np.uint8)).save(path, quality=90)


def prepare(n: int | None = None) -> Path:
    """Generate the folder once (a lock keeps concurrent processes from writing it twice)."""
    from multiprocessing import Pool

    root = _root()
    n = n or int(os.environ.get("ZOO_JPEG_N", "20000"))
    root.parent.mkdir(parents=True, exist_ok=True)
    with open(str(root) + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (root / ".complete").exists():
            return root
        jobs = []
        for i in range(n):
            d = root / f"class{i % CLASSES:03d}"
            d.mkdir(parents=True, exist_ok=True)
            jobs.append((str(d / f"{i:06d}.jpg"), i))
        with Pool(min(16, os.cpu_count() or 1)) as pool:
            pool.map(_write, jobs, chunksize=64)
        (root / ".complete").write_text(str(n))
    return root


def transform():
    import torchvision.transforms as T

    return T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.ToTensor(), T.Normalize(MEAN, STD)])


class LitResNet50(LightningModule):
    def __init__(self, lr: float = 0.1, steps: int = 10_000) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.model = torchvision.models.resnet50(weights=None, num_classes=CLASSES)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.cross_entropy(self.model(x), y)
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self):
        opt = torch.optim.SGD(self.parameters(), lr=self.hparams.lr, momentum=0.9, weight_decay=1e-4, nesterov=True)
        sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=self.hparams.steps)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


def make(batch_size: int = 128, workers: int = 8, seed: int = 0):
    torch.manual_seed(seed)
    data = torchvision.datasets.ImageFolder(str(prepare()), transform=transform())
    loader = DataLoader(data, batch_size=batch_size, shuffle=True, drop_last=True, num_workers=workers)
    return LitResNet50(), loader


def expert(batch_size: int = 128, seed: int = 0):
    """By hand: 16 workers, pinned memory, persistent workers, bf16-mixed, channels_last, TF32,
    compile (default mode)."""
    from benchmarks.zoo._expert import tf32

    tf32()
    torch.manual_seed(seed)
    module = LitResNet50()
    module.model = module.model.to(memory_format=torch.channels_last)
    module.model.compile()
    data = torchvision.datasets.ImageFolder(str(prepare()), transform=transform())
    loader = DataLoader(
        data,
        batch_size=batch_size,
        shuffle=True,
        drop_last=True,
        num_workers=16,
        pin_memory=True,
        persistent_workers=True,
        prefetch_factor=4,
    )
    return module, loader, {"precision": "bf16-mixed"}
