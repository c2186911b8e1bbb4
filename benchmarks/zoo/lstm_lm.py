"""A word-level LSTM language model as in PyTorch's word_language_model example, in Lightning:
embedding, 2-layer LSTM (650 units, dropout 0.5), tied decoder, SGD with gradient clipping on
the Trainer, sequences of 35 tokens, batch 64, in-memory token tensors."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

try:
    from lightning.pytorch import LightningModule
except ImportError:  # pragma: no cover
    from pytorch_lightning import LightningModule  # type: ignore[no-redef]


class LSTMLM(LightningModule):
    def __init__(self, vocab: int = 10_000, dim: int = 650, layers: int = 2, lr: float = 20.0) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.drop = nn.Dropout(0.5)
        self.embed = nn.Embedding(vocab, dim)
        self.rnn = nn.LSTM(dim, dim, layers, dropout=0.5, batch_first=True)
        self.decoder = nn.Linear(dim, vocab)
        self.decoder.weight = self.embed.weight  # tied

    def forward(self, x):
        out, _ = self.rnn(self.drop(self.embed(x)))
        return self.decoder(self.drop(out))

    def training_step(self, batch, batch_idx):
        x, y = batch
        logits = self(x)
        loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1))
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)


def _tokens(n: int, seq: int, vocab: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    t = torch.randint(0, vocab, (n, seq + 1), generator=g)
    return t[:, :-1].contiguous(), t[:, 1:].contiguous()


def make(batch_size: int = 64, seq: int = 35, vocab: int = 10_000, n: int = 64 * 300, seed: int = 0):
    torch.manual_seed(seed)
    data = DataLoader(
        TensorDataset(*_tokens(n, seq, vocab, seed)),
        batch_size=batch_size,
        shuffle=True,
        drop_last=True,
        generator=torch.Generator().manual_seed(seed),
    )
    return LSTMLM(vocab=vocab), data, {"gradient_clip_val": 0.25}


def expert(batch_size: int = 64, seq: int = 35, vocab: int = 10_000, n: int = 64 * 300, seed: int = 0):
    """By hand: the data on the GPU, bf16-mixed (cuDNN's LSTM in bf16), TF32, a foreach SGD.

    Not fused: Lightning refuses gradient clipping with an optimizer that unscales its gradients
    itself ("does not allow for gradient clipping"), and this module clips at 0.25. Not compiled:
    torch.compile does not trace ``nn.LSTM`` by default (``torch._dynamo.config.allow_rnn``), so
    compile's CUDA graphs would not cover it; capturing the step by hand is beyond this expert.
    """
    from benchmarks.zoo._expert import GpuData, tf32

    tf32()
    torch.manual_seed(seed)

    class Foreach(LSTMLM):
        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=self.hparams.lr, foreach=True)

    return (
        Foreach(vocab=vocab),
        GpuData(*_tokens(n, seq, vocab, seed), batch_size=batch_size, seed=seed),
        {"gradient_clip_val": 0.25, "precision": "bf16-mixed"},
    )
