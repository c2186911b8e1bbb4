"""The batch-size search as a Lightning callback (:class:`BatchSizeSearch`): a shell over
:func:`fastloop.speedups.batch_size.batch_size.search_batch_size`, as Lightning's own ``BatchSizeFinder`` is
over its tuner function.
"""

from __future__ import annotations

from torch.utils.data import DataLoader

from fastloop._compat import Callback, LightningModule, Trainer
from fastloop.adapters._lightning_private import set_train_source, train_source
from fastloop.data import rebuild_loader
from fastloop.errors import FastloopError
from fastloop.speedups.base import Record, Speedup, resolve
from fastloop.speedups.batch_size.batch_size import BatchSize, search_batch_size

__all__ = ["BatchSizeSearch"]


class BatchSizeSearch(Callback):
    """Search the batch size at the start of ``fit`` (see :mod:`fastloop.speedups.batch_size`).

    The Trainer's optimizers, schedulers and loop counters are untouched; the chosen size is
    written where Lightning's own ``BatchSizeFinder`` looks (the LightningModule's or the
    DataModule's ``batch_size`` attribute or hparam) before the loaders are built; a DataLoader
    given to ``fit`` is rebuilt at that size. The result document is in :attr:`result`, the
    outcome in :attr:`record` (``skipped`` with the reason when the size cannot be changed).

    Args:
        objective: ``"throughput"`` (fastest that fits under the margin) or ``"max"``.
        margin: use at most this fraction of the largest fitting size.
        max_size: never try above this.
        speedups: the speedups the run trains with (the search steps use their precision).
    """

    def __init__(
        self,
        objective: str = "throughput",
        margin: float = 0.9,
        max_size: int = 4096,
        speedups: str | list[str | Speedup] | None = None,
    ) -> None:
        if objective not in ("max", "throughput"):
            raise ValueError(f"objective must be 'max' or 'throughput', got {objective!r}")
        if isinstance(margin, bool) or not isinstance(margin, (int, float)) or not 0 < margin <= 1:
            raise ValueError(f"margin must be a number in (0, 1], got {margin!r}")
        if isinstance(max_size, bool) or not isinstance(max_size, int) or max_size < 1:
            raise ValueError(f"max_size must be an integer >= 1, got {max_size!r}")
        self.speedups: list[Speedup] | None = resolve(speedups) if speedups is not None else None
        """The speedups as objects (unknown names fail here, not at fit)."""
        self.objective, self.margin, self.max_size = objective, margin, max_size
        self.result: dict | None = None
        self._record = Record(BatchSize.name, "skipped", "the Trainer never started fit")

    @property
    def record(self) -> Record:
        return self._record

    def on_fit_start(self, trainer: Trainer, pl_module: LightningModule) -> None:

        src = train_source(trainer)
        data = trainer.datamodule if trainer.datamodule is not None else src
        if data is pl_module:
            data = None  # the module's own train_dataloader()
        try:
            self.result = search_batch_size(
                pl_module,
                data,
                speedups=self.speedups,
                device=str(trainer.strategy.root_device),
                max_size=self.max_size,
                objective=self.objective,
                margin=self.margin,
                trainer_optimizers=trainer.optimizers,
                attached=True,
                trainer_precision=str(trainer.precision),
            )
        except FastloopError as err:
            self._record = Record(BatchSize.name, "skipped", str(err))
            return
        r = self.result
        if isinstance(src, DataLoader) and src.batch_size != r["batch_size"]:
            set_train_source(trainer, rebuild_loader(src, batch_size=r["batch_size"]))
        self._record = Record(
            BatchSize.name,
            "applied",
            detail=f"batch size {r['batch_size']} (largest fitting "
            f"{r['max_fitting']}, written to {r['written_to']}, "
            f"search {r['search_s']:.1f} s)",
        )
