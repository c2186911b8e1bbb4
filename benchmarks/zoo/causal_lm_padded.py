"""A small causal language model trained on rows padded per batch (labels -100 on the padding,
ignored by the loss): 4 layers, 256 wide, rows of 32-256 tokens, batch 32. It counts real tokens
(``items_per_batch``: the attention mask's sum), so tokens/s never counts padding."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset

from benchmarks.zoo.gpt_small import Block  # the same causal block (SDPA, is_causal)

try:
    from lightning.pytorch import LightningModule
except ImportError:  # pragma: no cover
    from pytorch_lightning import LightningModule  # type: ignore[no-redef]

VOCAB, MAX_LEN = 4096, 256


class Rows(Dataset):
    def __init__(self, n: int, seed: int = 0, long_tail: bool = False) -> None:
        g = torch.Generator().manual_seed(seed)
        if long_tail:  # most rows short, a few long, as in real text: a batch's longest row varies widely
            lengths = (16 + torch.empty(n).exponential_(1 / 40, generator=g)).clamp(max=MAX_LEN).int().tolist()
        else:
            lengths = torch.randint(32, MAX_LEN + 1, (n,), generator=g).tolist()
        self.rows = [torch.randint(1, VOCAB, (k,), generator=g) for k in lengths]

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> torch.Tensor:
        return self.rows[i]


def collate(rows: list[torch.Tensor]) -> dict:
    longest = max(len(r) for r in rows)
    ids = torch.zeros((len(rows), longest), dtype=torch.long)
    mask = torch.zeros((len(rows), longest), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, : len(r)], mask[i, : len(r)] = r, 1
    return {"input_ids": ids, "attention_mask": mask, "labels": ids.masked_fill(mask == 0, -100)}


class CausalLM(LightningModule):
    def __init__(self, lr: float = 3e-4) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.tok, self.pos = nn.Embedding(VOCAB, 256), nn.Embedding(MAX_LEN, 256)
        self.blocks = nn.ModuleList([Block(256, 4) for _ in range(4)])
        self.ln, self.head = nn.LayerNorm(256), nn.Linear(256, VOCAB)
        self.throughput_unit = "tokens"

    def items_per_batch(self, batch) -> torch.Tensor:
        return batch["attention_mask"].sum()  # real tokens, never padding

    def training_step(self, batch, batch_idx):
        ids = batch["input_ids"]
        x = self.tok(ids) + self.pos(torch.arange(ids.size(1), device=ids.device))
        for blk in self.blocks:
            x = blk(x)
        logits = self.head(self.ln(x))[:, :-1]
        loss = F.cross_entropy(logits.reshape(-1, VOCAB), batch["labels"][:, 1:].reshape(-1), ignore_index=-100)
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=self.hparams.lr)


def make(batch_size: int = 32, n: int = 32 * 200, seed: int = 0, long_tail: bool = False):
    torch.manual_seed(seed)
    return CausalLM(), DataLoader(
        Rows(n, seed, long_tail),
        batch_size=batch_size,
        shuffle=True,
        collate_fn=collate,
        generator=torch.Generator().manual_seed(seed),
    )


def make_long_tail(batch_size: int = 32, n: int = 32 * 200, seed: int = 0):
    """Rows of 16 + an exponential of mean 40 tokens (cut at 256): a batch's longest row spans
    about 90-256, so pad_buckets makes several buckets (compile per bucket or dynamic sizes)."""
    return make(batch_size, n, seed, long_tail=True)
