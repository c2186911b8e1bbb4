"""The host's time getting batches is the loader's and the copy's, not Lightning's work between steps.

On the H200 the GPT recipe's compiled step spent 6.5% of its host time between
``on_train_batch_end`` and the next ``on_train_batch_start``, so the ladder measured three feed
rungs (93 s) that could not help. With ``FeedClock`` as the Trainer's profiler, only the loader's
``next`` and ``batch_to_device`` count.
"""

from __future__ import annotations

import time

import torch
from torch.utils.data import DataLoader, Dataset

from fastloop._compat import LightningModule, Trainer
from fastloop.measure.callback import FeedClock, MeasureCallback


class _SlowDataset(Dataset):
    def __init__(self, delay_s: float) -> None:
        self.delay_s = delay_s

    def __len__(self) -> int:
        return 10_000

    def __getitem__(self, i: int):
        if self.delay_s:
            time.sleep(self.delay_s)
        return torch.ones(4), torch.zeros(1)


class _Busy(LightningModule):
    """A module whose own hook after each batch takes ``between_s``: Lightning's work between
    steps, as far as the callbacks' marks can tell."""

    def __init__(self, between_s: float) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)
        self.between_s = between_s

    def training_step(self, batch, batch_idx):
        x, y = batch
        return ((self.layer(x) - y) ** 2).mean()

    def on_train_batch_end(self, outputs, batch, batch_idx) -> None:
        time.sleep(self.between_s)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def _fit(delay_s: float, between_s: float, clock: bool) -> MeasureCallback:
    measure = MeasureCallback(warmup=2, count_flops=False, steady=False, steps=12)
    trainer = Trainer(
        accelerator="cpu",
        max_steps=-1,
        max_epochs=-1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[measure],
        **({"profiler": FeedClock()} if clock else {}),
    )
    trainer.fit(_Busy(between_s), train_dataloaders=DataLoader(_SlowDataset(delay_s), batch_size=2))
    return measure


def test_lightning_work_between_steps_is_not_data_wait_with_the_feed_clock():
    with_clock = _fit(delay_s=0.0, between_s=0.02, clock=True).result()
    without = _fit(delay_s=0.0, between_s=0.02, clock=False).result()
    # the hook's 20 ms sits between the marks: without the clock it reads as data wait
    assert without.data_wait_frac > 0.5
    assert with_clock.data_wait_frac < 0.1
    assert with_clock.host_wait_frac == with_clock.data_wait_frac  # CPU: one clock


def test_a_slow_loader_still_counts_as_data_wait_with_the_feed_clock():
    stats = _fit(delay_s=0.005, between_s=0.0, clock=True).result()  # 2 samples x 5 ms in next()
    assert stats.data_wait_frac > 0.5
    assert all(w >= 0.009 for w in stats.wait_s)


def test_feed_clock_ignores_other_actions_and_adds_up_the_two():
    clock = FeedClock()
    clock.start("[_TrainingEpochLoop].train_dataloader_next")
    time.sleep(0.01)
    clock.stop("[_TrainingEpochLoop].train_dataloader_next")
    clock.start("[Strategy]SingleDeviceStrategy.batch_to_device")
    time.sleep(0.01)
    clock.stop("[Strategy]SingleDeviceStrategy.batch_to_device")
    clock.start("[Callback]X.on_train_batch_end")
    time.sleep(0.02)
    clock.stop("[Callback]X.on_train_batch_end")
    got = clock.take()
    assert 0.019 <= got < 0.035
    assert clock.take() == 0.0
    clock.stop("[_TrainingEpochLoop].train_dataloader_next")  # a stop without a start: nothing
    assert clock.take() == 0.0


def test_the_feed_lines_give_the_pipelines_rate_and_the_hosts_time_a_batch():
    """A data-bound run: 32 items a step of 10 ms, 34% of it waiting for data, the batch taking 3.4
    ms of the host's time. The rate the feed must reach is the step's demand, and the rate said to
    be delivered is the pipeline's (not the loader's rate as if it ran alone, which can exceed it)."""
    from fastloop.drivers.doctor import diagnose
    from fastloop.drivers.ladder.wording import feed_line

    doc = {
        "step_s": {"mean": 0.010, "median": 0.010},
        "data_wait_frac": 0.34,
        "items_per_step": 32,
        "host_fetch_s": 0.0034,
        "host_copy_s": 0.0002,
        "peak_mem_bytes": None,
        "mfu": None,
    }
    line = feed_line(doc)
    assert line.startswith("the loader delivers ~3,200 items/s and the step alone would consume ~4,848/s")
    assert "getting a batch takes 3.40 ms of the host's time (the copy to the device 0.20 ms of it)" in line
    d = diagnose(doc)
    assert d["bottleneck"] == "data-bound"
    assert "the feed delivers 3,200 items/s (getting a batch takes 3.40 ms" in d["evidence"]
    assert "the feed must reach 4,848/s" in d["evidence"]
    doc.pop("host_fetch_s")
    assert "getting a batch" not in feed_line(doc)
