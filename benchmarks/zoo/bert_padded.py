"""A BERT-style Transformer-encoder classifier written the ordinary way: dict batches of
``input_ids`` / ``attention_mask`` / ``labels`` padded per batch to their own longest row (16-128
tokens, a collate like Hugging Face's ``DataCollatorWithPadding``), a key-padding mask in
``F.scaled_dot_product_attention``, masked mean pooling, AdamW with a per-step linear warm-up,
gradient clipping on the Trainer; batch 64, in-memory token rows."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset

try:
    from lightning.pytorch import LightningModule
except ImportError:  # pragma: no cover
    from pytorch_lightning import LightningModule  # type: ignore[no-redef]

VOCAB, MAX_LEN, PAD_ID = 8192, 128, 0


class Rows(Dataset):
    """Token rows of 16-128 tokens and a 4-way label each."""

    def __init__(self, n: int, seed: int = 0, shortest: int = 16) -> None:
        g = torch.Generator().manual_seed(seed)
        lengths = torch.randint(shortest, MAX_LEN + 1, (n,), generator=g).tolist()
        self.rows = [torch.randint(1, VOCAB, (k,), generator=g) for k in lengths]
        self.labels = [int(r[0]) % 4 for r in self.rows]

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> dict:
        return {"input_ids": self.rows[i], "labels": self.labels[i]}


def collate(samples: list[dict], pad_to: int | None = None) -> dict:
    """Pad to the batch's longest row (or to ``pad_to``), as DataCollatorWithPadding does."""
    longest = pad_to or max(len(s["input_ids"]) for s in samples)
    ids = torch.full((len(samples), longest), PAD_ID, dtype=torch.long)
    mask = torch.zeros((len(samples), longest), dtype=torch.long)
    for i, s in enumerate(samples):
        n = len(s["input_ids"])
        ids[i, :n], mask[i, :n] = s["input_ids"], 1
    return {"input_ids": ids, "attention_mask": mask, "labels": torch.tensor([s["labels"] for s in samples])}


def collate_fixed(samples: list[dict]) -> dict:
    return collate(samples, pad_to=MAX_LEN)


class Layer(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))
        self.drop = nn.Dropout(0.1)

    def forward(self, x: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=keep[:, None, None, :])
        x = x + self.drop(self.proj(y.transpose(1, 2).reshape(b, t, c)))
        return x + self.drop(self.mlp(self.ln2(x)))


class Encoder(nn.Module):
    def __init__(self, dim: int = 384, layers: int = 6, heads: int = 6) -> None:
        super().__init__()
        self.tok, self.pos = nn.Embedding(VOCAB, dim, padding_idx=PAD_ID), nn.Embedding(MAX_LEN, dim)
        self.layers = nn.ModuleList([Layer(dim, heads) for _ in range(layers)])
        self.ln = nn.LayerNorm(dim)

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        keep = mask.bool()
        x = self.tok(ids) + self.pos(torch.arange(ids.size(1), device=ids.device))
        for layer in self.layers:
            x = layer(x, keep)
        x = self.ln(x)
        return (x * keep[..., None]).sum(1) / keep.sum(1, keepdim=True)  # masked mean pooling


class BertClassifier(LightningModule):
    def __init__(self, lr: float = 3e-4, warmup: int = 500) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.encoder = Encoder()
        self.head = nn.Linear(384, 4)

    def forward(self, input_ids, attention_mask):
        return self.head(self.encoder(input_ids, attention_mask))

    def training_step(self, batch, batch_idx):
        loss = F.cross_entropy(self(batch["input_ids"], batch["attention_mask"]), batch["labels"])
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self):
        opt = torch.optim.AdamW(self.parameters(), lr=self.hparams.lr, weight_decay=0.01)
        warmup = self.hparams.warmup
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / warmup))
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


def make(batch_size: int = 64, n: int = 64 * 150, seed: int = 0):
    torch.manual_seed(seed)
    loader = DataLoader(
        Rows(n, seed),
        batch_size=batch_size,
        shuffle=True,
        collate_fn=collate,
        generator=torch.Generator().manual_seed(seed),
    )
    return BertClassifier(), loader, {"gradient_clip_val": 1.0}


def expert(batch_size: int = 64, n: int = 64 * 150, seed: int = 0):
    """By hand: every batch padded to the fixed maximum (128), bf16-mixed, TF32 and
    ``torch.compile(mode="reduce-overhead")`` on the encoder (compile's CUDA graphs, each step marked)."""
    from benchmarks.zoo._expert import MarkStep, tf32

    tf32()
    torch.manual_seed(seed)
    module = BertClassifier()
    module.encoder.compile(mode="reduce-overhead")
    loader = DataLoader(
        Rows(n, seed),
        batch_size=batch_size,
        shuffle=True,
        collate_fn=collate_fixed,
        generator=torch.Generator().manual_seed(seed),
    )
    return module, loader, {"gradient_clip_val": 1.0, "precision": "bf16-mixed", "callbacks": [MarkStep()]}
