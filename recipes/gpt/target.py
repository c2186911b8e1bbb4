"""``fastloop run gpt``: the GPT recipe as a fastloop target.

Defaults: on CUDA, GPT-2 124M at T=1024, B=16 on the embedded byte corpus (vocab padded to
50304 so the model is GPT-2-sized); on CPU the tiny config. ``data_dir`` points at real
nanoGPT token files (train.bin / val.bin). With CUDA the weights are initialised on this
process's GPU (``init_device``): GPT-2 124M's CPU initialisation took 1.0-1.6 s of every fresh
process of a ladder on the H200, the GPU's takes milliseconds. The seed fixes the weights on each
device; CPU- and GPU-initialised weights differ.
"""

from __future__ import annotations

import os

import torch

from fastloop.recipes.gpt.data import TokenData
from fastloop.recipes.gpt.module import GPTModule

EXTRA_RUNGS = ["fp8", "fused_loss"]
"""Recipe-level speedups this recipe's default ladder adds to the generic rungs (tried once compile is in)."""
FIT_TRAINER = {"val_check_interval": 250}
"""``fastloop fit gpt``'s Trainer settings: validate every 250 steps (an epoch of the default corpus
is ~62,500 steps of B16, so Lightning's once-an-epoch would never come in a fit of minutes); the
whole held-out set (64 windows) each time. The measured runs of ``run``/``ladder``/``ab`` ignore it."""

__all__ = ["make"]


def make(
    preset: str | None = None,
    batch_size: int | None = None,
    data_dir: str | None = None,
    block_size: int | None = None,
    num_workers: int = 0,
    seed: int = 0,
    init_device: str | None = None,
):
    """``(GPTModule, TokenData)``; ``init_device``: where the weights are created and initialised
    (default: ``cuda:LOCAL_RANK`` when CUDA is available, else ``cpu``)."""
    if init_device is None:
        init_device = f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}" if torch.cuda.is_available() else "cpu"
    preset = preset or os.environ.get("FASTLOOP_GPT_PRESET") or ("gpt2" if torch.cuda.is_available() else "tiny")
    batch_size = batch_size or int(os.environ.get("FASTLOOP_GPT_BATCH", 16))
    torch.manual_seed(seed)
    with torch.device(init_device):
        module = GPTModule(preset=preset, batch_size=batch_size, **({"block_size": block_size} if block_size else {}))
    data = TokenData(
        data_dir,
        block_size=module.cfg.block_size,
        batch_size=batch_size,
        vocab_size=module.cfg.vocab_size,
        num_workers=num_workers,
        seed=seed,
    )
    return module, data
