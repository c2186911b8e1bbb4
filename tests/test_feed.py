"""The background feed (fastloop/feed.py, what ``prefetch`` wraps the loader in): the loader's own
batches in its order across epochs, built on the thread (or, for a loader that draws on the
host's generators, on the calling thread, with the reason); a collate error raised as the
user's, with their line; no thread left after an epoch, a ``break``, an error or Ctrl-C."""

from __future__ import annotations

import sys
import threading
import traceback

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from fastloop.feed import SWITCH_INTERVAL_S, BackgroundFeed, live_feed_threads
from fastloop.loop import FastLoop


class Rows(Dataset):
    """Token rows of 3-9 tokens, as text datasets hold them (padded by the collate)."""

    def __init__(self, n: int = 40, noisy: bool = False) -> None:
        g = torch.Generator().manual_seed(0)
        self.rows = [torch.randint(1, 50, (int(k),), generator=g) for k in torch.randint(3, 10, (n,), generator=g)]
        self.noisy = noisy

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> dict:
        row = self.rows[i]
        if self.noisy:  # a random transform drawn from torch's global generator
            row = row + torch.randint(0, 2, row.shape)
        return {"ids": row, "label": int(row[0]) % 2}


BUILT_ON: list[str] = []


def pad_collate(samples: list[dict]) -> dict:
    """Pad to the batch's longest row, as DataCollatorWithPadding does."""
    BUILT_ON.append(threading.current_thread().name)
    longest = max(len(s["ids"]) for s in samples)
    ids = torch.zeros(len(samples), longest, dtype=torch.long)
    for i, s in enumerate(samples):
        ids[i, : len(s["ids"])] = s["ids"]
    return {"ids": ids, "mask": ids != 0, "label": torch.tensor([s["label"] for s in samples])}


def _epochs(loader, n: int = 2) -> list[list[torch.Tensor]]:
    torch.manual_seed(7)
    out = []
    for _ in range(n):
        epoch = []
        for b in loader:
            epoch.append(torch.cat([b["ids"].flatten(), b["label"]]))
            torch.rand(1)  # the step's own draws on the host (a CPU dropout)
        out.append(epoch)
    return out


def _same(a, b) -> bool:
    return len(a) == len(b) and all(
        len(x) == len(y) and all(torch.equal(p, q) for p, q in zip(x, y)) for x, y in zip(a, b)
    )


@pytest.mark.parametrize("workers", [0, 2])
def test_the_feed_yields_the_loaders_batches_in_its_order_across_two_epochs(workers):
    def make():
        return DataLoader(Rows(), batch_size=6, shuffle=True, collate_fn=pad_collate, num_workers=workers)

    alone = _epochs(make())
    BUILT_ON.clear()
    feed = BackgroundFeed(make(), "cpu")
    fed = _epochs(feed)
    assert _same(alone, fed)
    assert feed.mode == "background thread" and feed.why_not_threaded is None
    if workers == 0:  # the epoch's first two batches here, the rest on the feed's thread
        assert BUILT_ON.count("fastloop-feed") == 2 * (len(alone[0]) - 2), BUILT_ON
    assert live_feed_threads() == []


def test_a_loader_that_draws_on_the_host_is_read_on_the_calling_thread_with_the_reason():
    def make():
        return DataLoader(Rows(noisy=True), batch_size=6, shuffle=True, collate_fn=pad_collate)

    alone = _epochs(make())
    BUILT_ON.clear()
    feed = BackgroundFeed(make(), "cpu")
    assert _same(alone, _epochs(feed))
    assert feed.mode == "calling thread" and "torch's CPU generator" in feed.why_not_threaded
    assert "fastloop-feed" not in BUILT_ON


def bad_collate(samples: list[dict]) -> dict:
    if len(BUILT_ON) >= 3:
        raise ValueError("row 5 has no label")  # the user's line
    BUILT_ON.append("ok")
    return pad_collate(samples)


def test_a_collate_that_raises_surfaces_as_the_users_error_with_its_line():
    BUILT_ON.clear()
    feed = BackgroundFeed(DataLoader(Rows(), batch_size=4, collate_fn=bad_collate), "cpu")
    with pytest.raises(ValueError, match="row 5 has no label") as info:
        list(feed)
    frames = traceback.extract_tb(info.value.__traceback__)
    assert any(f.name == "bad_collate" and f.filename == __file__ and "raise ValueError" in f.line for f in frames)
    assert live_feed_threads() == []


def test_ctrl_c_during_a_run_or_a_break_leaves_no_feed_thread_and_the_switch_interval_is_put_back():
    before = sys.getswitchinterval()
    model = torch.nn.Embedding(64, 2)
    seen = []

    def step(m, batch):
        seen.append(sys.getswitchinterval())
        if len(seen) == 4:
            raise KeyboardInterrupt
        return m(batch["ids"]).mean()

    feed = BackgroundFeed(DataLoader(Rows(), batch_size=4, collate_fn=pad_collate), "cpu")
    loop = FastLoop(model, torch.optim.SGD(model.parameters(), lr=0.1), feed, step_fn=step, device="cpu")
    with pytest.raises(KeyboardInterrupt):
        loop.train(steps=20)
    assert live_feed_threads() == [] and sys.getswitchinterval() == before
    assert seen[-1] == pytest.approx(min(SWITCH_INTERVAL_S, before))  # lowered while the thread ran


def test_an_epoch_abandoned_after_the_thread_started_leaves_no_thread():
    """A ``break`` (or a step that raises) after the feed's thread has begun building batches: the
    thread, blocked on its full queue, sees the stop and ends; the switch interval is put back."""
    before = sys.getswitchinterval()
    feed = BackgroundFeed(DataLoader(Rows(), batch_size=4, collate_fn=pad_collate), "cpu")  # 10 batches
    for i, _ in enumerate(feed):
        if i == 4:  # the first two came from this thread, the rest from the feed's, 2 more queued ahead
            assert [t.name for t in live_feed_threads()] == ["fastloop-feed"]
            break
    assert live_feed_threads() == [] and sys.getswitchinterval() == before


class _FakeCuda:
    """Stands in for torch.cuda on a CPU: records, in order, each tensor pinned, each copy (and on
    which stream), each event recorded on the side stream, and each wait of the step's stream."""

    def __init__(self) -> None:
        self.log: list[tuple] = []
        self.on: list[str] = []  # the stream the calling code is on

    def install(self, monkeypatch) -> None:
        import contextlib

        import fastloop.feed as feed_module

        fake = self

        class Stream:
            def __init__(self, device=None, name="side") -> None:
                self.name = name

            def wait_event(self, event) -> None:
                fake.log.append(("wait", self.name, event.id))

        class Event:
            def __init__(self) -> None:
                self.id = len([e for e in fake.log if e[0] == "record"])

            def record(self, stream) -> None:
                fake.log.append(("record", stream.name, self.id))

        @contextlib.contextmanager
        def on_stream(stream):
            fake.on.append(stream.name)
            yield
            fake.on.pop()

        def pin(t):
            fake.log.append(("pin", id(t)))
            return t

        def copy(batch, device, non_blocking=False):
            fake.log.append(("copy", fake.on[-1] if fake.on else "step", non_blocking, id(batch["ids"])))
            return batch

        monkeypatch.setattr(torch.cuda, "Stream", Stream)
        monkeypatch.setattr(torch.cuda, "Event", Event)
        monkeypatch.setattr(torch.cuda, "device", lambda device: contextlib.nullcontext())
        monkeypatch.setattr(torch.cuda, "stream", on_stream)
        monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: Stream(name="step"))
        monkeypatch.setattr(torch.Tensor, "is_pinned", lambda t: False)
        monkeypatch.setattr(torch.Tensor, "pin_memory", pin)
        monkeypatch.setattr(feed_module, "to_device", copy)


def test_on_cuda_each_batch_is_pinned_copied_on_the_side_stream_and_waited_for_before_the_step(monkeypatch):
    """The CUDA path on a CPU, with torch.cuda faked: every tensor of a batch is pinned before the
    copy, the copy is asynchronous and queued on the side stream with an event recorded after it,
    and the step's stream waits for that event before the step gets the batch (its first two
    batches from this thread, the rest from the feed's)."""
    fake = _FakeCuda()
    fake.install(monkeypatch)
    steps = []
    for batch in BackgroundFeed(DataLoader(Rows(), batch_size=4, collate_fn=pad_collate), "cuda"):
        fake.log.append(("step", id(batch["ids"])))
        steps.append(len(fake.log) - 1)
    assert len(steps) == 10
    log = fake.log
    copies = [i for i, e in enumerate(log) if e[0] == "copy"]
    assert len(copies) == 10 and all(log[i][1:3] == ("side", True) for i in copies)
    for k, (copy, step) in enumerate(zip(copies, steps)):
        pinned = [i for i, e in enumerate(log[:copy]) if e[0] == "pin"]
        assert len(pinned) >= 3 * (k + 1)  # ids, mask, label: each pinned before its copy
        record = log.index(("record", "side", k))
        wait = log.index(("wait", "step", k))
        assert copy < record < wait < step, (k, copy, record, wait, step)  # the step after the wait on its copy
        assert log[step][1] == log[copy][3]  # the batch the step got is the one copied


@pytest.mark.gpu
def test_on_the_gpu_the_step_reads_each_batch_only_after_its_copy(monkeypatch):
    """A real device: each side-stream copy is held back (a 20 ms sleep queued before it), so a
    step that did not wait for the copy's event would read the batch's memory before it is
    written; every batch arrives on the device equal to the loader's, from pinned memory, its
    memory kept for the step's stream (record_stream)."""
    import fastloop.feed as feed_module

    pinned, recorded = [], []
    original_pin, original_record = torch.Tensor.pin_memory, torch.Tensor.record_stream
    monkeypatch.setattr(torch.Tensor, "pin_memory", lambda t: pinned.append(1) or original_pin(t))
    monkeypatch.setattr(torch.Tensor, "record_stream", lambda t, s: recorded.append(1) or original_record(t, s))
    to_device = feed_module.to_device

    def slow_copy(batch, device, non_blocking=False):
        torch.cuda._sleep(int(2e7))  # on the side stream: the copy lands ~20 ms after it is queued
        return to_device(batch, device, non_blocking=non_blocking)

    monkeypatch.setattr(feed_module, "to_device", slow_copy)
    data = torch.arange(12).repeat_interleave(1 << 20).view(12, 1 << 20).float()  # 4 MiB a sample
    loader = DataLoader(torch.utils.data.TensorDataset(data), batch_size=2)
    for k, (batch,) in enumerate(BackgroundFeed(loader, "cuda")):
        assert batch.is_cuda and bool((batch == data[2 * k : 2 * k + 2].cuda()).all()), k  # read on the step's stream
    assert k == 5 and len(pinned) == 6 and len(recorded) == 6
    assert live_feed_threads() == []
