"""A GPT-style language model written the usual way (nanoGPT-like blocks with
``F.scaled_dot_product_attention``): 6 layers, 384 wide, 6 heads, context 256, AdamW with weight
decay and a linear warm-up then cosine schedule (LambdaLR stepped every batch), in-memory tokens,
batch 64."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

try:
    from lightning.pytorch import LightningModule
except ImportError:  # pragma: no cover
    from pytorch_lightning import LightningModule  # type: ignore[no-redef]


class Block(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, c))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, vocab: int = 8192, ctx: int = 256, dim: int = 384, layers: int = 6, heads: int = 6) -> None:
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, dim), nn.Embedding(ctx, dim)
        self.blocks = nn.ModuleList([Block(dim, heads) for _ in range(layers)])
        self.ln = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)
        self.head.weight = self.tok.weight
        self.apply(self._init_weights)

    @staticmethod
    def _init_weights(m: nn.Module) -> None:
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, mean=0.0, std=0.02)
        if isinstance(m, nn.Linear) and m.bias is not None:
            nn.init.zeros_(m.bias)

    def forward(self, idx):
        x = self.tok(idx) + self.pos(torch.arange(idx.size(1), device=idx.device))
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.ln(x))


class LitGPT(LightningModule):
    def __init__(self, lr: float = 6e-4, warmup: int = 200, total: int = 5000) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.model = GPT()

    def training_step(self, batch, batch_idx):
        x, y = batch
        logits = self.model(x)
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)), y.view(-1))
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self):
        decay = [p for p in self.parameters() if p.dim() >= 2]
        no_decay = [p for p in self.parameters() if p.dim() < 2]
        opt = torch.optim.AdamW(
            [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
            lr=self.hparams.lr,
            betas=(0.9, 0.95),
        )
        warmup, total = self.hparams.warmup, self.hparams.total

        def lr_lambda(step: int) -> float:
            if step < warmup:
                return (step + 1) / warmup
            return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, (step - warmup) / (total - warmup))))

        sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


def _tokens(n: int, ctx: int, vocab: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    t = torch.randint(0, vocab, (n, ctx + 1), generator=g)
    return t[:, :-1].contiguous(), t[:, 1:].contiguous()


def make(batch_size: int = 64, n: int = 64 * 100, seed: int = 0):
    torch.manual_seed(seed)
    data = DataLoader(
        TensorDataset(*_tokens(n, 256, 8192, seed)),
        batch_size=batch_size,
        shuffle=True,
        drop_last=True,
        generator=torch.Generator().manual_seed(seed),
    )
    module = LitGPT()
    module.throughput_unit = "samples"
    return module, data, {"gradient_clip_val": 1.0}


def expert(batch_size: int = 64, n: int = 64 * 100, seed: int = 0):
    """By hand: the data on the GPU, bf16-mixed, TF32, a fused AdamW, and
    ``torch.compile(mode="reduce-overhead")`` (compile's CUDA graphs, each step marked)."""
    from benchmarks.zoo._expert import GpuData, MarkStep, tf32

    tf32()
    torch.manual_seed(seed)

    class Fused(LitGPT):
        def configure_optimizers(self):
            conf = super().configure_optimizers()
            for g in conf["optimizer"].param_groups:  # the fused CUDA kernel for every group
                g["fused"], g["foreach"] = True, False
            return conf

    module = Fused()
    module.model.compile(mode="reduce-overhead")
    return (
        module,
        GpuData(*_tokens(n, 256, 8192, seed), batch_size=batch_size, seed=seed),
        {"gradient_clip_val": 1.0, "precision": "bf16-mixed", "callbacks": [MarkStep()]},
    )
