"""Loaders users write that are not map-style-with-batch_size: over an IterableDataset (a stream),
rebuilt without the sampler DataLoader refuses to be given back, and given workers only when the
stream is split between them (otherwise each worker would yield the whole stream, every sample
once per worker); with ``batch_size=None`` (the dataset's items are batches), rebuilt with its
sampler and whole batches, and never given another batch size."""

from __future__ import annotations

import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from fastloop.data import rebuild_loader
from fastloop.speedups.base import Context, Skip
from fastloop.speedups.workers import Workers
from fastloop.streams import splits_between_workers


class Whole(IterableDataset):
    """Every worker yields the whole stream (torch's docs' first example before the fix)."""

    def __iter__(self):
        return iter(torch.arange(64, dtype=torch.float32).view(32, 2))


class Split(IterableDataset):
    """Each worker yields its share, by get_worker_info."""

    def __iter__(self):
        info = get_worker_info()
        rows = torch.arange(64, dtype=torch.float32).view(32, 2)
        return iter(rows if info is None else rows[info.id :: info.num_workers])


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


class _Batches(torch.utils.data.Dataset):
    """Each item is a whole batch (the loader has batch_size=None)."""

    def __len__(self):
        return 6

    def __getitem__(self, i):
        return torch.full((4, 2), float(i)), torch.full((4,), i)


def test_a_loader_that_does_not_batch_keeps_its_sampler_and_its_whole_batches():
    loader = DataLoader(_Batches(), batch_size=None, shuffle=True, generator=torch.Generator().manual_seed(3))
    again = rebuild_loader(loader, num_workers=2, persistent_workers=False)
    got = [x[:, 0].tolist() for x, _ in again]
    assert all(len(set(b)) == 1 and len(b) == 4 for b in got)  # whole batches, not batches of batches
    assert sorted(b[0] for b in got) == list(range(6)) and again.batch_size is None
    assert isinstance(again.sampler, torch.utils.data.RandomSampler)  # still shuffled


def test_batch_size_on_a_loader_that_does_not_batch_is_skipped_with_the_reason():
    from fastloop.errors import FastloopError
    from fastloop.speedups.batch_size.batch_size import BatchSize
    from tests.targets import tiny_mlp

    loader = DataLoader(_Batches(), batch_size=None)
    try:
        rebuild_loader(loader, batch_size=8)
    except FastloopError as err:
        assert "does not batch (batch_size=None" in str(err)
    else:
        raise AssertionError("a batch size was forced on a loader whose items are batches")
    module = tiny_mlp()[0]
    data, record, stats = BatchSize().prepare_run(module, loader, [], torch.device("cpu"))
    assert data is loader and record.status == "skipped" and "batch_size=None" in record.reason and stats == {}


def test_a_dict_of_training_loaders_gets_each_loader_changed_alike_and_trains_the_same():
    """train_dataloader returning {"a": loader, "b": loader} (Lightning combines them): workers
    rebuilds both (it fell back on 'a dict, not a DataLoader'), and the losses are the eager ones."""
    from fastloop._compat import LightningModule, Trainer
    from fastloop.lightning import callbacks, records_of

    class TwoTasks(LightningModule):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.trunk, self.head = torch.nn.Linear(4, 8), torch.nn.Linear(8, 1)
            self.losses, self.loaders = [], None

        def train_dataloader(self):
            g = torch.Generator().manual_seed(1)

            def make():
                return torch.utils.data.TensorDataset(torch.randn(64, 4, generator=g), torch.randn(64, 1, generator=g))

            return {
                "a": DataLoader(make(), batch_size=8, shuffle=True, generator=torch.Generator().manual_seed(2)),
                "b": DataLoader(make(), batch_size=8, shuffle=True, generator=torch.Generator().manual_seed(3)),
            }

        def training_step(self, batch, batch_idx):
            self.loaders = self.trainer.train_dataloader
            loss = sum(torch.nn.functional.mse_loss(self.head(self.trunk(x)), y) for x, y in batch.values())
            self.losses.append(float(loss))
            return loss

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    def fit(cbs):
        module = TwoTasks()
        trainer = Trainer(
            callbacks=cbs,
            max_steps=6,
            logger=False,
            accelerator="cpu",
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
        )
        trainer.fit(module)
        return module, trainer

    eager, _ = fit([])
    fast, trainer = fit(callbacks("workers:2"))
    (rec,) = records_of(trainer)
    assert rec.status == "applied", rec
    assert fast.losses == eager.losses and len(fast.losses) == 6
    loaders = fast.loaders.iterables if hasattr(fast.loaders, "iterables") else fast.loaders  # a CombinedLoader
    assert {k: v.num_workers for k, v in loaders.items()} == {"a": 2, "b": 2}


def test_throughput_counts_the_samples_of_every_combined_loader():
    from fastloop.drivers.runner import run_configuration

    doc = run_configuration(
        "tests/targets.py:two_loaders", "none", steps=4, warmup=1, device="cpu", steady_warmup=False
    )
    assert doc["items_per_step"] == 16  # 8 from each loader, not the first loader's 8 alone
