"""Lightning's own demo Transformer (``lightning.pytorch.demos.transformer``), unchanged, on
random tokens of WikiText2's shape (block 35, vocab 33,278); only its download-only
``prepare_data`` is turned off (nothing may be downloaded), batch 64."""

from __future__ import annotations

import torch
from torch.utils.data import DataLoader, TensorDataset

try:
    from lightning.pytorch.demos.transformer import LightningTransformer
except ImportError:  # pragma: no cover
    from pytorch_lightning.demos.transformer import LightningTransformer  # type: ignore[no-redef]


class DemoTransformer(LightningTransformer):
    def prepare_data(self) -> None:  # the demo's prepare_data only downloads WikiText2
        pass


def _tokens(n: int, block: int, vocab: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    t = torch.randint(0, vocab, (n, block + 1), generator=g)
    return t[:, :-1].contiguous(), t[:, 1:].contiguous()


def make(batch_size: int = 64, block: int = 35, vocab: int = 33278, n: int = 64 * 200, seed: int = 0):
    torch.manual_seed(seed)
    x, y = _tokens(n, block, vocab, seed)
    data = DataLoader(
        TensorDataset(x, y),
        batch_size=batch_size,
        shuffle=True,
        drop_last=True,
        generator=torch.Generator().manual_seed(seed),
    )
    return DemoTransformer(vocab_size=vocab), data


def expert(batch_size: int = 64, block: int = 35, vocab: int = 33278, n: int = 64 * 200, seed: int = 0):
    """By hand: the data on the GPU, bf16-mixed, TF32, compile (default mode)."""
    from benchmarks.zoo._expert import GpuData, tf32

    tf32()
    torch.manual_seed(seed)
    module = DemoTransformer(vocab_size=vocab)
    module.model.compile()
    return (
        module,
        GpuData(*_tokens(n, block, vocab, seed), batch_size=batch_size, seed=seed),
        {"precision": "bf16-mixed"},
    )
