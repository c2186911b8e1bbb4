"""ResNet-50 (or any torchvision classifier by name) for the ImageNet recipe: label smoothing,
SGD with Nesterov momentum, linear warm-up then cosine, top-1/top-5 on validation."""

from __future__ import annotations

import math

import torch
import torchvision

from fastloop._compat import LightningModule
from fastloop.errors import FastloopError

__all__ = ["ImageClassifier"]


class ImageClassifier(LightningModule):
    throughput_unit = "images"
    flops_convention = (
        "3 x forward FLOPs per image (backward = 2 x forward), forward counted by "
        "torch.utils.flop_counter on a meta-device copy (conv/matmul, 2 per MAC)"
    )

    def __init__(
        self,
        arch: str = "resnet50",
        num_classes: int = 1000,
        lr: float = 0.1,
        batch_size: int = 64,
        momentum: float = 0.9,
        weight_decay: float = 5e-5,
        label_smoothing: float = 0.1,
        warmup_steps: int = 50,
        max_steps: int = 1000,
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        builder = getattr(torchvision.models, arch, None)
        if builder is None or not callable(builder):
            raise FastloopError(f"torchvision has no model {arch!r} (e.g. resnet18, resnet50, convnext_tiny)")
        self.model = builder(weights=None, num_classes=num_classes)  # never downloads weights
        self.batch_size = batch_size
        self.criterion = torch.nn.CrossEntropyLoss(label_smoothing=label_smoothing)

    def flops_per_batch(self, batch) -> float:
        """Training FLOPs of one batch, counted once per image size (compiled models included:
        the count runs on a fresh meta-device copy of the architecture, no real compute).

        >>> m = ImageClassifier("resnet18", num_classes=1000)
        >>> round(m.flops_per_batch((torch.zeros(2, 3, 224, 224), None)) / 2 / 3 / 1e9, 2)  # GFLOP fwd per image
        3.63
        """
        x = batch[0]
        key = tuple(x.shape[1:])
        cache = self.__dict__.setdefault("_fwd_flops", {})
        if key not in cache:
            from torch.utils.flop_counter import FlopCounterMode

            with torch.device("meta"):
                model = getattr(torchvision.models, self.hparams.arch)(
                    weights=None, num_classes=self.hparams.num_classes
                )
                probe = torch.zeros(1, *key)
            counter = FlopCounterMode(display=False)
            with counter, torch.no_grad():
                model(probe)
            cache[key] = float(counter.get_total_flops())
        return 3.0 * cache[key] * x.shape[0]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = self.criterion(self.model(x), y)
        self.log("train_loss", loss)  # no prog_bar: it would read the loss to the host every step (a sync)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        logits = self.model(x)
        top5 = logits.topk(min(5, logits.shape[1]), dim=1).indices
        self.log("val_loss", self.criterion(logits, y), prog_bar=True)
        self.log("val_top1", (top5[:, 0] == y).float().mean(), prog_bar=True)
        self.log("val_top5", (top5 == y[:, None]).any(1).float().mean())

    def configure_optimizers(self):
        hp = self.hparams
        decay = [p for p in self.parameters() if p.dim() > 1]
        no_decay = [p for p in self.parameters() if p.dim() <= 1]
        opt = torch.optim.SGD(
            [{"params": decay, "weight_decay": hp.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
            lr=hp.lr * hp.batch_size / 256,
            momentum=hp.momentum,
            nesterov=True,
        )

        def lr_lambda(step: int) -> float:
            if step < hp.warmup_steps:
                return (step + 1) / hp.warmup_steps
            t = min(1.0, (step - hp.warmup_steps) / max(1, hp.max_steps - hp.warmup_steps))
            return 0.5 * (1 + math.cos(math.pi * t))

        return {
            "optimizer": opt,
            "lr_scheduler": {"scheduler": torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda), "interval": "step"},
        }
