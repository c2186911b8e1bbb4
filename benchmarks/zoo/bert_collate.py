"""A BERT-style classifier as issue 64's held-out check had it: a custom ``collate_fn`` that pads
each batch of token ids to its own longest row and makes the attention mask (rows of 100-128
tokens, so most batches of 64 reach 128), ``num_workers=0`` as the user wrote it, the loss logged
with ``prog_bar=True`` (Lightning reads it to the host after every step), AdamW with a warm-up,
gradient clipping on the Trainer; in-memory token rows."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader

from benchmarks.zoo.bert_padded import BertClassifier, Rows, collate, collate_fixed  # the same model and padding

SHORTEST = 100  # most batches of 64 rows of 100-128 tokens reach 128


class Classifier(BertClassifier):
    """bert_padded's classifier, its loss logged with ``prog_bar=True``."""

    def training_step(self, batch, batch_idx):
        loss = F.cross_entropy(self(batch["input_ids"], batch["attention_mask"]), batch["labels"])
        self.log("train_loss", loss, prog_bar=True)
        return loss


def make(batch_size: int = 64, n: int = 64 * 150, seed: int = 0):
    torch.manual_seed(seed)
    loader = DataLoader(
        Rows(n, seed, SHORTEST),
        batch_size=batch_size,
        shuffle=True,
        collate_fn=collate,
        num_workers=0,
        generator=torch.Generator().manual_seed(seed),
    )
    return Classifier(), loader, {"gradient_clip_val": 1.0}


def expert(batch_size: int = 64, n: int = 64 * 150, seed: int = 0):
    """By hand: every batch padded to 128, bf16-mixed, TF32 and ``torch.compile(mode="reduce-overhead")``
    on the encoder (compile's CUDA graphs, each step marked)."""
    from benchmarks.zoo._expert import MarkStep, tf32

    tf32()
    torch.manual_seed(seed)
    module = Classifier()
    module.encoder.compile(mode="reduce-overhead")
    loader = DataLoader(
        Rows(n, seed, SHORTEST),
        batch_size=batch_size,
        shuffle=True,
        collate_fn=collate_fixed,
        generator=torch.Generator().manual_seed(seed),
    )
    return module, loader, {"gradient_clip_val": 1.0, "precision": "bf16-mixed", "callbacks": [MarkStep()]}
