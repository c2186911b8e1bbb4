"""async_checkpoint: the file written in the background is the synchronous save of the
same step, byte for byte, though training changes the weights while it is written; Ctrl-C during a
write leaves the previous checkpoint and no partial file; a second save waits for the first; a
deletion of a file being written waits for it; ModelCheckpoint's top-k keeps working.

The slow writer: each piece torch.save writes sleeps first (``_slow``), so training runs on while
the file is written. The files are compared byte for byte (not tensor by tensor): the bytes also
hold the pickled structure, which storages are shared, and each storage's device tag."""

from __future__ import annotations

import importlib.util
import io
import os
import pickle
import signal
import threading
import time
import warnings
from pathlib import Path

import pytest
import torch

import fastloop.adapters.lightning_checkpoint as lightning_checkpoint
import fastloop.speedups.async_checkpoint as ac
from fastloop._compat import Callback, Logger, Trainer
from fastloop.lightning import callbacks, records_of
from fastloop.loop import FastLoop
from fastloop.speedups.async_checkpoint import STATS_KEY, CheckpointWriter, write_checkpoint
from tests.targets import tiny_mlp

pytestmark = pytest.mark.filterwarnings("ignore")


def _slow(monkeypatch, delay: float = 0.02, active: list | None = None, gate: threading.Event | None = None) -> None:
    """Every piece the writer writes waits ``delay`` first (while ``gate`` is set, when given);
    ``active`` gets the number of writes under way at each piece."""
    original = ac._ChunkedFile.write

    def write(self, data):
        if gate is None or gate.is_set():
            time.sleep(delay)
        if active is not None:
            active.append(sum(t.name == "fastloop-checkpoint-writer" for t in threading.enumerate()))
        return original(self, data)

    monkeypatch.setattr(ac._ChunkedFile, "write", write)


def _sync_bytes(obj) -> bytes:
    """What Lightning's synchronous save writes (torch.save into memory, then to the file)."""
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def _files(folder) -> list[str]:
    return sorted(os.listdir(folder))


class _SaveAt(Callback):
    """Saves ``path`` after the training step ``step`` (and then raises ``then``, if given)."""

    def __init__(self, path: str, step: int, then: BaseException | None = None) -> None:
        self.path, self.step, self.then = path, step, then

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if trainer.global_step == self.step:
            trainer.save_checkpoint(self.path)
            if self.then is not None:
                raise self.then


def _trainer(callbacks_: list, steps: int = 8, enable_checkpointing: bool = False, logger=False, **kw) -> Trainer:
    return Trainer(
        max_steps=steps,
        accelerator="cpu",
        logger=logger,
        enable_checkpointing=enable_checkpointing,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=callbacks_,
        **kw,
    )


def test_the_async_file_is_the_synchronous_save_of_the_same_step_byte_for_byte(tmp_path, monkeypatch):
    """Two fits from the same seed, each saving after step 3 and training on to step 8: the plain
    Trainer's synchronous save and async_checkpoint's (written slowly, while steps 4-8 change the
    weights in place) are the same bytes, and the async fit's weights did move on meanwhile."""
    (tmp_path / "sync").mkdir()
    module, loader = tiny_mlp()
    _trainer([_SaveAt(str(tmp_path / "sync" / "ck.ckpt"), 3)]).fit(module, train_dataloaders=loader)
    _slow(monkeypatch)
    module, loader = tiny_mlp()
    trainer = _trainer([_SaveAt(str(tmp_path / "async" / "ck.ckpt"), 3), *callbacks("async_checkpoint")])
    trainer.fit(module, train_dataloaders=loader)
    assert {r.name: r.status for r in records_of(trainer)} == {"async_checkpoint": "applied"}
    sync, done = (tmp_path / "sync" / "ck.ckpt").read_bytes(), (tmp_path / "async" / "ck.ckpt").read_bytes()
    assert done == sync
    saved = torch.load(tmp_path / "async" / "ck.ckpt", weights_only=False)["state_dict"]["net.0.weight"]
    assert not torch.equal(saved, module.net[0].weight.detach()), "training did not move on: no race was tested"
    assert _files(tmp_path / "async") == ["ck.ckpt"]


def test_shared_storages_parameters_and_state_dict_metadata_are_written_as_torch_save_does(tmp_path, monkeypatch):
    """Tied weights (one storage, two keys), a view at an offset, a Parameter, the state_dict's
    ``_metadata``: the background file has the bytes of a synchronous torch.save, and loading it
    ties the weights again."""
    _slow(monkeypatch)
    net = torch.nn.Sequential(torch.nn.Embedding(10, 4), torch.nn.Linear(4, 10, bias=False))
    net[1].weight = net[0].weight  # tied
    state = {"state_dict": net.state_dict(), "tail": net[0].weight.detach()[3:], "p": torch.nn.Parameter(torch.ones(2))}
    want = _sync_bytes(state)
    writer = CheckpointWriter()
    writer.save(state, tmp_path / "tied.ckpt")
    with torch.no_grad():
        net[0].weight.mul_(2.0)
        state["p"].add_(1.0)
    writer.close()
    assert (tmp_path / "tied.ckpt").read_bytes() == want
    back = torch.load(tmp_path / "tied.ckpt", weights_only=False)["state_dict"]
    assert back["0.weight"].data_ptr() == back["1.weight"].data_ptr()


def test_ctrl_c_during_a_save_leaves_the_previous_checkpoint_and_no_partial_file(tmp_path, monkeypatch):
    """A save after step 2 (complete), then one after step 5 written slowly, and Ctrl-C right after
    it starts: the fit ends promptly (the write abandoned, not waited for), the checkpoint on disk
    is step 2's, whole, and no partial file is left."""
    gate = threading.Event()
    _slow(monkeypatch, delay=0.2, gate=gate)
    path = str(tmp_path / "last.ckpt")
    before: list[bytes] = []

    class Interrupt(Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
            if trainer.global_step == 2:
                trainer.save_checkpoint(path)
            if trainer.global_step == 5:
                trainer.strategy.checkpoint_io.load_checkpoint(path)  # waits for step 2's write
                before.append(open(path, "rb").read())
                gate.set()
                trainer.save_checkpoint(path)
                raise KeyboardInterrupt

    handler = signal.getsignal(signal.SIGINT)
    module, loader = tiny_mlp()
    trainer = _trainer([Interrupt(), *callbacks("async_checkpoint")])
    t0 = time.perf_counter()
    try:
        with pytest.raises(SystemExit):  # Lightning's graceful shutdown after Ctrl-C ends with exit(1)
            trainer.fit(module, train_dataloaders=loader)
    finally:
        signal.signal(signal.SIGINT, handler)  # Lightning ignores Ctrl-C from then on
    assert time.perf_counter() - t0 < 10, "the interrupted fit waited for the slow write"
    assert before and open(path, "rb").read() == before[0]
    assert _files(tmp_path) == ["last.ckpt"]
    torch.load(path, weights_only=False)  # whole


def test_a_second_save_waits_for_the_first_and_neither_is_skipped(tmp_path, monkeypatch):
    active: list[int] = []
    _slow(monkeypatch, delay=0.01, active=active)
    writer = CheckpointWriter()
    first, second = {"w": torch.arange(2000.0)}, {"w": torch.arange(2000.0) * 2}
    writer.save(first, tmp_path / "a.ckpt")
    writer.save(second, tmp_path / "b.ckpt")
    assert writer.record["waited_s"][1] > 0.01, writer.record  # the second waited for the first
    writer.close()
    assert max(active) == 1, f"{max(active)} writes were under way at once"
    assert (tmp_path / "a.ckpt").read_bytes() == _sync_bytes(first)
    assert (tmp_path / "b.ckpt").read_bytes() == _sync_bytes(second)
    assert writer.record["saves"] == 2 and all(s is not None for s in writer.record["write_s"])


def test_deleting_a_file_still_being_written_waits_for_it(tmp_path, monkeypatch):
    """A deletion right after the save (ModelCheckpoint's top-k may delete any file it wrote):
    without waiting, the deletion finds nothing and the rename that ends the write brings the file
    back."""
    _slow(monkeypatch)
    trainer = _trainer([])
    undo: list = []
    lightning_checkpoint.install_checkpoint_writer(trainer, CheckpointWriter(), undo)
    io_ = trainer.strategy.checkpoint_io
    path = str(tmp_path / "gone.ckpt")
    io_.save_checkpoint({"w": torch.ones(3000)}, path)
    io_.remove_checkpoint(path)
    undo.pop()()
    assert _files(tmp_path) == []


def test_model_checkpoint_top_k_keeps_the_best_k_and_nothing_else(tmp_path, monkeypatch):
    """ModelCheckpoint saving every step and keeping the best 2 by train_loss, its files written
    slowly: at the end exactly its best 2 are on disk (a deleted file never comes back), whole."""
    from fastloop._compat import pl

    _slow(monkeypatch, delay=0.005)
    module, loader = tiny_mlp()
    top = pl.callbacks.ModelCheckpoint(
        dirpath=tmp_path, monitor="train_loss", save_top_k=2, every_n_train_steps=1, filename="{step}"
    )
    trainer = _trainer([top, *callbacks("async_checkpoint")], enable_checkpointing=True)
    trainer.fit(module, train_dataloaders=loader)
    kept = sorted(os.path.basename(p) for p in top.best_k_models)
    assert _files(tmp_path) == kept and len(kept) == 2
    for name in kept:
        torch.load(tmp_path / name, weights_only=False)
    cb = next(c for c in trainer.callbacks if getattr(c, "speedup", None) is not None)
    saved = cb.ctx.stats[STATS_KEY]
    assert saved["saves"] > len(kept) and saved["at_once"] == 0, saved  # files were deleted along the way


class Tagged(torch.Tensor):
    """A tensor subclass (the snapshot copies plain tensors and Parameters only)."""


class ReadingLogger(Logger):
    """A logger that reads each checkpoint as soon as it is saved (as W&B's uploads it)."""

    name, version = "reading", 0
    read: list = []

    def log_metrics(self, metrics, step=None) -> None:
        pass

    def log_hyperparams(self, params, *args, **kwargs) -> None:
        pass

    def after_save_checkpoint(self, checkpoint_callback) -> None:
        with open(checkpoint_callback.last_model_path, "rb") as f:
            self.read.append(f.read())


def test_a_logger_that_reads_each_checkpoint_as_it_is_saved_reads_it_whole(tmp_path, monkeypatch):
    from fastloop._compat import pl

    _slow(monkeypatch, delay=0.005)
    logger = ReadingLogger()
    logger.read = []
    module, loader = tiny_mlp()
    last = pl.callbacks.ModelCheckpoint(dirpath=tmp_path, save_last=True, every_n_train_steps=2, save_top_k=0)
    trainer = _trainer([last, *callbacks("async_checkpoint")], steps=6, enable_checkpointing=True, logger=logger)
    trainer.fit(module, train_dataloaders=loader)
    steps = [torch.load(io.BytesIO(b), weights_only=False)["global_step"] for b in logger.read]
    assert steps == [2, 4, 6], steps  # each read whole, and the one just saved
    assert logger.read[-1] == (tmp_path / "last.ckpt").read_bytes()
    cb = next(c for c in trainer.callbacks if getattr(c, "speedup", None) is not None)
    assert cb.ctx.stats[STATS_KEY]["waits_for_loggers"] == ["ReadingLogger"]


def test_what_a_snapshot_cannot_copy_is_written_at_once_and_the_record_says_why(tmp_path):
    writer = CheckpointWriter()
    state = {"w": torch.ones(3).as_subclass(Tagged)}
    writer.save(state, tmp_path / "now.ckpt")
    assert writer.in_flight() is None and (tmp_path / "now.ckpt").exists()
    assert writer.record["at_once"] == 1 and "Tagged (a tensor subclass)" in writer.record["why_at_once"]


def test_an_error_of_a_background_write_is_raised_by_the_next_call(tmp_path):
    writer = CheckpointWriter()
    writer.save({"w": torch.ones(2)}, tmp_path / "missing-folder" / "x.ckpt")
    with pytest.raises(FileNotFoundError):
        writer.close()
    writer.save({"w": torch.ones(2)}, tmp_path / "ok.ckpt")  # still usable
    writer.close()
    assert _files(tmp_path) == ["ok.ckpt"]


def test_a_failed_write_leaves_the_file_it_would_replace(tmp_path):
    path = tmp_path / "keep.ckpt"
    write_checkpoint({"w": torch.zeros(2)}, path)
    before = path.read_bytes()
    with pytest.raises((AttributeError, pickle.PicklingError)):
        write_checkpoint({"f": lambda: None}, path)  # a lambda cannot be pickled: torch.save fails midway
    assert path.read_bytes() == before and _files(tmp_path) == ["keep.ckpt"]


def test_a_checkpoint_io_of_your_own_or_an_async_one_is_left_alone():
    from fastloop._compat import pl

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        module, loader = tiny_mlp()
        trainer = _trainer(callbacks("async_checkpoint"), steps=1, plugins=[pl.plugins.io.AsyncCheckpointIO()])
        trainer.fit(module, train_dataloaders=loader)
    rec = records_of(trainer)[0]
    assert rec.status == "skipped" and "AsyncCheckpointIO (already asynchronous)" in rec.reason, rec


def test_fastloop_saves_the_same_file_with_and_without_it(tmp_path, monkeypatch):
    """The plain loop's save_checkpoint: at once without the speedup, in the background with it,
    the same bytes for the same state; extra entries beside the model's and optimizer's."""
    _slow(monkeypatch, delay=0.002)
    files = {}
    for spec in ("none", "async_checkpoint"):
        module, loader = tiny_mlp()
        opt = torch.optim.SGD(module.net.parameters(), lr=0.1)
        loop = FastLoop(module.net, opt, loader, loss_fn=torch.nn.functional.cross_entropy, speedups=spec, device="cpu")
        loop.train(steps=3)
        loop.save_checkpoint(tmp_path / f"{spec}.ckpt", step=3)
        loop.train(steps=3)
        loop.wait_for_checkpoints()
        files[spec] = (tmp_path / f"{spec}.ckpt").read_bytes()
    assert files["none"] == files["async_checkpoint"]
    assert sorted(torch.load(tmp_path / "none.ckpt")) == ["model", "optimizer", "step"]
    with pytest.raises(ValueError, match="writes model itself"):
        loop.save_checkpoint(tmp_path / "x.ckpt", model=1)


@pytest.mark.gpu
def test_a_gpu_snapshot_in_pinned_memory_is_saved_as_the_gpu_tensors_it_copied(tmp_path, monkeypatch):
    """On CUDA the snapshot is a pinned host copy, tagged with the original device: the file is the
    bytes of a synchronous torch.save of the CUDA tensors, though the weights change on the GPU
    while it is written, and it loads back onto the GPU."""
    _slow(monkeypatch)
    net = torch.nn.Linear(256, 256).cuda()
    opt = torch.optim.AdamW(net.parameters())
    net(torch.randn(8, 256, device="cuda")).sum().backward()
    opt.step()
    state = {"state_dict": net.state_dict(), "optimizer": opt.state_dict()}
    want = _sync_bytes(state)
    writer = CheckpointWriter()
    writer.save(state, tmp_path / "gpu.ckpt")
    for _ in range(5):  # the GPU changes the weights and the optimizer's state while the file is written
        net(torch.randn(8, 256, device="cuda")).sum().backward()
        opt.step()
    writer.close()
    assert (tmp_path / "gpu.ckpt").read_bytes() == want
    back = torch.load(tmp_path / "gpu.ckpt")
    assert back["state_dict"]["weight"].device.type == "cuda"


def test_the_checkpoint_benchmark_runs_on_a_cpu_and_finds_the_files_equal(monkeypatch, capsys):
    """``benchmarks/run.py checkpoint`` in small (the GPU's run is the must-show): both modes time
    their saves, and the same-step files compare equal."""
    monkeypatch.delenv("OUT", raising=False)
    path = Path(__file__).resolve().parents[1] / "benchmarks" / "checkpoint_bench.py"
    spec = importlib.util.spec_from_file_location("checkpoint_bench", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    assert bench.main(["--device", "cpu", "--mb", "1", "--saves", "2", "--every", "2"]) == 0
    out = capsys.readouterr().out
    assert '"files_equal": true' in out and "| async_checkpoint |" in out
