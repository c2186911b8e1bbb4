"""What an expert does by hand, shared by the zoo's ``expert`` targets (plain PyTorch and
Lightning, no fastloop): the data on the GPU, TF32, and compile's CUDA graphs with each step marked."""

from __future__ import annotations

import torch

try:
    from lightning.pytorch import Callback, LightningDataModule
except ImportError:  # pragma: no cover
    from pytorch_lightning import Callback, LightningDataModule  # type: ignore[no-redef]


class GpuBatches:
    """In-memory tensors held on the GPU, served as shuffled batches (no loader, no copies)."""

    def __init__(self, *tensors: torch.Tensor, batch_size: int, seed: int = 0, drop_last: bool = True) -> None:
        self.tensors = [t.cuda() for t in tensors]
        self.batch_size, self.drop_last = batch_size, drop_last
        self.g = torch.Generator(device="cuda").manual_seed(seed)

    def __len__(self) -> int:
        n = len(self.tensors[0])
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)

    def __iter__(self):
        order = torch.randperm(len(self.tensors[0]), device="cuda", generator=self.g)
        for i in range(len(self)):
            idx = order[i * self.batch_size : (i + 1) * self.batch_size]
            yield [t[idx] for t in self.tensors]


class GpuData(LightningDataModule):
    """A DataModule whose training batches come from :class:`GpuBatches`."""

    def __init__(self, *tensors: torch.Tensor, batch_size: int, seed: int = 0) -> None:
        super().__init__()
        self.batches = GpuBatches(*tensors, batch_size=batch_size, seed=seed)

    def train_dataloader(self):
        return self.batches


class MarkStep(Callback):
    """compile's CUDA graphs ("reduce-overhead") need each training step marked."""

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        torch.compiler.cudagraph_mark_step_begin()


def tf32() -> None:
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
