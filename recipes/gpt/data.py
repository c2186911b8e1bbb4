"""Token data for the GPT recipe: nanoGPT-style ``train.bin``/``val.bin`` (flat uint16 token
ids) read through a memory map with random windows, and an embedded default corpus.

The default downloads nothing: the Python standard library's own source files, byte-level
tokenized (vocab 256), written once into the same token-file format under a cache folder.
"""

from __future__ import annotations

import os
import sysconfig
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from fastloop._compat import LightningDataModule
from fastloop.errors import FastloopError

__all__ = ["TokenData", "TokenWindows", "default_corpus", "open_tokens"]


def default_corpus(cache_dir: str | os.PathLike | None = None, max_bytes: int = 8_000_000) -> Path:
    """Build (once) and return a folder with train.bin / val.bin from the stdlib's .py files."""
    cache = Path(cache_dir or os.environ.get("FASTLOOP_CACHE", Path.home() / ".cache" / "fastloop")) / "stdlib-bytes"
    if (cache / "train.bin").exists() and (cache / "val.bin").exists():
        return cache
    src = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in src.rglob("*.py") if "site-packages" not in p.parts and "test" not in p.parts)
    chunks, total = [], 0
    for p in files:
        try:
            b = p.read_bytes()
        except OSError:
            continue
        chunks.append(b)
        total += len(b)
        if total >= max_bytes:
            break
    if total < 100_000:
        raise FastloopError(f"the standard library at {src} has too little source to build the default corpus")
    data = np.frombuffer(b"".join(chunks), dtype=np.uint8).astype(np.uint16)
    split = int(len(data) * 0.95)
    cache.mkdir(parents=True, exist_ok=True)
    for name, part in (("train.bin", data[:split]), ("val.bin", data[split:])):
        tmp = cache / f".{name}.{os.getpid()}"
        part.tofile(tmp)
        os.replace(tmp, cache / name)  # atomic: concurrent builders never see half a file
    return cache


def open_tokens(path: str | os.PathLike, vocab_size: int, check: bool = True) -> np.memmap:
    """Memory-map a token file; clear errors for missing, ragged or out-of-vocabulary files."""
    p = Path(path)
    if not p.is_file():
        raise FastloopError(f"token file not found: {p}")
    size = p.stat().st_size
    if size % 2:
        raise FastloopError(f"{p} has {size} bytes, not a whole number of uint16 tokens (2 bytes each)")
    if size == 0:
        raise FastloopError(f"{p} is empty")
    data = np.memmap(p, dtype=np.uint16, mode="r")
    if check:
        top = int(data[:50_000_000].max())
        if top >= vocab_size:
            raise FastloopError(f"{p} holds token id {top}, outside the vocabulary (vocab_size={vocab_size})")
    return data


class TokenWindows(Dataset):
    """Random (x, y) windows of length T; y is x shifted by one token."""

    def __init__(self, data: np.ndarray, block_size: int, length: int, seed: int = 0) -> None:
        if len(data) <= block_size + 1:
            raise FastloopError(f"context length {block_size} is longer than the data ({len(data)} tokens)")
        self.data, self.T, self.length, self.seed = data, block_size, length, seed

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        # the window for item i is fixed by (seed, i): reproducible and resumable
        start = int(np.random.default_rng((self.seed, i)).integers(0, len(self.data) - self.T - 1))
        chunk = torch.from_numpy(self.data[start : start + self.T + 1].astype(np.int64))
        return chunk[:-1], chunk[1:]


class TokenData(LightningDataModule):
    """train/val windows from a folder with train.bin and val.bin (default: the stdlib corpus)."""

    def __init__(
        self,
        data_dir: str | None = None,
        block_size: int = 64,
        batch_size: int = 16,
        vocab_size: int = 256,
        num_workers: int = 0,
        train_windows: int = 1_000_000,
        val_windows: int = 64,
        seed: int = 0,
        pin_memory: bool | None = None,
    ) -> None:
        super().__init__()
        self.pin_memory = torch.cuda.is_available() if pin_memory is None else bool(pin_memory)
        if batch_size < 1:
            raise FastloopError(f"batch_size must be >= 1, got {batch_size}")
        self.data_dir = Path(data_dir) if data_dir else default_corpus()
        self.block_size, self.batch_size, self.vocab_size = block_size, batch_size, vocab_size
        self.num_workers, self.train_windows, self.val_windows, self.seed = (
            num_workers,
            train_windows,
            val_windows,
            seed,
        )
        self.train = TokenWindows(open_tokens(self.data_dir / "train.bin", vocab_size), block_size, train_windows, seed)
        self.val = TokenWindows(open_tokens(self.data_dir / "val.bin", vocab_size), block_size, val_windows, seed + 1)

        self.start = 0
        """Windows already consumed (restored from a checkpoint: resume continues the stream)."""

    def train_dataloader(self) -> DataLoader:
        # windows are a fixed function of their index, so the stream resumes exactly at `start`
        sampler = range(self.start % len(self.train), len(self.train))
        # pinned batches on a GPU machine: a copy from pageable memory waits for the GPU's queue to
        # drain (CUDA stages it synchronously), so the host's per-step work between steps becomes
        # GPU idle time (4% of a GPT-2 B16 step under Lightning on the H200)
        return DataLoader(
            self.train,
            batch_size=self.batch_size,
            sampler=sampler,
            num_workers=self.num_workers,
            drop_last=True,
            persistent_workers=self.num_workers > 0,
            pin_memory=self.pin_memory,
        )

    def state_dict(self) -> dict:
        steps = self.trainer.global_step if self.trainer is not None else 0
        return {"consumed": self.start + steps * self.batch_size}

    def load_state_dict(self, state: dict) -> None:
        self.start = int(state["consumed"])

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.val, batch_size=self.batch_size, shuffle=False)
