"""Three zoo modules as their users fit them, for ``fastloop fit`` and ``fastloop ab --fit``: the
same module, training loader and Trainer settings as the zoo's ``make`` (the training step is the
zoo's own), plus what a real fit has beside the steps: a held-out validation set checked every
epoch, its loss logged with ``prog_bar=True`` (a read to the host every step of validation), and
a ``ModelCheckpoint`` on it.

- ``vit``: the ViT with per-sample CPU augmentation (an image classifier whose feed is the work);
- ``bert_padded``: the BERT-style classifier padded per batch (its labels are learnable);
- ``cifar_resnet``: the tutorial's CIFAR ResNet-18 (in-memory data).

Example (on the GPU; the commands RESULTS.md records):
    fastloop fit benchmarks/zoo/fits.py:vit --epochs 3 --out fit-vit/
    fastloop ab benchmarks/zoo/fits.py:bert_padded --fit --a none --b PICK --epochs 3 --seeds 3 --out ab-bert/
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from benchmarks.zoo import bert_padded as zoo_bert
from benchmarks.zoo import cifar_resnet as zoo_cifar
from benchmarks.zoo import vit as zoo_vit

try:
    from lightning.pytorch.callbacks import ModelCheckpoint
except ImportError:  # pragma: no cover
    from pytorch_lightning.callbacks import ModelCheckpoint  # type: ignore[no-redef]

__all__ = ["bert_padded", "cifar_resnet", "vit"]


def _fit_settings(trainer: dict | None) -> dict:
    """The zoo's Trainer settings and a fit's: validation every epoch, a checkpoint on its loss."""
    return {**(trainer or {}), "check_val_every_n_epoch": 1, "callbacks": [ModelCheckpoint(monitor="val_loss")]}


def _log_validation(module, logits: torch.Tensor, labels: torch.Tensor) -> None:
    module.log("val_loss", F.cross_entropy(logits.float(), labels), prog_bar=True)
    module.log("val_acc", (logits.argmax(-1) == labels).float().mean())


class ValidatedViT(zoo_vit.LitViT):
    """The zoo's ViT, validated on held-out images."""

    val_loader: DataLoader | None = None

    def validation_step(self, batch, batch_idx):
        x, y = batch
        _log_validation(self, self(x), y)

    def val_dataloader(self):
        return self.val_loader


class ValidatedBert(zoo_bert.BertClassifier):
    """The zoo's BERT-style classifier, validated on held-out rows (padded per batch, as in training)."""

    val_loader: DataLoader | None = None

    def validation_step(self, batch, batch_idx):
        _log_validation(self, self(batch["input_ids"], batch["attention_mask"]), batch["labels"])

    def val_dataloader(self):
        return self.val_loader


class ValidatedResnet(zoo_cifar.LitResnet):
    """The zoo's CIFAR ResNet-18, validated on held-out images."""

    val_loader: DataLoader | None = None

    def validation_step(self, batch, batch_idx):
        x, y = batch
        _log_validation(self, self(x), y)

    def val_dataloader(self):
        return self.val_loader


def vit(batch_size: int = 256, seed: int = 0):
    _, loader, trainer = zoo_vit.make(batch_size, seed)
    torch.manual_seed(seed)  # the weights the zoo's make draws
    module = ValidatedViT(batch_size=batch_size)
    module.val_loader = DataLoader(zoo_vit.AugmentedImages(n=2_000, seed=seed + 1_000), batch_size=batch_size)
    return module, loader, _fit_settings(trainer)


def bert_padded(batch_size: int = 64, n: int = 64 * 150, seed: int = 0):
    _, loader, trainer = zoo_bert.make(batch_size, n, seed)
    torch.manual_seed(seed)
    module = ValidatedBert()
    module.val_loader = DataLoader(
        zoo_bert.Rows(n // 10, seed + 1_000), batch_size=batch_size, collate_fn=zoo_bert.collate
    )
    return module, loader, _fit_settings(trainer)


def cifar_resnet(batch_size: int = 256, n: int = 10_000, seed: int = 0):
    made = zoo_cifar.make(batch_size, n, seed)
    torch.manual_seed(seed)
    module = ValidatedResnet(batch_size=batch_size, steps_per_epoch=n // batch_size)
    x, y = zoo_cifar._data(n // 5, seed + 1_000)
    module.val_loader = DataLoader(TensorDataset(x, y), batch_size=batch_size)
    return module, made[1], _fit_settings(made[2] if len(made) > 2 else None)
