"""Every rank keeps its share of the data with a feed speedup: under DDP on the CPU (gloo, 2
processes; ``tests/ddp_shares.py``) each rank trains on exactly its ``DistributedSampler``'s share
(Lightning's, or the plain loop's own), the two shares of an epoch are disjoint and together the
whole data set, and the next epoch reshuffles; the same on one process, where it can be checked in
a second; Lightning's FSDP (which needs CUDA) takes the same path to its sampler; DALI's reader
reads the sampler's shard.

The rule checked: ``DistributedSampler`` pads a data set whose size is not a multiple of the
world size by repeating its first indices, so that every rank gets ``ceil(N / world)``; the data
set here has 64 samples on 2 ranks, so each rank reads 32 distinct indices, the two sets are
disjoint and their union is all 64."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

from tests import ddp_shares

CASES = [
    f"{adapter}:{case}"
    for adapter in ("lightning", "loop")
    for case in ("prefetch", "gpu_resident", "gpu_resident_padded", "pad_buckets", "workers")
]
try:
    import nvidia.dali  # noqa: F401

    DALI = ["lightning:dali"]
except ImportError:
    DALI = []


def _expected(rank: int, epoch: int) -> list[int]:
    """What rank ``rank`` reads in ``epoch`` without any speedup: its DistributedSampler's order."""
    sampler = DistributedSampler(range(ddp_shares.N), num_replicas=2, rank=rank, shuffle=True, seed=ddp_shares.SEED)
    sampler.set_epoch(epoch)
    return list(sampler)


@pytest.fixture(scope="module")
def shares(tmp_path_factory) -> dict:
    """Every case, one after the other, in one pair of processes (starting them is most of the cost)."""
    out = tmp_path_factory.mktemp("shares")
    proc = subprocess.run(
        [sys.executable, str(Path(ddp_shares.__file__)), str(out), *CASES, *DALI],
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return {f.name.removesuffix(".json"): json.loads(f.read_text()) for f in out.glob("*.json")}


@pytest.mark.slow  # two-process DDP fits (the shared fixture): .ci/run's second step
@pytest.mark.parametrize("case", CASES)
def test_each_rank_trains_on_its_share_and_the_next_epoch_reshuffles(shares, case):
    adapter, name = case.split(":")
    ranks = [shares.get(f"{adapter}-{name}.rank{r}") for r in (0, 1)]
    assert all(ranks), f"{case}: a rank wrote nothing ({sorted(shares)})"
    for doc in ranks:
        (record,) = doc["records"]
        assert record[1] == "applied", record  # the feed trained, not the loader without it
        if name == "prefetch":
            assert doc["mode"] == "background thread"  # the feed's thread ran
    for epoch in ("0", "1"):
        seen = [doc["epochs"][epoch] for doc in ranks]
        assert [len(s) for s in seen] == [32, 32], f"{case}, epoch {epoch}: {[len(s) for s in seen]} samples per rank"
        assert not set(seen[0]) & set(seen[1]) and set(seen[0]) | set(seen[1]) == set(range(ddp_shares.N))
        for rank, s in enumerate(seen):
            assert s == _expected(rank, int(epoch)), f"{case}, rank {rank}, epoch {epoch}: not its sampler's order"
    assert all(doc["epochs"]["1"] != doc["epochs"]["0"] for doc in ranks)  # set_epoch reshuffled


@pytest.mark.slow  # two-process DDP fits (the shared fixture): .ci/run's second step
@pytest.mark.skipif(not DALI, reason="NVIDIA DALI is not installed")
def test_dali_under_lightning_ddp_reads_each_ranks_shard_of_the_folder(shares):
    """DALI replaces the loader, so Lightning adds no sampler to it: the callbacks hand it the
    loader with Lightning's DistributedSampler, whose rank and replica count its reader shards by.
    The 21 files: 10 on one rank and 11 on the other, every file once an epoch, the shorter shard
    filled with a repeat so both ranks take 6 steps; the next epoch in another order."""
    ranks = [shares.get(f"lightning-dali.rank{r}") for r in (0, 1)]
    assert all(ranks), sorted(shares)
    for doc in ranks:
        (record,) = doc["records"]
        assert record[1] == "applied", record
    for epoch in ("0", "1"):
        seen = [doc["epochs"][epoch] for doc in ranks]
        assert [len(s) for s in seen] == [12, 12]  # 6 steps of 2 on each rank
        assert sorted(len(set(s)) for s in seen) == [10, 11] and not set(seen[0]) & set(seen[1])
        assert len(set(seen[0]) | set(seen[1])) == ddp_shares.FILES
    assert all(doc["epochs"]["1"] != doc["epochs"]["0"] for doc in ranks)


def _loader_with_a_share(rank: int = 0) -> DataLoader:
    data = TensorDataset(torch.randn(ddp_shares.N, 16), torch.zeros(ddp_shares.N, dtype=torch.long))
    sampler = DistributedSampler(data, num_replicas=2, rank=rank, shuffle=True, seed=ddp_shares.SEED)
    return DataLoader(data, batch_size=ddp_shares.BATCH, sampler=sampler)


@pytest.mark.parametrize("speedups", ["none", "prefetch", "gpu_resident", "workers:2"])
def test_the_plain_loop_tells_the_sampler_each_epoch(speedups, monkeypatch):
    """FastLoop owns the epochs: a DistributedSampler is told each one (as a DDP loop does by
    hand), through any feed, so the second epoch is its second order, not the first again."""
    from fastloop.loop import FastLoop

    for name in ("prefetch", "gpu_resident"):  # CUDA-only: on this CPU, let them apply
        monkeypatch.setattr(ddp_shares.REGISTRY[name], "why_not", lambda self, ctx: None)
    order: list[int] = []
    loader = _loader_with_a_share()
    rows = {tuple(x.tolist()): i for i, x in enumerate(loader.dataset.tensors[0])}

    def step(model, batch):
        if model.training:
            order.extend(rows[tuple(x.tolist())] for x in batch[0])
        return model(batch[0]).square().mean()

    model = torch.nn.Linear(16, 4)
    loop = FastLoop(model, torch.optim.SGD(model.parameters(), lr=0.0), loader, step_fn=step, speedups=speedups)
    assert all(r.status == "applied" for r in loop.records), loop.records
    loop.train(steps=8)  # two epochs of 4 batches
    assert order[:32] == _expected(0, 0) and order[32:] == _expected(0, 1)


def test_lightning_gives_a_feed_the_loader_with_its_distributed_sampler_under_ddp_and_fsdp():
    """The Lightning adapter hands a speedup the training loader as Lightning prepares it (a copy
    with the strategy's DistributedSampler), before any feed hides it from Lightning. FSDP needs
    CUDA, so its strategy is put in a DDP Trainer's place: the same preparation reads the same
    ``distributed_sampler_kwargs`` (num_replicas, rank) from it."""
    from lightning.fabric.plugins.environments import LightningEnvironment

    from fastloop._compat import FSDPStrategy, Trainer
    from fastloop.adapters._lightning_private import set_train_source
    from fastloop.adapters.lightning_run import LightningRun
    from fastloop.speedups.base import Context
    from tests.targets import tiny_mlp

    module, loader = tiny_mlp()
    for strategy in ("ddp", "fsdp"):
        trainer = Trainer(accelerator="cpu", devices=2, strategy="ddp", logger=False)
        if strategy == "fsdp":
            env = LightningEnvironment()
            env.set_world_size(2)
            env.set_global_rank(1)
            fsdp = FSDPStrategy(parallel_devices=[torch.device("cpu")] * 2, cluster_environment=env)
            trainer._accelerator_connector.strategy = fsdp
        set_train_source(trainer, loader)
        given: list = []
        LightningRun(trainer, module, Context(torch.device("cpu")), lambda *a: None).change_loader(
            lambda dl, given=given: given.append(dl) or dl
        )
        (dl,) = given
        rank = 1 if strategy == "fsdp" else 0
        assert isinstance(dl.sampler, DistributedSampler), (strategy, type(dl.sampler))
        assert (dl.sampler.num_replicas, dl.sampler.rank, dl.sampler.shuffle) == (2, rank, True), strategy
        assert len(dl) == len(loader) // 2 and loader.sampler is not dl.sampler  # the user's loader untouched


def test_dali_reads_the_samplers_shard():
    """DALI's reader takes its shard, the number of shards and shuffling from the loader's
    DistributedSampler (tests/test_dali_folder.py reads the files on DALI's CPU backend); a
    RandomSampler's loader reads every file on each rank; a sampler of one's own is refused."""
    from torch.utils.data import RandomSampler, WeightedRandomSampler

    from fastloop.speedups.dali.folder import NotTranslated, ReaderShard, reader_shard

    shares = [reader_shard(DistributedSampler(range(21), num_replicas=2, rank=r, shuffle=r == 0)) for r in (0, 1)]
    assert shares == [ReaderShard(0, 2, True), ReaderShard(1, 2, False)]
    assert reader_shard(RandomSampler(range(21))) == ReaderShard(0, 1, True)
    with pytest.raises(NotTranslated, match="WeightedRandomSampler"):
        reader_shard(WeightedRandomSampler([1.0] * 4, 4))
    from lightning.fabric.utilities.distributed import DistributedSamplerWrapper

    wrapped = DistributedSamplerWrapper(WeightedRandomSampler([1.0] * 4, 4), num_replicas=2, rank=0)
    with pytest.raises(NotTranslated, match="DistributedSamplerWrapper"):  # its order is not DALI's to copy
        reader_shard(wrapped)
