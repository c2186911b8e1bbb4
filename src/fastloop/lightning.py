"""fastloop for a Lightning ``Trainer``: the public entry point (the adapter lives in
:mod:`fastloop.adapters.lightning`).

Example:
    >>> from fastloop.lightning import callbacks
    >>> [type(c).__name__ for c in callbacks("bf16,compile")]
    ['SpeedupCallback', 'SpeedupCallback']

    ``Trainer(callbacks=callbacks("workers,pin_memory,prefetch,bf16,fused_optimizer,compile"))``
"""

from __future__ import annotations

from fastloop.adapters.lightning import BatchSizeSearch, SpeedupCallback, callback_for, callbacks, records_of

__all__ = ["BatchSizeSearch", "SpeedupCallback", "callback_for", "callbacks", "records_of"]
