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
    for _ in feed:  # abandoned after one batch
        break
    assert live_feed_threads() == []
