"""What a target's fit does beside its training steps, read off the target without running it: the
share-of-the-fit note of ``run``, ``ladder`` and ``ab`` (:mod:`fastloop.drivers.fit_share`), the
fit's own record (:mod:`fastloop.drivers.fit`) and the ladder's fit objective (which fit speedups
have something to speed up) read the same answer.

Example:
    >>> from fastloop._compat import LightningModule
    >>> fit_parts(LightningModule(), None, {"logger": False})
    {'validates': False, 'checkpoints': True, 'progress_bar': True, 'logs': False}
"""

from __future__ import annotations

from typing import Any

__all__ = ["fit_parts"]


def fit_parts(module: Any, data: Any, trainer_kwargs: dict) -> dict:
    """What the target's fit does beside its training steps, read off the module, its data and its
    Trainer settings.

    Args:
        module: the target's LightningModule (read, not run).
        data: its LightningDataModule, training loader or None.
        trainer_kwargs: the Trainer settings the target gives.

    Returns:
        ``validates`` (a ``validation_step`` and a validation loader, not turned off), ``checkpoints``
        (Lightning checkpoints unless told not to), ``progress_bar`` (a progress bar unless told not
        to), ``logs`` (a logger unless told not to).
    """
    from fastloop._compat import LightningDataModule, LightningModule

    own_loader = type(module).val_dataloader is not LightningModule.val_dataloader
    data_loader = isinstance(data, LightningDataModule) and (
        type(data).val_dataloader is not LightningDataModule.val_dataloader
    )
    limit = trainer_kwargs.get("limit_val_batches")
    return {
        "validates": type(module).validation_step is not LightningModule.validation_step
        and (own_loader or data_loader)
        and limit not in (0, 0.0),
        "checkpoints": trainer_kwargs.get("enable_checkpointing", True) is not False,
        "progress_bar": trainer_kwargs.get("enable_progress_bar", True) is not False,
        "logs": trainer_kwargs.get("logger", True) not in (False, None, []),
    }
