"""The logger of a measured run: the user's code that writes to ``self.logger`` runs, and nothing
is written.

Users log hyperparameters in ``on_train_start`` (``self.logger.log_hyperparams``), and images,
histograms or text through ``self.logger.experiment`` (TensorBoard's ``add_image``, W&B's
``log``). A Trainer with ``logger=False`` has ``self.logger`` None, and such a module failed in
every run with "'NoneType' object has no attribute ...". A run's logs are not the training's,
so fastloop's Trainer gets this logger: every call on it, or on its experiment, does nothing.

Example:
    >>> log = SilentLogger()
    >>> log.log_hyperparams({"lr": 0.1}); log.log_metrics({"loss": 1.0}, step=0)
    >>> log.experiment.add_image("sample", None, 0) is log.experiment
    True
    >>> log[0].experiment.log({"x": 1}) is log.experiment
    True
"""

from __future__ import annotations

import os
from typing import Any

from fastloop._compat import Logger

__all__ = ["SilentLogger"]


class _Nothing:
    """Any attribute is this object again, and calling it returns it: ``experiment.add_image(...)``,
    ``experiment.log({...})``, ``experiment.summary["best"] = 1``."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return self

    def __call__(self, *args: Any, **kwargs: Any) -> _Nothing:
        return self

    def __getitem__(self, key: Any) -> _Nothing:
        return self

    def __setitem__(self, key: Any, value: Any) -> None:
        pass


class SilentLogger(Logger):
    """A Lightning logger that writes nothing (see the module's docstring)."""

    def __init__(self) -> None:
        super().__init__()
        self._experiment = _Nothing()

    @property
    def name(self) -> str:
        return "fastloop"

    @property
    def version(self) -> int:
        return 0

    @property
    def experiment(self) -> Any:
        return self._experiment

    @property
    def save_dir(self) -> str:
        """The working directory, as ``trainer.log_dir`` was without a logger (Lightning's
        ``default_root_dir``): nothing is made here."""
        return os.getcwd()

    @property
    def log_dir(self) -> str:
        return self.save_dir

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        pass

    def log_hyperparams(self, params: Any, *args: Any, **kwargs: Any) -> None:
        pass

    def __getitem__(self, idx: int) -> SilentLogger:
        return self
