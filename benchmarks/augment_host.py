"""gpu_augment's cost to the host: the time to hand out one batch (the ops launched, not waited
for: the host launches them between steps, so a host-bound step waits this long for its data)
and the batches/s the GPU then makes, for the CIFAR-style v2 pipeline of the zoo's ViT
(``RandomCrop(32, padding=4)``, ``RandomHorizontalFlip``, ``ToDtype``, ``Normalize``) on 50,000
stored uint8 images, batch 256: the fused form (one gather a batch, pixels looked up) against the
ops one by one, and the same for the ImageNet-style ``RandomResizedCrop(224)`` pipeline on 2,000
stored 256x256 images (fused since round 28's second change: one ``roi_align`` and one lookup).

    PYTHONPATH=src:. python3 benchmarks/run.py augment-host
"""

from __future__ import annotations

import statistics
import time

import torch
from torch.utils.data import DataLoader, Dataset

from benchmarks._common import emit
from fastloop.speedups.gpu_augment.gpu_augment import make_augmented


class Stored(Dataset):
    def __init__(self, n: int, size: int, transform) -> None:
        self.data = torch.randint(
            0, 256, (n, 3, size, size), dtype=torch.uint8, generator=torch.Generator().manual_seed(0)
        )
        self.targets = torch.randint(0, 10, (n,)).tolist()
        self.transform = transform

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, i: int):
        img = self.data[i]
        return (self.transform(img) if self.transform is not None else img), self.targets[i]


def measure(loader, batches: int = 150, warm: int = 10) -> dict:
    """Host microseconds per batch (median, p10-p90) without waiting for the GPU, then batches/s
    with the GPU's work included (synchronized at both ends)."""
    it = (batch for _ in iter(int, 1) for batch in loader)  # epoch after epoch
    for _ in range(warm):
        next(it)
    torch.cuda.synchronize()
    host, t0 = [], time.perf_counter()
    for _ in range(batches):
        t = time.perf_counter()
        x, y = next(it)
        host.append((time.perf_counter() - t) * 1e6)
    torch.cuda.synchronize()
    wall = time.perf_counter() - t0
    q = statistics.quantiles(host, n=10)
    return {
        "host_us_median": statistics.median(host),
        "host_us_p10": q[0],
        "host_us_p90": q[-1],
        "batches_per_s": batches / wall,
        "shape": list(x.shape),
        "dtype": str(x.dtype),
    }


def main() -> None:
    from torchvision.transforms import v2

    cifar = v2.Compose(
        [
            v2.RandomCrop(32, padding=4),
            v2.RandomHorizontalFlip(),
            v2.ToDtype(torch.float32, scale=True),
            v2.Normalize([0.49, 0.48, 0.45], [0.25, 0.24, 0.26]),
        ]
    )
    imnet = v2.Compose(
        [
            v2.RandomResizedCrop(224),
            v2.RandomHorizontalFlip(),
            v2.ToDtype(torch.float32, scale=True),
            v2.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225]),
        ]
    )
    rows = {}
    for name, ds, fuse in (
        ("cifar_fused", Stored(50_000, 32, cifar), True),
        ("cifar_one_by_one", Stored(50_000, 32, cifar), False),
        ("imagenet_rrc_fused", Stored(2_000, 256, imnet), True),
        ("imagenet_rrc_one_by_one", Stored(2_000, 256, imnet), False),
    ):
        aug = make_augmented(DataLoader(ds, batch_size=256, shuffle=True, drop_last=True), torch.device("cuda"))
        if not fuse:
            aug.fused = None
        rows[name] = {"fused": aug.fused is not None, **measure(aug, batches=150 if "cifar" in name else 60)}
    emit("augment_host", {"batch": 256, "rows": rows})
    print(f"{'pipeline':<26}{'fused':>6}{'host us/batch':>15}{'p10-p90':>16}{'batches/s':>11}")
    for name, r in rows.items():
        spread = f"{r['host_us_p10']:>8.0f}-{r['host_us_p90']:<7.0f}"
        print(f"{name:<26}{str(r['fused']):>6}{r['host_us_median']:>15.0f}{spread}{r['batches_per_s']:>11.0f}")


if __name__ == "__main__":
    main()
