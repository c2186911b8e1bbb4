"""Small targets written the ordinary Lightning way (not for fastloop), used by the tests."""

from __future__ import annotations

import time
from collections import UserDict

import torch
from torch.utils.data import DataLoader, Dataset, TensorDataset

from fastloop._compat import Callback, LightningDataModule, LightningModule


class Classifier(LightningModule):
    """An MLP or a small conv net with logging, a scheduler and a dict from training_step."""

    def __init__(self, conv: bool = False, width: int = 64, lr: float = 1e-2, batch_size: int = 16) -> None:
        super().__init__()
        self.save_hyperparameters()
        if conv:
            self.net = torch.nn.Sequential(
                torch.nn.Conv2d(3, 8, 3, padding=1),
                torch.nn.ReLU(),
                torch.nn.AdaptiveAvgPool2d(4),
                torch.nn.Flatten(),
                torch.nn.Linear(8 * 16, 4),
            )
        else:
            self.net = torch.nn.Sequential(torch.nn.Linear(16, width), torch.nn.GELU(), torch.nn.Linear(width, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.cross_entropy(self(x), y)
        self.log("train_loss", loss)
        return {"loss": loss}

    def configure_optimizers(self):
        opt = torch.optim.AdamW(self.parameters(), lr=self.hparams.lr)
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=5, gamma=0.9)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


def _data(conv: bool, n: int = 256, seed: int = 0) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 3, 8, 8, generator=g) if conv else torch.randn(n, 16, generator=g)
    w = torch.randn(x[0].numel(), 4, generator=g)
    y = (x.flatten(1) @ w).argmax(1)
    return TensorDataset(x, y)


class SleepyDataset(Dataset):
    """Each sample costs ``delay`` seconds of (simulated) decoding."""

    def __init__(self, n: int = 512, delay: float = 0.002) -> None:
        self.base = _data(False, n)
        self.delay = delay

    def __len__(self) -> int:
        return len(self.base)

    def __getitem__(self, i: int):
        time.sleep(self.delay)
        return self.base[i]


class SleepyData(LightningDataModule):
    def __init__(self, batch_size: int = 16, delay: float = 0.002) -> None:
        super().__init__()
        self.batch_size = batch_size
        self.delay = delay

    def train_dataloader(self):
        return DataLoader(SleepyDataset(delay=self.delay), batch_size=self.batch_size, shuffle=False)


def tiny_mlp(batch_size: int = 16, seed: int = 0):
    torch.manual_seed(seed)
    return Classifier(batch_size=batch_size), DataLoader(_data(False), batch_size=batch_size, shuffle=False)


def tiny_conv(batch_size: int = 16, seed: int = 0):
    torch.manual_seed(seed)
    return Classifier(conv=True, batch_size=batch_size), DataLoader(_data(True), batch_size=batch_size, shuffle=False)


def sleepy(batch_size: int = 16, delay: float = 0.002, seed: int = 0):
    """Data-bound: 16 samples x 2 ms of 'decoding' per batch vs a sub-millisecond step."""
    torch.manual_seed(seed)
    return Classifier(batch_size=batch_size), SleepyData(batch_size=batch_size, delay=delay)


def raises():
    raise RuntimeError("dataset folder /data/x is empty")


def wrong_type():
    return 42


def sleepy_3ms(batch_size: int = 16, seed: int = 0):
    torch.manual_seed(seed)
    return Classifier(batch_size=batch_size), SleepyData(batch_size=batch_size, delay=0.003)


# --- targets that fail in the user's own code (the error policy's tests) ---
class StepRaises(Classifier):
    def training_step(self, batch, batch_idx):
        raise ValueError("shapes do not match in my_loss")


def step_raises():
    return StepRaises(), DataLoader(_data(False), batch_size=16)


class NoLoaderData(LightningDataModule):
    pass


def no_train_dataloader():
    return Classifier(), NoLoaderData()


def empty_dataset():
    return Classifier(), DataLoader(TensorDataset(torch.zeros(0, 16), torch.zeros(0, dtype=torch.long)), batch_size=16)


class Strings(Dataset):
    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int):
        return f"sample {i}"


def yields_strings():
    return Classifier(), DataLoader(Strings(), batch_size=16)


class NoParams(LightningModule):
    def training_step(self, batch, batch_idx):
        return batch[0].sum()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def no_parameters():
    return NoParams(), DataLoader(_data(False), batch_size=16)


def exits_0():
    import sys

    sys.exit(0)


def exits_3():
    import sys

    sys.exit(3)


class NanLoss(Classifier):
    def training_step(self, batch, batch_idx):
        out = super().training_step(batch, batch_idx)
        return {"loss": out["loss"] * float("nan")}


def nan_loss():
    torch.manual_seed(0)
    return NanLoss(), DataLoader(_data(False), batch_size=16)


def slow_workers(batch_size: int = 16, seed: int = 0):
    """A loader with workers (each sample sleeps 20 ms): for the interrupt test."""
    torch.manual_seed(seed)
    return Classifier(batch_size=batch_size), DataLoader(
        SleepyDataset(delay=0.02), batch_size=batch_size, num_workers=2
    )


def dies_fourth(batch_size: int = 16, seed: int = 0):
    """Counts its builds in $FASTLOOP_TEST_COUNTER; the fourth process (or the one
    $FASTLOOP_TEST_DIE_AT names) kills itself (SIGKILL)."""
    import os
    import signal

    path = os.environ["FASTLOOP_TEST_COUNTER"]
    n = int(open(path).read() or 0) + 1 if os.path.exists(path) else 1
    with open(path, "w") as f:
        f.write(str(n))
    if n == int(os.environ.get("FASTLOOP_TEST_DIE_AT", "4")):
        os.kill(os.getpid(), signal.SIGKILL)
    return tiny_mlp(batch_size, seed)


class _FailsOnRank(Classifier):
    def __init__(self, rank: int, at: int) -> None:
        super().__init__()
        self.fail_rank, self.fail_at = rank, at

    def training_step(self, batch, batch_idx):
        if self.global_rank == self.fail_rank and batch_idx == self.fail_at:
            raise RuntimeError(f"boom on rank {self.fail_rank} at step {batch_idx}")
        return super().training_step(batch, batch_idx)


def fails_on_rank_1():
    """Under DDP: rank 1 raises at its fourth step (the other rank waits in a collective)."""
    return _FailsOnRank(rank=1, at=3), DataLoader(_data(False), batch_size=16, shuffle=True)


def fails_on_rank_0():
    return _FailsOnRank(rank=0, at=3), DataLoader(_data(False), batch_size=16, shuffle=True)


class ItemEveryStep(Classifier):
    """Reads its loss on the host every step (``.item()``): the GPU waits for the host."""

    def training_step(self, batch, batch_idx):
        out = super().training_step(batch, batch_idx)
        self.last_loss = out["loss"].item()
        return out


def item_every_step(batch_size: int = 16, seed: int = 0):
    torch.manual_seed(seed)
    return ItemEveryStep(batch_size=batch_size), DataLoader(_data(False), batch_size=batch_size, shuffle=False)


def fork_trouble(batch_size: int = 16, seed: int = 0):
    """Fails as CUDA does in a child forked after the driver started, but only in a forked run
    (the fork server names its children's argv[0] "fastloop"); a fresh interpreter trains."""
    import sys

    if sys.argv[0] == "fastloop":
        raise RuntimeError("Cannot re-initialize CUDA in forked subprocess. To use CUDA with multiprocessing, ...")
    return tiny_mlp(batch_size, seed)


def env_probe():
    """tiny_mlp that appends the FASTLOOP_PROFILE_STEPS it sees to the file FASTLOOP_TEST_PROBE names."""
    import os

    with open(os.environ["FASTLOOP_TEST_PROBE"], "a") as f:
        f.write(os.environ.get("FASTLOOP_PROFILE_STEPS", "unset") + "\n")
    return tiny_mlp()


def with_trainer_settings(clip: float = 1e-3, precision: str | None = None, extra: str = "", seed: int = 0):
    """tiny_mlp with the user's Trainer settings as a third element (they travel with the
    target). A tiny ``gradient_clip_val`` changes the loss trajectory, so a run that honours
    it can be told from one that does not."""
    module, loader = tiny_mlp(seed=seed)
    kwargs: dict = {"gradient_clip_val": clip, "max_epochs": 3}
    if precision:
        kwargs["precision"] = precision
    if extra:
        kwargs[extra] = 1
    return module, loader, kwargs


class CountSteps(Callback):
    """A callback of the user's own: counts the training batches it saw, written at the end of
    training to the file ``FASTLOOP_TEST_COUNT_FILE`` names."""

    seen = 0

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.seen += 1

    def on_train_end(self, trainer, pl_module) -> None:
        import os

        with open(os.environ["FASTLOOP_TEST_COUNT_FILE"], "w") as f:
            f.write(str(self.seen))


def with_callbacks():
    """tiny_mlp with the Trainer callbacks users carry: a logger's LearningRateMonitor, a
    ModelCheckpoint and an EarlyStopping on a validation metric (each needs what a measured run
    turns off) and one of their own (runs)."""
    from fastloop._compat import pl

    module, loader = tiny_mlp()
    return (
        module,
        loader,
        {
            "callbacks": [
                pl.callbacks.LearningRateMonitor(),
                pl.callbacks.ModelCheckpoint(),
                pl.callbacks.EarlyStopping("val_loss"),
                CountSteps(),
            ],
            "logger": True,
        },
    )


def trainer_settings_not_a_dict():
    module, loader = tiny_mlp()
    return module, loader, ["gradient_clip_val", 1.0]


class _Untraceable(torch.nn.Module):
    """A layer torch.compile cannot trace: its forward is excluded from compilation."""

    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))

    @torch.compiler.disable
    def forward(self, x):
        return self.net(x)


def untraceable(batch_size: int = 16, seed: int = 0):
    """tiny_mlp whose only child torch.compile cannot trace: compile compiles no graph."""
    torch.manual_seed(seed)
    module = Classifier(batch_size=batch_size)
    module.net = _Untraceable()
    return module, DataLoader(_data(False), batch_size=batch_size, shuffle=False)


class GraphPattern(LightningModule):
    """A small conv net written the ordinary way, with one of the patterns that decide how much of
    its step a CUDA graph can capture (tests/test_graph_tiers.py)."""

    def __init__(self, pattern: str = "plain") -> None:
        super().__init__()
        self.pattern = pattern
        self.net = torch.nn.Sequential(
            torch.nn.Conv2d(3, 16, 3, padding=1),
            torch.nn.BatchNorm2d(16),
            torch.nn.ReLU(),
            torch.nn.AdaptiveAvgPool2d(2),
            torch.nn.Flatten(),
            torch.nn.Linear(64, 4),
        )
        if pattern == "metric_object":
            import torchmetrics

            self.acc = torchmetrics.classification.MulticlassAccuracy(num_classes=4)

    def training_step(self, batch, batch_idx):
        x, y = batch
        logits = self.net(x)
        loss = torch.nn.functional.cross_entropy(logits, y)
        if self.pattern == "metric_object":
            self.acc(logits, y)
            self.log("train_acc", self.acc, on_step=True)
        self.log("train_loss", loss, prog_bar=self.pattern == "prog_bar")
        return loss

    def configure_optimizers(self):
        opt = torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)
        if self.pattern == "momentum_cycling":
            sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.1, total_steps=10_000)
            return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}
        return opt


class AnnealedPattern(GraphPattern):
    """A loss weight annealed by the step counter (as KL warm-ups are written): a Python value
    that a captured step would freeze."""

    def training_step(self, batch, batch_idx):
        x, y = batch
        weight = min(1.0, (self.global_step + 1) / 8)
        loss = weight * torch.nn.functional.cross_entropy(self.net(x), y)
        self.log("train_loss", loss)
        return loss


def _jitter(x):
    """A helper outside the module (as a library's transform is): a coin flip on the host."""
    return x.flip(-1) if torch.rand(()) < 0.5 else x


class HiddenDrawPattern(GraphPattern):
    """A host draw that the source check cannot see (in a function outside the module): found
    when the step before capture moves the host's generator."""

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.cross_entropy(self.net(_jitter(x)), y)
        self.log("train_loss", loss)
        return loss


def graph_pattern(pattern: str = "plain", batch_size: int = 32, seed: int = 0):
    torch.manual_seed(seed)
    loader = DataLoader(
        _data(True, n=512), batch_size=batch_size, shuffle=False, drop_last=True, pin_memory=pattern != "pageable"
    )
    module = {"anneal": AnnealedPattern, "hidden_draw": HiddenDrawPattern}.get(pattern, GraphPattern)(pattern)
    if pattern == "grad_clip":
        return module, loader, {"gradient_clip_val": 1.0}
    if pattern == "accumulate":
        return module, loader, {"accumulate_grad_batches": 2}
    return module, loader


class GraphGAN(LightningModule):
    """A small GAN in manual optimization, as users write one: two optimizers stepped in the
    training step, the discriminator called three times a step (real, detached fake, fake)."""

    def __init__(self) -> None:
        super().__init__()
        self.automatic_optimization = False
        self.g = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 16))
        self.d = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.LeakyReLU(0.2), torch.nn.Linear(32, 1))

    def training_step(self, batch, batch_idx):
        real = batch[0]
        opt_g, opt_d = self.optimizers()
        z = torch.randn(real.size(0), 8, device=real.device)
        fake = self.g(z)
        bce = torch.nn.functional.binary_cross_entropy_with_logits
        ones, zeros = torch.ones(real.size(0), 1, device=real.device), torch.zeros(real.size(0), 1, device=real.device)
        d_loss = bce(self.d(real), ones) + bce(self.d(fake.detach()), zeros)
        opt_d.zero_grad()
        self.manual_backward(d_loss)
        opt_d.step()
        g_loss = bce(self.d(fake), ones)
        opt_g.zero_grad()
        self.manual_backward(g_loss)
        opt_g.step()
        self.log_dict({"d_loss": d_loss, "g_loss": g_loss})

    def configure_optimizers(self):
        return (
            torch.optim.Adam(self.g.parameters(), lr=2e-4, betas=(0.5, 0.999)),
            torch.optim.Adam(self.d.parameters(), lr=2e-4, betas=(0.5, 0.999)),
        )


def graph_gan(batch_size: int = 32, seed: int = 0):
    torch.manual_seed(seed)
    g = torch.Generator().manual_seed(seed)
    return GraphGAN(), DataLoader(
        TensorDataset(torch.randn(512, 16, generator=g)), batch_size=batch_size, drop_last=True, pin_memory=True
    )


def mixup_step(model, batch):
    """A plain loop's step with a mixup weight drawn on the host (np.random): a captured step
    would reuse the first draw."""
    import numpy as np

    x, y = batch
    lam = float(np.random.beta(0.4, 0.4))
    mixed = lam * x + (1 - lam) * x.flip(0)
    out = model(mixed)
    return lam * torch.nn.functional.cross_entropy(out, y) + (1 - lam) * torch.nn.functional.cross_entropy(
        out, y.flip(0)
    )


class TwoLoaders(LightningModule):
    """Two training loaders in a dict (Lightning combines them): each step trains on 8 + 8 samples."""

    def __init__(self) -> None:
        super().__init__()
        self.trunk, self.head = torch.nn.Linear(4, 8), torch.nn.Linear(8, 1)

    def train_dataloader(self):
        g = torch.Generator().manual_seed(1)
        sets = [TensorDataset(torch.randn(64, 4, generator=g), torch.randn(64, 1, generator=g)) for _ in range(2)]
        return {"a": DataLoader(sets[0], batch_size=8), "b": DataLoader(sets[1], batch_size=8)}

    def training_step(self, batch, batch_idx):
        return sum(torch.nn.functional.mse_loss(self.head(self.trunk(x)), y) for x, y in batch.values())

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def two_loaders():
    torch.manual_seed(0)
    return TwoLoaders(), None


def compiled_module():
    """The target compiled its LightningModule itself: torch.compile returns a wrapper, not one."""
    module, loader = tiny_mlp()
    return torch.compile(module), loader


class PaddedText(LightningModule):
    """Token lists of 4-40 tokens, padded to the longest of each batch by the collate function
    (the usual text pipeline): nearly every batch has another shape."""

    def __init__(self) -> None:
        super().__init__()
        self.emb, self.out = torch.nn.Embedding(100, 16, padding_idx=0), torch.nn.Linear(16, 2)

    def training_step(self, batch, batch_idx):
        tokens, labels = batch
        keep = (tokens != 0).unsqueeze(-1)
        pooled = (self.emb(tokens) * keep).sum(1) / keep.sum(1)
        return torch.nn.functional.cross_entropy(self.out(pooled), labels)

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=1e-2)


def _pad(batch):
    seqs, labels = zip(*batch)
    return torch.nn.utils.rnn.pad_sequence(list(seqs), batch_first=True), torch.stack(labels)


def padded_text(batch_size: int = 8, fixed: int = 0):
    """``fixed``: pad every batch to this length instead (one shape: graphs can replay it)."""
    g = torch.Generator().manual_seed(0)
    items = [
        (torch.randint(1, 100, (int(n),), generator=g), torch.tensor(int(n) % 2))
        for n in torch.randint(4, 41, (512,), generator=g)
    ]

    def to_fixed(batch):
        tokens, labels = _pad(batch)
        return torch.nn.functional.pad(tokens, (0, fixed - tokens.shape[1])), labels

    return PaddedText(), DataLoader(items, batch_size=batch_size, collate_fn=to_fixed if fixed else _pad)


class OneCycleFromEstimate(Classifier):
    """The Lightning docs' OneCycleLR: its length is ``trainer.estimated_stepping_batches``."""

    def __init__(self, record: str = "") -> None:
        super().__init__()
        self.record = record

    def configure_optimizers(self):
        total = self.trainer.estimated_stepping_batches
        if self.record:
            with open(self.record, "w") as f:
                f.write(str(total))
        opt = torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)
        sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.1, total_steps=total)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


def onecycle_from_estimate(record: str = "", max_epochs: int | None = None, max_steps: int | None = None):
    module, loader = tiny_mlp()  # 256 samples, 16 a batch: 16 batches an epoch
    lengths = {k: v for k, v in (("max_epochs", max_epochs), ("max_steps", max_steps)) if v is not None}
    return OneCycleFromEstimate(record), loader, lengths


class _Stream(torch.utils.data.IterableDataset):
    """Samples without end and without a length (a stream)."""

    def __iter__(self):
        g = torch.Generator().manual_seed(0)
        while True:
            yield torch.randn(16, generator=g), torch.randint(0, 4, (), generator=g)


def stream_with_epochs():
    """A stream with ``max_epochs`` set: Lightning cannot count its steps (max_steps stays -1)."""
    return Classifier(), DataLoader(_Stream(), batch_size=16), {"max_epochs": 3}


class UsesItsLogger(Classifier):
    """Logs hyperparameters when training starts and a histogram to its logger's experiment every
    few steps, and reads ``trainer.log_dir``, as modules that log to TensorBoard or W&B do."""

    def on_train_start(self):
        self.logger.log_hyperparams({"width": 64})
        self.sample_dir = self.trainer.log_dir

    def training_step(self, batch, batch_idx):
        if self.global_step % 4 == 0:
            self.logger.experiment.add_histogram("w", self.net[0].weight, self.global_step)
            self.loggers[0].experiment.log({"step": self.global_step})
        return super().training_step(batch, batch_idx)


def uses_its_logger():
    return UsesItsLogger(), tiny_mlp()[1]


# -- text padded per batch (pad_buckets) -------------------------------------------------------


class TextRows(Dataset):
    """Token rows of 5-40 tokens (ids 1..49; 0 is the pad id), a class label each."""

    def __init__(self, n: int = 128, seed: int = 0, causal: bool = False) -> None:
        g = torch.Generator().manual_seed(seed)
        self.rows = [
            torch.randint(1, 50, (int(torch.randint(5, 41, (1,), generator=g)),), generator=g) for _ in range(n)
        ]
        self.labels = [int(r.sum()) % 3 for r in self.rows]
        self.causal = causal

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int):
        return {"input_ids": self.rows[i], "label": self.labels[i]}


def pad_collate(samples, side: str = "right", pad_id: int = 0, lm: bool = False):
    """Pads each batch to its own longest row, as Hugging Face's DataCollatorWithPadding does."""
    longest = max(len(s["input_ids"]) for s in samples)
    ids = torch.full((len(samples), longest), pad_id, dtype=torch.long)
    mask = torch.zeros((len(samples), longest), dtype=torch.long)
    for i, s in enumerate(samples):
        n = len(s["input_ids"])
        sl = slice(0, n) if side == "right" else slice(longest - n, longest)
        ids[i, sl], mask[i, sl] = s["input_ids"], 1
    if lm:
        labels = ids.masked_fill(mask == 0, -100)
        return {"input_ids": ids, "attention_mask": mask, "labels": labels}
    return {"input_ids": ids, "attention_mask": mask, "labels": torch.tensor([s["label"] for s in samples])}


def left_pad_lm_collate(samples):
    return pad_collate(samples, side="left", lm=True)


def right_pad_lm_collate(samples):
    return pad_collate(samples, lm=True)


class TextClassifier(LightningModule):
    """Embedding, one Transformer encoder layer with a key-padding mask, masked mean pooling
    (``use_mask=False``: plain mean over every position, padding included: not equivalent)."""

    def __init__(self, use_mask: bool = True, lr: float = 1e-3, dropout: float = 0.1) -> None:
        super().__init__()
        self.use_mask = use_mask
        self.emb = torch.nn.Embedding(50, 32, padding_idx=0)
        self.enc = torch.nn.TransformerEncoderLayer(32, 4, 64, dropout=dropout, batch_first=True)
        self.head = torch.nn.Linear(32, 3)
        self.lr = lr

    def forward(self, input_ids, attention_mask):
        x = self.emb(input_ids)
        keep = attention_mask.bool()
        if self.use_mask:
            x = self.enc(x, src_key_padding_mask=~keep)
            pooled = (x * keep[..., None]).sum(1) / keep.sum(1, keepdim=True)
        else:
            pooled = self.enc(x).mean(1)
        return self.head(pooled)

    def training_step(self, batch, batch_idx):
        loss = torch.nn.functional.cross_entropy(self(batch["input_ids"], batch["attention_mask"]), batch["labels"])
        self.log("train_loss", loss)
        return {"loss": loss}

    def configure_optimizers(self):
        opt = torch.optim.AdamW(self.parameters(), lr=self.lr)
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=5, gamma=0.9)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


class CausalLM(LightningModule):
    """A one-block causal Transformer LM; labels padded with -100 (ignored by the loss)."""

    def __init__(self, lr: float = 1e-3) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(50, 32, padding_idx=0)
        self.enc = torch.nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True)
        self.head = torch.nn.Linear(32, 50)
        self.lr = lr

    def training_step(self, batch, batch_idx):
        ids, mask = batch["input_ids"], batch["attention_mask"].bool()
        t = ids.shape[1]
        causal = torch.triu(torch.ones(t, t, dtype=torch.bool, device=ids.device), 1)
        x = self.enc(self.emb(ids), src_mask=causal, src_key_padding_mask=~mask)
        logits = self.head(x)[:, :-1]
        labels = batch["labels"][:, 1:]
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 50), labels.reshape(-1), ignore_index=-100)
        self.log("train_loss", loss)
        return {"loss": loss}

    def configure_optimizers(self):
        opt = torch.optim.AdamW(self.parameters(), lr=self.lr)
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=5, gamma=0.9)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


def masked_text(batch_size: int = 16, seed: int = 0, use_mask: bool = True):
    """Text padded per batch (a classifier that masks its padding; ``use_mask=False``: one that does not)."""
    torch.manual_seed(seed)
    return (
        TextClassifier(use_mask=use_mask, dropout=0.0),
        DataLoader(
            TextRows(seed=seed),
            batch_size=batch_size,
            shuffle=True,
            collate_fn=pad_collate,
            generator=torch.Generator().manual_seed(seed),
        ),
    )


class TypedTextClassifier(TextClassifier):
    """A BERT-style classifier that adds a token-type embedding (``token_type_ids``: all 0 for
    one sentence, padded per batch with the ids, as Hugging Face's tokenizers give them)."""

    def __init__(self) -> None:
        super().__init__(dropout=0.0)
        self.types = torch.nn.Embedding(2, 32)

    def training_step(self, batch, batch_idx):
        ids, keep = batch["input_ids"], batch["attention_mask"].bool()
        x = self.enc(self.emb(ids) + self.types(batch["token_type_ids"]), src_key_padding_mask=~keep)
        pooled = (x * keep[..., None]).sum(1) / keep.sum(1, keepdim=True)
        loss = torch.nn.functional.cross_entropy(self.head(pooled), batch["labels"])
        self.log("train_loss", loss)
        return {"loss": loss}


def typed_collate(samples):
    b = pad_collate(samples)
    return {**b, "token_type_ids": torch.zeros_like(b["input_ids"])}


def typed_text(batch_size: int = 16, seed: int = 0):
    """Text padded per batch with token_type_ids beside the ids (a Hugging Face BERT batch)."""
    torch.manual_seed(seed)
    return (
        TypedTextClassifier(),
        DataLoader(
            TextRows(seed=seed),
            batch_size=batch_size,
            shuffle=True,
            collate_fn=typed_collate,
            generator=torch.Generator().manual_seed(seed),
        ),
    )


class Encoding(UserDict):
    """A mapping that is not a dict, with attribute access to its keys, as Hugging Face's
    ``BatchEncoding`` (what ``DataCollatorWithPadding`` returns) is."""

    def __getattr__(self, name):
        try:
            return self.data[name]
        except KeyError:
            raise AttributeError(name) from None


def encoded_collate(samples):
    return Encoding(typed_collate(samples))


def encoded_text(batch_size: int = 16, seed: int = 0):
    """typed_text's batches as an Encoding (a UserDict), as a tokenizer's collate gives them."""
    torch.manual_seed(seed)
    return (
        TypedTextClassifier(),
        DataLoader(
            TextRows(seed=seed),
            batch_size=batch_size,
            shuffle=True,
            collate_fn=encoded_collate,
            generator=torch.Generator().manual_seed(seed),
        ),
    )


def unmasked_text(batch_size: int = 16, seed: int = 0):
    return masked_text(batch_size, seed, use_mask=False)


def padded_lm(batch_size: int = 16, seed: int = 0, left: bool = False):
    """A causal LM on per-batch padded rows (labels -100 on the padding; ``left``: left-padded)."""
    torch.manual_seed(seed)
    return (
        CausalLM(),
        DataLoader(
            TextRows(seed=seed, causal=True),
            batch_size=batch_size,
            shuffle=True,
            collate_fn=left_pad_lm_collate if left else right_pad_lm_collate,
            generator=torch.Generator().manual_seed(seed),
        ),
    )


# -- in-memory images with a random torchvision transform (gpu_augment) -------------------------


class AugmentedImages(Dataset):
    """uint8 CHW images held in memory, passed through a torchvision v2 pipeline (random crop with
    padding, flip, to float, normalize), as a CIFAR training set is written with v2."""

    def __init__(self, n: int = 256, size: int = 16, seed: int = 0, transform=None) -> None:
        g = torch.Generator().manual_seed(seed)
        self.data = torch.randint(0, 256, (n, 3, size, size), dtype=torch.uint8, generator=g)
        self.targets = torch.randint(0, 4, (n,), generator=g).tolist()
        self.transform = transform

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, i: int):
        img = self.data[i]
        if self.transform is not None:
            img = self.transform(img)
        return img, self.targets[i]


class PilCifar(Dataset):
    """As torchvision's ``CIFAR10`` holds its data: uint8 HWC arrays in memory, each sample made a
    PIL image in ``__getitem__`` and passed to a v1 pipeline (crop, flip, ToTensor, Normalize)."""

    def __init__(self, n: int = 256, size: int = 16, seed: int = 0, transform=None) -> None:
        import numpy as np

        rng = np.random.default_rng(seed)
        self.data = rng.integers(0, 256, (n, size, size, 3), dtype=np.uint8)
        self.targets = rng.integers(0, 4, n).tolist()
        self.transform = transform

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, i: int):
        from PIL import Image

        img = Image.fromarray(self.data[i])
        if self.transform is not None:
            img = self.transform(img)
        return img, self.targets[i]


def v1_pipeline(size: int = 16, padding: int = 2):
    from torchvision import transforms as T

    return T.Compose(
        [
            T.RandomCrop(size, padding=padding),
            T.RandomHorizontalFlip(),
            T.ToTensor(),
            T.Normalize([0.5, 0.5, 0.5], [0.25, 0.25, 0.25]),
        ]
    )


def pil_cifar(batch_size: int = 16, seed: int = 0):
    torch.manual_seed(seed)
    return (
        Classifier(conv=True, batch_size=batch_size),
        DataLoader(
            PilCifar(seed=seed, transform=v1_pipeline()),
            batch_size=batch_size,
            shuffle=True,
            generator=torch.Generator().manual_seed(seed),
        ),
    )


def v2_pipeline(size: int = 16, padding: int = 2):
    from torchvision.transforms import v2

    return v2.Compose(
        [
            v2.RandomCrop(size, padding=padding),
            v2.RandomHorizontalFlip(),
            v2.ToDtype(torch.float32, scale=True),
            v2.Normalize([0.5, 0.5, 0.5], [0.25, 0.25, 0.25]),
        ]
    )


def augmented_images(batch_size: int = 16, seed: int = 0):
    torch.manual_seed(seed)
    return (
        Classifier(conv=True, batch_size=batch_size),
        DataLoader(
            AugmentedImages(seed=seed, transform=v2_pipeline()),
            batch_size=batch_size,
            shuffle=True,
            generator=torch.Generator().manual_seed(seed),
        ),
    )


# --- targets for `fastloop fit`: validation, checkpoints, a progress bar, as a plain Trainer has them ---
class ValidatedClassifier(Classifier):
    """The Classifier with a validation loop that logs a loss and an accuracy to the progress bar."""

    def __init__(self, fail_in_validation: bool = False, **kwargs) -> None:
        super().__init__(**kwargs)
        self.fail_in_validation = fail_in_validation

    def validation_step(self, batch, batch_idx):
        x, y = batch
        logits = self(x)
        if self.fail_in_validation and not self.trainer.sanity_checking:
            raise ValueError("validation labels out of range in my_metric")
        self.log("val_loss", torch.nn.functional.cross_entropy(logits, y), prog_bar=True)
        self.log("val_acc", (logits.argmax(1) == y).float().mean(), prog_bar=True)


class SplitData(LightningDataModule):
    """384 samples of one linear task: 256 to train on (a share of their labels made random when
    ``label_noise`` > 0), 128 held out; each epoch reshuffled by the seed's generator."""

    def __init__(self, batch_size: int = 16, seed: int = 0, label_noise: float = 0.0) -> None:
        super().__init__()
        data = _data(False, 384, seed=0)
        x, y = data.tensors
        y = y.clone()
        g = torch.Generator().manual_seed(seed + 7)
        noisy = torch.rand(256, generator=g) < label_noise
        y[:256][noisy] = torch.randint(0, 4, (int(noisy.sum()),), generator=g)
        self.train, self.val = TensorDataset(x[:256], y[:256]), TensorDataset(x[256:], y[256:])
        self.batch_size, self.seed = batch_size, seed

    def train_dataloader(self):
        g = torch.Generator().manual_seed(self.seed)
        return DataLoader(self.train, batch_size=self.batch_size, shuffle=True, generator=g)

    def val_dataloader(self):
        return DataLoader(self.val, batch_size=self.batch_size)


def fit_tiny(
    batch_size: int = 16,
    seed: int = 0,
    label_noise: float = 0.0,
    compile_backend: str = "",
    fail_in_validation: bool = False,
    lr: float = 1e-2,
):
    """A plain fit: validation every epoch, Lightning's default checkpointing, logger and progress bar."""
    torch.manual_seed(seed)
    module = ValidatedClassifier(fail_in_validation=fail_in_validation, batch_size=batch_size, lr=lr)
    if compile_backend:  # the user's own compile (backend "eager": Dynamo traces, nothing is generated)
        module.net = torch.compile(module.net, backend=compile_backend)
    return module, SplitData(batch_size, seed, label_noise), {"log_every_n_steps": 4}


def fit_fails_in_validation(seed: int = 0):
    return fit_tiny(seed=seed, fail_in_validation=True)


def fit_compiled(seed: int = 0):
    return fit_tiny(seed=seed, compile_backend="eager")


def fit_noisy(seed: int = 0):
    """fit_tiny with 80% of its training labels made random: a model that learns worse."""
    return fit_tiny(seed=seed, label_noise=0.8)


def gpt_fit_tiny(seed: int = 0):
    """The GPT recipe's own module and data, tiny (T=32, B=8, 4 validation windows), validated every
    10 steps: a CPU fit that reaches a validation loss in seconds."""
    from fastloop.recipes.gpt.target import make

    module, data = make(preset="tiny", batch_size=8, block_size=32, seed=seed)
    data.val = type(data.val)(data.val.data, 32, 8, seed + 1)  # 8 held-out windows: one batch
    return module, data, {"val_check_interval": 10, "limit_val_batches": 1}


def fit_mid_validation(seed: int = 0):
    """fit_tiny validated twice an epoch (every 8 of its 16 batches)."""
    module, data, trainer = fit_tiny(seed=seed)
    return module, data, {**trainer, "val_check_interval": 8}


class SaveAtEpochEnd(Callback):
    """The user's own save: ``trainer.save_checkpoint`` at each epoch's end (no ModelCheckpoint)."""

    def __init__(self, folder: str) -> None:
        self.folder = folder

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        trainer.save_checkpoint(f"{self.folder}/epoch{trainer.current_epoch}.ckpt")


def fit_saves_itself(seed: int = 0):
    """fit_tiny without Lightning's checkpointing, saving from a callback of its own."""
    import tempfile

    module, data, trainer = fit_tiny(seed=seed)
    return module, data, {**trainer, "enable_checkpointing": False, "callbacks": [SaveAtEpochEnd(tempfile.mkdtemp())]}
