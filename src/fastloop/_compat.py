"""Import Lightning under either of its names.

CI installs the ``lightning`` package; some machines (our GPU box) ship only
``pytorch_lightning``. Both expose the same Trainer, callbacks and modules.
"""

from __future__ import annotations

try:  # pragma: no cover - which branch runs depends on the machine
    import lightning.pytorch as pl
    from lightning.pytorch import (
        Callback,
        LightningDataModule,
        LightningModule,
        Trainer,
    )
    from lightning.pytorch.loggers import Logger
    from lightning.pytorch.profilers import PassThroughProfiler
    from lightning.pytorch.strategies import DDPStrategy, FSDPStrategy, SingleDeviceStrategy
except ImportError:  # pragma: no cover
    import pytorch_lightning as pl  # type: ignore[no-redef]
    from pytorch_lightning import (  # type: ignore[no-redef,assignment]
        Callback,
        LightningDataModule,
        LightningModule,
        Trainer,
    )
    from pytorch_lightning.loggers import Logger  # type: ignore[no-redef]
    from pytorch_lightning.profilers import PassThroughProfiler  # type: ignore[no-redef]
    from pytorch_lightning.strategies import DDPStrategy, FSDPStrategy, SingleDeviceStrategy  # type: ignore[no-redef]

LIGHTNING_DEFAULT_MAX_EPOCHS = 1000
"""A Trainer given neither ``max_epochs`` nor ``max_steps`` trains this many epochs (Lightning's
``_parse_loop_limits``); ``estimated_stepping_batches`` counts from it."""

__all__ = [
    "LIGHTNING_DEFAULT_MAX_EPOCHS",
    "Callback",
    "DDPStrategy",
    "FSDPStrategy",
    "LightningDataModule",
    "LightningModule",
    "Logger",
    "PassThroughProfiler",
    "SingleDeviceStrategy",
    "Trainer",
    "pl",
]
