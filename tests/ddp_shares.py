"""Which samples each rank trains on, with a feed speedup, under DDP on the CPU (gloo, 2 processes).

Run by ``tests/test_ddp_shares.py``, or by hand::

    python tests/ddp_shares.py OUT_DIR lightning:prefetch loop:prefetch ...

Each case is one fit of 2 epochs over 64 samples (batch 8) whose batches carry each sample's index:
``lightning:SPEEDUP`` through a Lightning Trainer (``devices=2, strategy="ddp"``, the callbacks),
``loop:SPEEDUP`` through ``FastLoop`` in the same processes (torch.distributed initialized, the
loader given its ``DistributedSampler``, as a plain DDP loop does). The cases run one after the
other in the two processes Lightning's launcher starts at the first fit (so a Lightning case comes
first). Each rank writes ``OUT_DIR/CASE.rankR.json``: the indices it trained on by epoch, the
speedup's record and, for ``prefetch``, where its batches were built.

``prefetch`` and ``gpu_resident`` need CUDA; here their ``why_not`` is cleared so that they apply on
the CPU: prefetch's thread runs (a loader that draws no host random numbers is read on it), and
gpu_resident serves batches from tensors on the CPU standing in for the device, as
``tests/test_gpu_resident.py`` runs it. SPEEDUP is ``prefetch``, ``gpu_resident``,
``gpu_resident_padded`` (a padding collate), ``pad_buckets``, ``workers`` or ``dali`` (an image
folder of 21 JPEGs, written to ``OUT_DIR/images`` before the ranks start, read by DALI's CPU
pipeline; each image is known by its pixels, as DALI's batches carry no index).
"""

from __future__ import annotations

import json
import os
import sys
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for p in (str(ROOT), str(ROOT / "src")):
    if p not in sys.path:
        sys.path.insert(0, p)

import torch  # noqa: E402
from torch.utils.data import DataLoader, Dataset, TensorDataset  # noqa: E402
from torch.utils.data.distributed import DistributedSampler  # noqa: E402

from fastloop._compat import LightningModule, Trainer  # noqa: E402
from fastloop.speedups import REGISTRY  # noqa: E402
from tests.targets import TextClassifier, TextRows, pad_collate  # noqa: E402

N, BATCH, EPOCHS, SEED = 64, 8, 2, 7
"""Samples, batch size, epochs, and the seed (``seed_everything``: Lightning's DistributedSampler's seed)."""
SPEC = {
    "prefetch": "prefetch",
    "gpu_resident": "gpu_resident",
    "gpu_resident_padded": "gpu_resident",
    "pad_buckets": "pad_buckets",
    "workers": "workers:2",
    "dali": "dali",
}
PADDED = {"gpu_resident_padded", "pad_buckets"}


def on_the_cpu() -> None:
    """Let the CUDA-only feeds apply on this CPU (see the module's docstring)."""
    for name in ("prefetch", "gpu_resident"):
        REGISTRY[name].why_not = lambda self, ctx: None


class IndexedRows(TextRows):
    """TextRows (5-40 tokens each, held in memory) with each sample's index beside its ids."""

    def __init__(self) -> None:
        super().__init__(n=N, seed=SEED)

    def __getitem__(self, i: int) -> dict:
        return {**super().__getitem__(i), "index": i}


def indexed_collate(samples: list[dict]) -> dict:
    """Pads to the batch's longest row (tests.targets.pad_collate) and keeps each sample's index."""
    return {**pad_collate(samples), "index": torch.tensor([s["index"] for s in samples])}


def dataset(case: str) -> Dataset:
    if case in PADDED:
        return IndexedRows()
    g = torch.Generator().manual_seed(SEED)
    return TensorDataset(torch.randn(N, 16, generator=g), torch.randint(0, 4, (N,), generator=g), torch.arange(N))


def loader(case: str, sampler: DistributedSampler | None = None) -> DataLoader:
    collate = {"collate_fn": indexed_collate} if case in PADDED else {}
    return DataLoader(dataset(case), batch_size=BATCH, shuffle=sampler is None, sampler=sampler, **collate)


def indices(batch) -> list[int]:
    return (batch["index"] if isinstance(batch, dict) else batch[2]).tolist()


class Linear(LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Linear(16, 4)
        self.seen: dict[int, list[int]] = {}

    def training_step(self, batch, batch_idx):
        if self.training:  # not pad_buckets' check, which runs the step in eval mode
            self.seen.setdefault(self.current_epoch, []).extend(indices(batch))
        return torch.nn.functional.cross_entropy(self.net(batch[0]), batch[1])

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


class Text(TextClassifier):
    def __init__(self) -> None:
        super().__init__(dropout=0.0)
        self.seen: dict[int, list[int]] = {}

    def training_step(self, batch, batch_idx):
        if self.training:  # not pad_buckets' check, which runs the step in eval mode
            self.seen.setdefault(self.current_epoch, []).extend(indices(batch))
        return super().training_step(batch, batch_idx)


FILES = 21
"""Images in the folder of the ``dali`` case (two shards of 10 and 11)."""


def write_images(root: Path) -> None:
    """21 JPEGs of 3 classes, each of its own size and colours."""
    from PIL import Image

    g = torch.Generator().manual_seed(SEED)
    for c in ("cat", "dog", "emu"):
        (root / c).mkdir(parents=True, exist_ok=True)
        for i in range(FILES // 3):
            h, w = 40 + 4 * i, 56 - 2 * i
            img = (torch.rand(3, 1, 1, generator=g) * 200 + 40 * torch.rand(3, h, w, generator=g)).clamp(0, 255)
            Image.fromarray(img.byte().permute(1, 2, 0).numpy()).save(root / c / f"{i}.jpg", quality=95)


def image_loader(root: Path) -> DataLoader:
    from torchvision import datasets
    from torchvision import transforms as T

    images = datasets.ImageFolder(str(root), transform=T.Compose([T.Resize(36), T.CenterCrop(32), T.ToTensor()]))
    return DataLoader(images, batch_size=2, shuffle=True)


class Images(LightningModule):
    """Knows each image by a digest of its pixels (DALI's batches carry no index)."""

    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Linear(3 * 32 * 32, 3)
        self.seen: dict[int, list[str]] = {}

    def training_step(self, batch, batch_idx):
        import hashlib

        x, y = batch
        digests = [hashlib.sha1(image.cpu().numpy().tobytes()).hexdigest()[:12] for image in x]
        self.seen.setdefault(self.current_epoch, []).extend(digests)
        return torch.nn.functional.cross_entropy(self.net(x.flatten(1)), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def feed_mode(source) -> str | None:
    """How a background feed built its batches (None: no feed)."""
    return getattr(source, "mode", None) if type(source).__name__ == "BackgroundFeed" else None


def lightning_case(case: str, out: str) -> dict:
    from fastloop._compat import pl
    from fastloop.lightning import callbacks, records_of

    pl.seed_everything(SEED, workers=True, verbose=False)
    module = Images() if case == "dali" else Text() if case in PADDED else Linear()
    data = image_loader(Path(out, "images")) if case == "dali" else loader(case)
    trainer = Trainer(
        accelerator="cpu",
        devices=2,
        strategy="ddp",
        max_epochs=EPOCHS,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        callbacks=callbacks(SPEC[case]),
    )
    modes: list = []

    class Mode(pl.Callback):
        def on_train_epoch_end(self, trainer, pl_module) -> None:
            modes.append(feed_mode(trainer.train_dataloader))

    trainer.callbacks.append(Mode())
    trainer.fit(module, train_dataloaders=data)
    return {
        "rank": trainer.global_rank,
        "epochs": {str(e): v for e, v in module.seen.items()},
        "records": [[r.name, r.status, r.reason] for r in records_of(trainer)],
        "mode": modes[0] if modes else None,
    }


def loop_case(case: str) -> dict:
    from fastloop.loop import FastLoop

    if not torch.distributed.is_initialized():  # Lightning's fit left none: the launcher's environment
        torch.distributed.init_process_group(
            "gloo", rank=int(os.environ["LOCAL_RANK"]), world_size=int(os.environ["WORLD_SIZE"])
        )
    rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
    torch.manual_seed(SEED)
    data = dataset(case)
    sampler = DistributedSampler(data, num_replicas=world, rank=rank, shuffle=True, seed=SEED)
    seen: list[int] = []
    if case in PADDED:
        model = Text()

        def step(m, batch):
            if m.training:  # not pad_buckets' check, which runs the step in eval mode
                seen.extend(indices(batch))
            return m.training_step(batch, 0)["loss"]
    else:
        model = torch.nn.Linear(16, 4)

        def step(m, batch):
            if m.training:
                seen.extend(indices(batch))
            return torch.nn.functional.cross_entropy(m(batch[0]), batch[1])

    loop = FastLoop(
        model,
        torch.optim.SGD(model.parameters(), lr=0.1),
        loader(case, sampler),
        step_fn=step,
        speedups=SPEC[case],
        device="cpu",
    )
    per_epoch = len(loop.loader)
    loop.train(steps=EPOCHS * per_epoch)
    return {
        "rank": rank,
        "epochs": {str(e): seen[e * per_epoch * BATCH : (e + 1) * per_epoch * BATCH] for e in range(EPOCHS)},
        "records": [[r.name, r.status, r.reason] for r in loop.records],
        "mode": feed_mode(loop.loader),
    }


def main(out: str, cases: list[str]) -> None:
    warnings.filterwarnings("ignore")
    on_the_cpu()
    if "LOCAL_RANK" not in os.environ and any(c.endswith(":dali") for c in cases):  # before rank 1 starts
        write_images(Path(out, "images"))
    for spec in cases:
        adapter, case = spec.split(":")
        t0 = time.perf_counter()
        doc = lightning_case(case, out) if adapter == "lightning" else loop_case(case)
        doc["seconds"] = round(time.perf_counter() - t0, 2)
        Path(out, f"{adapter}-{case}.rank{doc['rank']}.json").write_text(json.dumps(doc))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
