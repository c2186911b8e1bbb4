import os

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from fastloop import FastloopError
from fastloop._compat import LightningDataModule, LightningModule, Trainer
from fastloop.lightning import BatchSizeSearch
from fastloop.speedups.batch_size import is_oom, search_batch_size


class OOMAbove(LightningModule):
    """Raises a real-looking CUDA OOM when the batch is larger than ``limit``."""

    def __init__(self, limit: int = 300, batch_size: int = 16, error: str = "oom") -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = torch.nn.Linear(8, 2)
        self.limit, self.batch_size, self.error = limit, batch_size, error
        self.seen: list[int] = []

    def training_step(self, batch, i):
        x, y = batch
        self.seen.append(len(x))
        if len(x) > self.limit:
            if self.error == "oom":
                raise torch.cuda.OutOfMemoryError(
                    "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.11 GiB "
                    "of which 1.2 GiB is free. Including non-PyTorch memory, this process has 77.9 GiB memory in use."
                )
            raise ValueError("shape mismatch in layer 3: expected 8 features")
        return torch.nn.functional.cross_entropy(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-2)


class Data(LightningDataModule):
    def __init__(self, batch_size: int = 16, n: int = 5000) -> None:
        super().__init__()
        self.batch_size = batch_size
        g = torch.Generator().manual_seed(0)
        self.ds = TensorDataset(torch.randn(n, 8, generator=g), torch.randint(0, 2, (n,), generator=g))

    def train_dataloader(self):
        return DataLoader(self.ds, batch_size=self.batch_size, shuffle=True)


def test_recognises_oom_and_only_oom():
    assert is_oom(torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 20 MiB"))
    assert is_oom(RuntimeError("cuDNN error: CUDNN_STATUS_ALLOC_FAILED"))
    assert is_oom(
        RuntimeError(
            "[enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: can't allocate memory: "
            "you tried to allocate 1 bytes"
        )
    )
    assert not is_oom(RuntimeError("Expected all tensors to be on the same device"))
    assert not is_oom(ValueError("out of memory"))  # only allocator errors, not any exception mentioning it


def test_finds_the_limit_in_at_most_10_trials_and_keeps_margin():
    torch.manual_seed(0)
    m, d = OOMAbove(limit=300), Data()
    w_before = {k: v.clone() for k, v in m.state_dict().items()}
    rng_before = torch.get_rng_state()
    doc = search_batch_size(m, d, device="cpu", objective="max", margin=0.9)
    assert len(doc["trials"]) <= 10, doc["trials"]
    assert 0.95 * 300 <= doc["max_fitting"] <= 300
    assert doc["batch_size"] == int(0.9 * doc["max_fitting"])
    # written everywhere Lightning's BatchSizeFinder writes: module attribute, hparams, DataModule
    assert d.batch_size == m.batch_size == m.hparams.batch_size == doc["batch_size"]
    assert doc["written_to"] == "OOMAbove.batch_size, LightningModule.hparams.batch_size, Data.batch_size"
    assert doc["restored"] is True
    assert all(torch.equal(v, m.state_dict()[k]) for k, v in w_before.items())
    assert torch.equal(rng_before, torch.get_rng_state())
    assert all(m.net.weight.grad is None for _ in [0])


def test_throughput_objective_stays_under_the_margin():
    m, d = OOMAbove(limit=300), Data()
    doc = search_batch_size(m, d, device="cpu", objective="throughput", margin=0.9)
    assert doc["batch_size"] <= 0.9 * doc["max_fitting"]
    assert any(t["batch_size"] == doc["batch_size"] and t["ok"] for t in doc["trials"])


def test_non_oom_error_propagates_unchanged():
    m, d = OOMAbove(limit=100, error="value"), Data()
    with pytest.raises(ValueError, match="^shape mismatch in layer 3: expected 8 features$"):
        search_batch_size(m, d, device="cpu")


def test_batch_size_one_fails_clearly():
    m, d = OOMAbove(limit=0, batch_size=1), Data(batch_size=1)
    with pytest.raises(FastloopError, match="batch size 1 does not fit in memory"):
        search_batch_size(m, d, device="cpu")


def test_no_temporary_files(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    search_batch_size(OOMAbove(limit=64), Data(), device="cpu")
    assert list(tmp_path.iterdir()) == []


def test_lightning_callback_leaves_trainer_state_alone():
    m, d = OOMAbove(limit=200), Data()
    cb = BatchSizeSearch(objective="max")
    trainer = Trainer(
        max_steps=3,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[cb],
    )
    trainer.fit(m, datamodule=d)
    assert cb.result["restored"] and cb.result["batch_size"] == d.batch_size <= 180
    assert m.seen[-1] == d.batch_size  # the real run trained at the chosen size
    assert trainer.global_step == 3


def test_callback_validates_arguments():
    with pytest.raises(ValueError, match="objective"):
        BatchSizeSearch(objective="fastest")
    with pytest.raises(ValueError, match="margin"):
        BatchSizeSearch(margin=1.5)


def _ddp_worker(rank: int, world: int, port: int, out: str) -> None:
    import json

    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(0)
    # only rank 1 runs out of memory (above 100); rank 0 would fit 400
    m, d = OOMAbove(limit=100 if rank == 1 else 400), Data()
    doc = search_batch_size(m, d, device="cpu", objective="max")
    with open(f"{out}.{rank}", "w") as f:
        json.dump({"batch_size": doc["batch_size"], "max_fitting": doc["max_fitting"]}, f)
    dist.destroy_process_group()


def test_ddp_one_rank_oom_both_back_off(tmp_path):
    import json
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = str(tmp_path / "r")
    ctx = mp.start_processes(_ddp_worker, args=(2, port, out), nprocs=2, join=False, start_method="spawn")
    import time

    deadline = time.time() + 120
    while not ctx.join(timeout=5):
        assert time.time() < deadline, "DDP batch-size search hung"
    a, b = (json.loads(open(f"{out}.{r}").read()) for r in (0, 1))
    assert a == b
    assert a["max_fitting"] <= 100


def test_run_with_batch_size_trains_at_the_found_size_from_a_plain_loader():
    from fastloop.drivers.runner import run_configuration

    doc = run_configuration("tests/targets.py:tiny_mlp", "batch_size", steps=3, warmup=1, device="cpu")
    found = doc["extra"]["batch_size_search"]["batch_size"]
    assert found != 16 and doc["items_per_step"] == found  # tiny_mlp's loader was built with 16
    assert doc["speedups"][-1]["name"] == "batch_size" and doc["speedups"][-1]["status"] == "applied"


class SeesAutocast(OOMAbove):
    """Records the dtype each trial step autocasts to (None: none)."""

    def training_step(self, batch, i):
        on = torch.is_autocast_enabled("cpu")
        self.dtypes = getattr(self, "dtypes", []) + [torch.get_autocast_dtype("cpu") if on else None]
        return super().training_step(batch, i)


def test_the_trials_train_in_the_trainers_precision():
    """The user's Trainer says bf16-mixed: its steps autocast, so the search's trials do too (their
    memory is the training's); with no precision given they run as they are."""
    for given, want in ((None, None), ("bf16-mixed", torch.bfloat16), ("32-true", None)):
        module = SeesAutocast(limit=64)
        doc = search_batch_size(module, Data(), device="cpu", max_size=256, trainer_precision=given)
        assert set(module.dtypes) == {want} and doc["autocast"] == (str(want)[6:] if want else None)
    module = SeesAutocast(limit=64)  # the callback reads the Trainer's own precision
    trainer = Trainer(
        callbacks=[BatchSizeSearch(max_size=256)],
        precision="bf16-mixed",
        max_steps=1,
        logger=False,
        accelerator="cpu",
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(module, Data())
    assert torch.bfloat16 in module.dtypes and trainer.callbacks[0].result["autocast"] == "bfloat16"
