"""The GPT LightningModule: AdamW with decay/no-decay groups, warm-up + cosine LR, gradient
clipping (configured on the Trainer), tokens/s and MFU logged via fastloop's measurement."""

from __future__ import annotations

import math

import torch

from fastloop._compat import LightningModule
from fastloop.recipes.gpt.model import GPT, GPTConfig

__all__ = ["GPTModule"]


class GPTModule(LightningModule):
    throughput_unit = "tokens"
    flops_convention = "6N + 12*L*d*T per token (nanoGPT/PaLM; N = non-embedding parameters)"

    def __init__(
        self,
        preset: str = "tiny",
        lr: float = 6e-4,
        weight_decay: float = 0.1,
        warmup_steps: int = 100,
        max_steps: int = 5000,
        min_lr_ratio: float = 0.1,
        batch_size: int = 16,
        **overrides,
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.cfg = GPTConfig.preset(preset, **overrides)
        self.model = GPT(self.cfg)
        self.batch_size = batch_size

    def items_per_batch(self, batch) -> int:
        return batch[0].numel()

    def flops_per_batch(self, batch) -> float:
        return self.model.flops_per_token() * batch[0].numel()

    def training_step(self, batch, batch_idx):
        x, y = batch
        _, loss = self.model(x, y)
        # no prog_bar: Lightning turns progress-bar values into Python floats after every step (a
        # host-device sync that idled the H200 ~2 ms per GPT-2 step); the logger still gets it
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        _, loss = self.model(x, y)
        self.log("val_loss", loss, prog_bar=True)

    def configure_optimizers(self):
        hp = self.hparams
        params = [p for p in self.parameters() if p.requires_grad]
        decay = [p for p in params if p.dim() >= 2]  # matmul weights and embeddings
        no_decay = [p for p in params if p.dim() < 2]  # biases and LayerNorm gains
        opt = torch.optim.AdamW(
            [{"params": decay, "weight_decay": hp.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
            lr=hp.lr,
            betas=(0.9, 0.95),
        )

        def lr_lambda(step: int) -> float:
            if step < hp.warmup_steps:
                return (step + 1) / hp.warmup_steps
            progress = min(1.0, (step - hp.warmup_steps) / max(1, hp.max_steps - hp.warmup_steps))
            return hp.min_lr_ratio + (1 - hp.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))

        sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}
