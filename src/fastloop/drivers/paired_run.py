"""A paired run: one configuration trained so that another configuration's run can be compared
with it step by step (the check of a pick against the baseline, :mod:`fastloop.drivers.pick_check`).

Every generator is seeded before the target is built (torch with CUDA, numpy, random): two runs
of one target start from the same weights and, where the loader shuffles from the global
generator or its own seeded one, see the same batches in the same order; dropout draws the same
masks in eager code, and compiled code draws as eager does
(:func:`~fastloop._torch_private.compiled_draws_as_eager`). The run records what proves the
pairing, for the check to read: the digest of the weights before any speedup touched them, of
each step's batch as the step receives it, and how the dataset's reads vary
(:func:`~fastloop.data.dataset_reads`).

Example:
    >>> seed_everything(3); a = torch.rand(2)
    >>> seed_everything(3); bool(torch.equal(a, torch.rand(2)))
    True
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch

from fastloop._compat import Callback, LightningModule, Trainer
from fastloop._torch_private import compiled_draws_as_eager
from fastloop.data import dataset_reads, map_tensors
from fastloop.drivers.run_document import tensors_digest, weights_digest

__all__ = ["DIGEST_CHARS", "PairedRun", "batch_digest", "seed_everything"]

DIGEST_CHARS = 16
"""Hex characters kept of each batch's digest (64 bits: two different batches collide with
probability 2^-64)."""


def seed_everything(seed: int) -> None:
    """Seed torch (every device), numpy and Python's ``random`` with ``seed``."""
    torch.manual_seed(seed)
    np.random.seed(seed)
    random.seed(seed)


def batch_digest(batch: Any) -> str:
    """The digest of a batch's tensors, in order, with their shapes, dtypes and bits (its other
    leaves, such as strings, are not in it).

    Example:
        >>> x = torch.arange(6.0).view(2, 3)
        >>> batch_digest((x, torch.tensor([0, 1]))) == batch_digest((x.clone(), torch.tensor([0, 1])))
        True
        >>> batch_digest((x, torch.tensor([0, 1]))) == batch_digest((x, torch.tensor([1, 0])))
        False
    """
    found: list[tuple[str, torch.Tensor]] = []

    def keep(t: torch.Tensor) -> torch.Tensor:
        found.append((str(len(found)), t))
        return t

    map_tensors(keep, batch)
    return tensors_digest(found)[:DIGEST_CHARS]


class PairedRun(Callback):
    """Seeds the run's generators and records what the check compares besides the losses.

    Put first in the Trainer's callbacks: its ``setup`` reads the weights before a speedup's
    callback changes anything. ``seed_now()`` is called before the target is built."""

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self.initial_digest: str | None = None
        self.batch_digests: list[str] = []
        self.reads: str | None = None

    def seed_now(self) -> None:
        """Before the target is built: every generator seeded, compiled code drawing as eager."""
        seed_everything(self.seed)
        compiled_draws_as_eager()

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        if stage == "fit" and self.initial_digest is None:
            self.initial_digest = weights_digest(pl_module)

    def on_train_batch_start(self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int) -> None:
        self.batch_digests.append(batch_digest(batch))

    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        loader = getattr(trainer, "train_dataloader", None)
        self.reads = dataset_reads(getattr(loader, "dataset", None))

    def result(self) -> dict:
        """The run document's ``"paired"`` section."""
        return {
            "seed": self.seed,
            "initial_weights_digest": self.initial_digest,
            "batch_digests": list(self.batch_digests),
            "dataset_reads": self.reads,
        }
