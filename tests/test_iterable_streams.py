"""Loaders over an IterableDataset (a stream): rebuilt without the sampler DataLoader refuses to
be given back, and given workers only when the stream is split between them (otherwise each
worker would yield the whole stream, every sample once per worker)."""

from __future__ import annotations

import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from fastloop.data import rebuild_loader
from fastloop.streams import splits_between_workers
from fastloop.speedups.base import Context, Skip
from fastloop.speedups.workers import Workers


class Whole(IterableDataset):
    """Every worker yields the whole stream (torch's docs' first example before the fix)."""

    def __iter__(self):
        return iter(torch.arange(64, dtype=torch.float32).view(32, 2))


class Split(IterableDataset):
    """Each worker yields its share, by get_worker_info."""

    def __iter__(self):
        info = get_worker_info()
        rows = torch.arange(64, dtype=torch.float32).view(32, 2)
        return iter(rows if info is None else rows[info.id::info.num_workers])


def _rows(loader) -> list[tuple[float, float]]:
    return sorted(tuple(r.tolist()) for b in loader for r in b)


def test_a_streams_loader_is_rebuilt_with_the_same_batches():
    loader = DataLoader(Whole(), batch_size=4)
    again = rebuild_loader(loader, pin_memory=False)
    assert [b.tolist() for b in again] == [b.tolist() for b in loader]
    assert rebuild_loader(loader, batch_size=8).batch_size == 8


def test_workers_are_refused_for_a_stream_that_every_worker_would_repeat():
    loader = DataLoader(Whole(), batch_size=4)
    why = splits_between_workers(loader)
    assert why and "two workers gave the same first batch" in why and "every sample N times" in why
    try:
        Workers(count=2).apply_loader(loader, Context(device=torch.device("cpu")))
    except Skip as skip:
        assert "does not split its stream between workers" in str(skip)
    else:
        raise AssertionError("workers applied to a stream each worker repeats")
    # what the refusal prevents: two workers give every sample twice
    assert len(_rows(rebuild_loader(loader, num_workers=2))) == 2 * len(_rows(loader))


def test_a_stream_split_by_worker_takes_workers_and_sees_each_sample_once():
    loader = DataLoader(Split(), batch_size=4)
    assert splits_between_workers(loader) is None
    fast = Workers(count=2).apply_loader(loader, Context(device=torch.device("cpu")))
    assert fast.num_workers == 2 and _rows(fast) == _rows(loader)


def test_a_worker_init_fn_counts_as_the_users_split():
    assert splits_between_workers(DataLoader(Whole(), batch_size=4, worker_init_fn=lambda i: None)) is None
