"""deferred_logging: the logged values reach the logger as eager logging writes them (the same
values at the same steps, bit for bit on the CPU), with fewer host reads; the progress bar is at
most the cadence late; callbacks that decide on logged values (ModelCheckpoint, EarlyStopping,
ReduceLROnPlateau) see the current values; a checkpoint, an exception and the fit's end lose no
row; after the fit the Trainer is as it was."""

from __future__ import annotations

import csv
import io
import logging
import math
import sys
import warnings
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from fastloop._compat import Callback, LightningModule, Trainer
from fastloop.errors import FastloopError
from fastloop.lightning import SpeedupCallback, callbacks, records_of
from fastloop.loop import FastLoop
from fastloop.speedups import resolve
from fastloop.speedups.deferred_logging import Cadence, keep, read_to_host

pytestmark = pytest.mark.filterwarnings("ignore")

STEPS_PER_EPOCH = 8


class Logs(LightningModule):
    """Logs the ways a user does: on_step and on_epoch, prog_bar, a tensor and a Python float, a
    max reduction, in training and in validation (whose last batch is short)."""

    def __init__(self, fail_at: int | None = None) -> None:
        super().__init__()
        self.net = torch.nn.Linear(16, 4)
        self.fail_at = fail_at

    def training_step(self, batch, batch_idx):
        if self.global_step == self.fail_at:
            raise RuntimeError("the step failed")
        x, y = batch
        out = self.net(x)
        loss = torch.nn.functional.cross_entropy(out, y)
        self.log("loss", loss, prog_bar=True)
        self.log("acc", (out.argmax(1) == y).float().mean(), on_step=True, on_epoch=True, prog_bar=True)
        self.log("half_idx", 0.5 * batch_idx, on_step=True, on_epoch=True)  # a Python float
        self.log("x_max", x.max(), on_step=False, on_epoch=True, reduce_fx="max")
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.cross_entropy(self.net(x), y)
        self.log("val_loss", loss, prog_bar=True)
        self.log("val_step_loss", loss, on_step=True, on_epoch=False)

    def configure_optimizers(self):
        opt = torch.optim.SGD(self.parameters(), lr=0.1)
        return {
            "optimizer": opt,
            "lr_scheduler": {"scheduler": torch.optim.lr_scheduler.StepLR(opt, 3), "interval": "step"},
        }


def _loader(n: int, seed: int) -> DataLoader:
    g = torch.Generator().manual_seed(seed)
    data = TensorDataset(torch.randn(n, 16, generator=g), torch.randint(0, 4, (n,), generator=g))
    return DataLoader(data, batch_size=8)


def _fit(tmp_path: Path, tag: str, spec: str | None, build: Callable[[], LightningModule] = Logs, **kwargs) -> Trainer:
    """A fit of ``build()`` (:class:`Logs`: 8 steps an epoch, validation of 8+8+4 samples), seeded,
    with a CSVLogger writing under ``tmp_path/tag``; ``kwargs`` go to the Trainer."""
    from lightning.pytorch.loggers import CSVLogger

    torch.manual_seed(0)
    extra = kwargs.pop("callbacks", [])
    settings = dict(
        max_epochs=2,
        accelerator="cpu",
        logger=CSVLogger(str(tmp_path), name=tag, version=0),
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
    )
    settings.update(kwargs)
    trainer = Trainer(callbacks=[*extra, *callbacks(spec)], **settings)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
        trainer.fit(build(), _loader(8 * STEPS_PER_EPOCH, 1), _loader(20, 2))
    return trainer


def _csv(tmp_path: Path, tag: str) -> str:
    return (tmp_path / tag / "version_0" / "metrics.csv").read_text()


def _numbers(metrics: dict) -> dict:
    return {k: v.item() if torch.is_tensor(v) else v for k, v in metrics.items()}


@pytest.mark.parametrize(
    ("log_every", "spec"),
    [(1, "deferred_logging:3:seconds=none"), (5, "deferred_logging:3:seconds=none"), (1, "deferred_logging")],
    ids=["every-step-read-every-3", "every-5-read-every-3", "every-step-defaults"],
)
def test_the_logger_writes_what_eager_logging_writes_byte_for_byte(tmp_path, log_every, spec):
    """The CSVLogger's file of a deferred fit equals the eager fit's byte for byte (the same rows,
    values and steps in the same order, with LearningRateMonitor's rows, which it gives the logger
    itself, among them: the values are read from the same tensors, only later; no tolerance), with
    the progress bar on and a sanity check; after the fit the bar's, the logger's and the callbacks'
    values are the eager fit's."""
    from lightning.pytorch.callbacks import LearningRateMonitor

    common = dict(log_every_n_steps=log_every, enable_progress_bar=True, num_sanity_val_steps=2)
    eager = _fit(tmp_path, "eager", None, callbacks=[LearningRateMonitor("step")], **common)
    deferred = _fit(tmp_path, "deferred", spec, callbacks=[LearningRateMonitor("step")], **common)
    assert [r.status for r in records_of(deferred)] == ["applied"]
    assert _csv(tmp_path, "deferred") == _csv(tmp_path, "eager")
    assert len(_csv(tmp_path, "eager").splitlines()) > 2 * STEPS_PER_EPOCH // log_every
    assert deferred.progress_bar_metrics == eager.progress_bar_metrics
    assert _numbers(deferred.logged_metrics) == _numbers(eager.logged_metrics)
    assert _numbers(deferred.callback_metrics) == _numbers(eager.callback_metrics)


_READERS = ("item", "tolist", "__float__")


def _logging_reads(run) -> tuple[object, int]:
    """``run()``'s result and how many host reads (``.item()``, ``.tolist()``, ``float()`` of a
    tensor) Lightning's logging made: reads called from its logger connector, its progress bars,
    its conversion of logged values, or fastloop's deferred reads."""
    originals = {name: getattr(torch.Tensor, name) for name in _READERS}
    count = [0]

    def counted(name):
        def read(self, *args, **kwargs):
            frame = sys._getframe(1)
            while frame is not None:
                path = frame.f_code.co_filename.replace("\\", "/")
                if any(p in path for p in ("logger_connector/", "callbacks/progress/", "lightning_logging.py")):
                    count[0] += 1
                    break
                frame = frame.f_back
            return originals[name](self, *args, **kwargs)

        return read

    for name in _READERS:
        setattr(torch.Tensor, name, counted(name))
    try:
        out = run()
    finally:
        for name, fn in originals.items():
            setattr(torch.Tensor, name, fn)
    return out, count[0]


def test_host_reads_of_logged_values_go_down(tmp_path):
    """Eager: at least one read per step for each prog_bar value (after every step) and one per
    logged value of each row. Deferred, reading every 4 steps: at most one read per 4 steps, plus
    the epoch ends' (the epoch's row, the bar's epoch values, validation's), and the count the run
    reports is the count made."""
    epochs, every = 2, 4
    steps = epochs * STEPS_PER_EPOCH
    kw = dict(max_epochs=epochs, log_every_n_steps=1, enable_progress_bar=True)
    _, eager = _logging_reads(lambda: _fit(tmp_path, "eager", None, **kw))
    trainer, deferred = _logging_reads(
        lambda: _fit(tmp_path, "deferred", f"deferred_logging:{every}:seconds=none", **kw)
    )
    assert eager >= 2 * steps, eager  # two prog_bar values a step, and more
    assert deferred <= steps // every + 4 * epochs, deferred
    stats = next(c for c in trainer.callbacks if isinstance(c, SpeedupCallback)).ctx.stats
    assert stats["deferred_logging_reads"] == deferred and stats["deferred_logging_steps"] >= steps, stats
    assert _csv(tmp_path, "deferred") == _csv(tmp_path, "eager")


class Seen(Callback):
    """What a callback reads after each training step and at each epoch's end."""

    def __init__(self) -> None:
        self.bar: list[tuple[int, bool, dict]] = []
        """The progress bar's values after each step and at each epoch's end: (step, at an epoch's end, values)."""
        self.callback_metrics: list[dict] = []
        self.lr: list[float] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.bar.append((trainer.global_step, False, dict(trainer.progress_bar_metrics)))
        self.callback_metrics.append({k: v.clone() for k, v in trainer.callback_metrics.items()})
        self.lr.append(trainer.optimizers[0].param_groups[0]["lr"])

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        self.bar.append((trainer.global_step, True, dict(trainer.progress_bar_metrics)))


def test_the_progress_bar_is_at_most_the_cadence_late_and_shows_each_epoch_at_its_end(tmp_path):
    """Read every 3 steps: after step s the bar shows what the eager bar showed at some point from
    step s-3 to s (often late: the reads are deferred), never the sanity check's values (Lightning
    forgets them), and at each epoch's end what the eager bar shows there."""
    every = 3
    seen_eager, seen = Seen(), Seen()
    common = dict(max_epochs=2, num_sanity_val_steps=2)
    _fit(tmp_path, "eager", None, callbacks=[seen_eager], **common)
    _fit(tmp_path, "deferred", f"deferred_logging:{every}:seconds=none", callbacks=[seen], **common)
    assert [where for *where, _ in seen.bar] == [where for *where, _ in seen_eager.bar]
    late = 0
    for i, (step, at_end, shown) in enumerate(seen.bar):
        if at_end:
            assert shown == seen_eager.bar[i][2], step
            continue
        window = [bar for s, _, bar in seen_eager.bar[: i + 1] if s >= step - every]
        assert shown in window or (step <= every and shown == {}), (step, shown)  # {}: nothing read yet
        late += shown != seen_eager.bar[i][2]
    assert late >= STEPS_PER_EPOCH, late  # deferred: not read every step


def test_the_seconds_bound_reads_once_that_long_has_passed():
    now = [0.0]
    cadence = Cadence(every=None, seconds=0.5, clock=lambda: now[0])
    for _ in range(1000):
        cadence.step()
    assert not cadence.due()  # any number of steps: by time alone
    now[0] = 0.49
    assert not cadence.due()
    now[0] = 0.5
    assert cadence.due()
    cadence.restart()
    assert not cadence.due() and cadence.steps == 0


class PlateauLogs(Logs):
    def configure_optimizers(self):
        opt = torch.optim.SGD(self.parameters(), lr=0.1)
        plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(opt, mode="min", factor=0.5, patience=0, threshold=10.0)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": plateau, "monitor": "val_loss", "interval": "epoch"}}


def test_callbacks_that_decide_on_logged_values_see_the_current_ones(tmp_path):
    """trainer.callback_metrics after every step, ModelCheckpoint(monitor=...)'s best models,
    EarlyStopping's stop and ReduceLROnPlateau's learning rates: the eager fit's, exactly."""
    from lightning.pytorch.callbacks import EarlyStopping, ModelCheckpoint

    def fit(tag, spec):
        seen = Seen()
        ckpt = ModelCheckpoint(dirpath=tmp_path / tag / "ckpt", monitor="loss", save_top_k=2, every_n_train_steps=2)
        stop = EarlyStopping(monitor="loss", min_delta=10.0, patience=1, check_on_train_epoch_end=True)
        trainer = _fit(
            tmp_path,
            tag,
            spec,
            build=PlateauLogs,
            max_epochs=6,
            callbacks=[seen, ckpt, stop],
            enable_checkpointing=True,
        )
        best = {Path(p).name: v.item() for p, v in ckpt.best_k_models.items()}
        return seen, best, stop.stopped_epoch, trainer.current_epoch

    seen_eager, best_eager, stopped_eager, epoch_eager = fit("eager", None)
    seen, best, stopped, epoch = fit("deferred", "deferred_logging:3:seconds=none")
    assert len(seen.callback_metrics) == len(seen_eager.callback_metrics)
    for mine, theirs in zip(seen.callback_metrics, seen_eager.callback_metrics):
        assert mine.keys() == theirs.keys() and all(torch.equal(mine[k], theirs[k]) for k in mine)
    assert best == best_eager and len(best) == 2
    assert (stopped, epoch) == (stopped_eager, epoch_eager) and 0 < stopped < 5  # it stopped early
    assert seen.lr == seen_eager.lr and len(set(seen.lr)) > 1  # the plateau lowered the rate


class RowsAtSave(Callback):
    """How many rows the logger's file had when each checkpoint was written."""

    def __init__(self, path: Path) -> None:
        self.path, self.rows = path, []

    def on_save_checkpoint(self, trainer, pl_module, checkpoint) -> None:
        self.rows.append(len(self.path.read_text().splitlines()) if self.path.exists() else 0)


def test_the_rows_before_a_checkpoint_are_in_the_file_when_it_is_saved(tmp_path):
    """A fit resumed from a checkpoint re-trains only the steps after it: the rows of the steps
    before it must be in the file by then, as eagerly."""
    from lightning.pytorch.callbacks import ModelCheckpoint

    def fit(tag, spec):
        rows = RowsAtSave(tmp_path / tag / "version_0" / "metrics.csv")
        ckpt = ModelCheckpoint(dirpath=tmp_path / tag / "ckpt", every_n_train_steps=3, save_top_k=-1)
        _fit(tmp_path, tag, spec, callbacks=[rows, ckpt], enable_checkpointing=True, log_every_n_steps=1)
        return rows.rows

    eager, deferred = fit("eager", None), fit("deferred", "deferred_logging:100:seconds=none")
    assert deferred == eager and len(eager) >= 4 and eager[-1] > eager[0] > 0, (eager, deferred)


def test_the_rows_kept_when_the_step_raises_reach_the_file(tmp_path):
    with pytest.raises(RuntimeError, match="the step failed"):
        _fit(tmp_path, "eager", None, build=lambda: Logs(fail_at=11), log_every_n_steps=1)
    with pytest.raises(RuntimeError, match="the step failed"):
        _fit(
            tmp_path, "deferred", "deferred_logging:4:seconds=none", build=lambda: Logs(fail_at=11), log_every_n_steps=1
        )
    assert _csv(tmp_path, "deferred") == _csv(tmp_path, "eager")
    assert len(_csv(tmp_path, "eager").splitlines()) > 11


def test_after_the_fit_the_trainer_its_connector_and_its_logger_are_as_they_were(tmp_path):
    eager = _fit(tmp_path, "eager", None)
    deferred = _fit(tmp_path, "deferred", "deferred_logging")
    assert type(deferred._logger_connector) is type(eager._logger_connector)
    assert vars(deferred._logger_connector).keys() == vars(eager._logger_connector).keys()
    assert vars(deferred).keys() == vars(eager).keys() and "save_checkpoint" not in vars(deferred)
    assert vars(deferred.logger).keys() == vars(eager.logger).keys()
    assert not deferred.logger.experiment.metrics  # every row was saved to the file


def test_what_cannot_be_deferred_is_skipped_with_the_reason(tmp_path):
    twice = _fit(
        tmp_path, "twice", None, callbacks=[SpeedupCallback("deferred_logging"), *callbacks("deferred_logging")]
    )
    assert [(r.status, r.reason) for r in records_of(twice)] == [
        ("applied", ""),
        ("skipped", "this Trainer's logged values are deferred already (another deferred_logging callback)"),
    ]
    bare = Trainer(max_steps=2, accelerator="cpu", barebones=True, callbacks=callbacks("deferred_logging"))
    bare.fit(Logs(), _loader(16, 1))
    assert [(r.status, r.reason) for r in records_of(bare)] == [
        ("skipped", "Trainer(barebones=True) logs nothing: there is no read to defer")
    ]


def test_the_plain_loop_skips_it_it_has_no_logging():
    model = torch.nn.Linear(16, 4)
    loop = FastLoop(
        model,
        torch.optim.SGD(model.parameters(), lr=0.1),
        _loader(32, 1),
        loss_fn=torch.nn.functional.cross_entropy,
        speedups="deferred_logging",
        device="cpu",
    )
    rec = loop.train(steps=2).records[0]
    assert (rec.status, rec.reason) == (
        "skipped",
        "the plain loop has no logging to defer: FastLoop keeps the step's losses on the device and reads them "
        "once, at the end",
    )


class Pair(LightningModule):
    """Logs a torchmetrics Metric whose value has two elements (Lightning refuses it when it writes
    the row)."""

    def __init__(self) -> None:
        import torchmetrics

        super().__init__()
        self.net = torch.nn.Linear(16, 4)

        class Two(torchmetrics.Metric):
            def __init__(self):
                super().__init__()
                self.add_state("total", torch.zeros(2), dist_reduce_fx="sum")

            def update(self, x):
                self.total += x.mean()

            def compute(self):
                return self.total

        self.two = Two()

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.cross_entropy(self.net(x), y)
        self.two(x)
        self.log("two", self.two, on_step=False, on_epoch=True)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def test_a_logged_value_of_several_elements_fails_as_it_does_eagerly(tmp_path):
    errors = []
    for tag, spec in (("eager", None), ("deferred", "deferred_logging")):
        with pytest.raises(ValueError) as err:
            _fit(tmp_path, tag, spec, build=Pair, max_epochs=1, limit_val_batches=0)
        errors.append(str(err.value))
    assert errors[0] == errors[1] and "single element" in errors[0]


def test_keep_and_read_give_what_item_gives_bit_for_bit():
    g = torch.Generator().manual_seed(0)
    values = {
        "f32": torch.randn((), generator=g),
        "f64": torch.randn((), generator=g, dtype=torch.float64),
        "bf16": torch.randn((), generator=g).bfloat16(),
        "one": torch.randn(1, generator=g),
        "int": torch.tensor(7),
        "bool": torch.tensor(True),
        "tiny": torch.tensor(1e-40),  # a float32 subnormal
        "inf": torch.tensor(-math.inf),
        "plain": 0.1,
    }
    want = {k: v.item() if torch.is_tensor(v) else v for k, v in values.items()}
    kept = keep(values)
    for t in values.values():
        if torch.is_tensor(t) and t.is_floating_point():
            t.add_(1)  # later in-place changes do not reach what was kept
    (read,) = read_to_host([kept])
    assert read == want
    assert all(type(read[k]) is type(want[k]) for k in want)
    assert all(math.copysign(1, read[k]) == math.copysign(1, want[k]) for k in want if k != "plain")


def test_the_options_are_checked():
    assert resolve("deferred_logging:10:seconds=2.0")[0].spec == "deferred_logging:10:seconds=2.0"
    assert resolve("deferred_logging:none")[0].spec == "deferred_logging:none"
    for bad, message in (
        ("deferred_logging:0", "every must be an integer >= 1 or none, got 0"),
        ("deferred_logging:seconds=0", "seconds must be a number in (0, 3600] or none, got 0.0"),
        ("deferred_logging:none:seconds=none", "every must be an integer >= 1 where seconds is none"),
    ):
        with pytest.raises(FastloopError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
            resolve(bad)


class OnDevice(Logs):
    """:class:`Logs` logging tensors only (Lightning makes a Python float into a device tensor at each
    ``self.log``, a copy this speedup leaves as it is)."""

    def training_step(self, batch, batch_idx):
        x, y = batch
        out = self.net(x)
        loss = torch.nn.functional.cross_entropy(out, y)
        self.log("loss", loss, prog_bar=True)
        self.log("acc", (out.argmax(1) == y).float().mean(), on_step=True, on_epoch=True, prog_bar=True)
        self.log("x_max", x.max(), on_step=False, on_epoch=True, reduce_fx="max")
        return loss


class SyncsInSteadySteps(Callback):
    """CUDA's sync debug mode on from the start of step ``first`` to the start of step ``last`` (the
    steps in between whole, the reads after each included; the first step's own copies of Lightning's
    metric states to the device not): every synchronizing call there is a warning."""

    def __init__(self, first: int, last: int) -> None:
        self.first, self.last = first, last

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if trainer.global_step == self.first:
            torch.cuda.set_sync_debug_mode("warn")
        if trainer.global_step == self.last:
            torch.cuda.set_sync_debug_mode(0)


@pytest.mark.gpu
def test_on_cuda_the_host_waits_for_logged_values_once_per_read_not_every_step(tmp_path):
    """A tiny module on the GPU with two prog_bar values and a row every step, its batches already
    on the device (no copy to sync on), 60 steady steps counted: eagerly the host waits for the GPU
    at least once a step; deferred, reading every 10 steps, at most once per 10 steps (one more at
    the window's edge); the logger's file is the eager one."""
    from lightning.pytorch.loggers import CSVLogger

    from fastloop.measure.sync_site import SYNC_WARNING, warnings_with_stacks

    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(640, 16, generator=g).cuda(), torch.randint(0, 4, (640,), generator=g).cuda()
    first, last, every = 10, 70, 10

    def syncs(tag: str, spec: str | None) -> int:
        torch.manual_seed(0)
        trainer = Trainer(
            max_epochs=1,
            accelerator="gpu",
            devices=1,
            logger=CSVLogger(str(tmp_path), name=tag, version=0),
            log_every_n_steps=1,
            limit_val_batches=0,
            enable_checkpointing=False,
            enable_model_summary=False,
            callbacks=[SyncsInSteadySteps(first, last), *callbacks(spec)],
        )
        try:
            with warnings_with_stacks() as seen:
                trainer.fit(OnDevice(), DataLoader(TensorDataset(x, y), batch_size=8))
        finally:
            torch.cuda.set_sync_debug_mode(0)
        return sum(SYNC_WARNING in str(w.message) for w, _ in seen)

    eager = syncs("eager", None)
    deferred = syncs("deferred", f"deferred_logging:{every}:seconds=none")
    steps = last - first
    assert eager >= steps, f"eager: {eager} syncs in {steps} steps"
    assert deferred <= steps // every + 1, f"deferred: {deferred} syncs in {steps} steps (eager: {eager})"
    assert _csv(tmp_path, "deferred") == _csv(tmp_path, "eager")


@pytest.mark.slow
def test_values_reduced_across_processes_are_written_as_eagerly(tmp_path):
    """Two CPU processes (gloo) logging with sync_dist=True, on_step and on_epoch, mean and max:
    rank 0's CSVLogger file with deferred reads is the eager one byte for byte (the reductions are
    Lightning's own, at the same moments; only the reads wait)."""
    import subprocess

    files = []
    for tag, spec in (("eager", []), ("deferred", ["deferred_logging:3:seconds=none"])):
        proc = subprocess.run(
            [sys.executable, "tests/ddp_logging.py", str(tmp_path / tag), *spec],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert proc.returncode == 0, proc.stderr[-2000:]
        files.append((tmp_path / tag / "run" / "version_0" / "metrics.csv").read_text())
    assert files[0] == files[1] and len(files[0].splitlines()) > 2 * 8


def test_with_the_whole_step_graphed_the_replays_values_are_written(tmp_path, monkeypatch):
    """cuda_graph's whole-step graph (on the CPU stand-in of tests/graph_standin.py) writes the
    logged values into the same tensors at every replay, and re-logs them: the rows read late are
    each step's own, the file the one of cuda_graph with eager logging."""
    from tests import graph_standin

    graph_standin.install(monkeypatch)
    graphed = _fit(tmp_path, "eager", "cuda_graph", build=OnDevice, log_every_n_steps=1)
    _fit(tmp_path, "deferred", "cuda_graph,deferred_logging:5:seconds=none", build=OnDevice, log_every_n_steps=1)
    rec = {r.name: r for r in records_of(graphed)}["cuda_graph"]
    assert rec.status == "applied" and "whole step" in rec.detail, rec
    assert _csv(tmp_path, "deferred") == _csv(tmp_path, "eager")
    rows = csv.DictReader(io.StringIO(_csv(tmp_path, "eager")))
    losses = [row["loss"] for row in rows if row["loss"]]
    assert len(set(losses)) == len(losses) == 2 * STEPS_PER_EPOCH, losses  # each step's own value
