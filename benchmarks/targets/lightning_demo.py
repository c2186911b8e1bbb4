"""Lightning's own demo Transformer, unchanged, on random tokens.

``lightning.pytorch.demos.transformer.LightningTransformer`` as shipped; only its download-only
``prepare_data`` is turned off (nothing may be downloaded) and the WikiText2 loader is replaced
by random tokens of the same shape (block 35).
"""

from __future__ import annotations

import torch
from torch.utils.data import DataLoader, TensorDataset

try:
    from lightning.pytorch.demos.transformer import LightningTransformer
except ImportError:  # pragma: no cover - the GPU machine may ship pytorch_lightning only
    from pytorch_lightning.demos.transformer import LightningTransformer  # type: ignore[no-redef]


class DemoTransformer(LightningTransformer):
    def prepare_data(self) -> None:  # the demo's prepare_data only downloads WikiText2
        pass


def make(batch_size: int = 32, block: int = 35, vocab: int = 33278, n: int = 32 * 200, seed: int = 0):
    torch.manual_seed(seed)
    tokens = torch.randint(0, vocab, (n, block + 1))
    data = DataLoader(
        TensorDataset(tokens[:, :-1], tokens[:, 1:]),
        batch_size=batch_size,
        shuffle=True,
        drop_last=True,
        generator=torch.Generator().manual_seed(seed),
    )
    return DemoTransformer(vocab_size=vocab), data
