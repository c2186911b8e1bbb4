"""Load a target: ``FILE.py:FUNCTION``, ``package.module:FUNCTION`` or a recipe's short name.

The function takes keyword arguments (all optional) and returns ``(lightning_module, data)``,
where data is a ``LightningDataModule`` or a training ``DataLoader``; or
``(lightning_module, data, trainer_kwargs)``, where ``trainer_kwargs`` is the dict of ``Trainer``
keyword arguments the user trains with (``{"gradient_clip_val": 1.0, "precision": "bf16-mixed"}``):
every run of ``run``, ``ladder`` and ``ab`` builds its Trainer with them, and fastloop's speedups
respect them as the callbacks do in the user's own Trainer (a precision the user chose is kept).

Example:
    >>> load_target("nonexistent.py:make")
    Traceback (most recent call last):
    ...
    fastloop.errors.FastloopError: target file not found: nonexistent.py
"""

from __future__ import annotations

import importlib
import importlib.util
import math
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from torch.utils.data import DataLoader

from fastloop._compat import LIGHTNING_DEFAULT_MAX_EPOCHS, Callback, LightningDataModule, LightningModule
from fastloop.errors import FastloopError, UserCodeError, shorten

__all__ = [
    "OWNED_CALLBACKS",
    "OWNED_TRAINER_KWARGS",
    "RECIPES",
    "TrainingLength",
    "build_target",
    "check_trainer_kwargs",
    "load_target",
    "recipe_fit_settings",
    "recipe_rungs",
]

OWNED_TRAINER_KWARGS: dict[str, str] = {
    **{
        k: "fastloop sets how long a measured run trains (configure_optimizers still sees this length: "
        "trainer.estimated_stepping_batches, trainer.max_epochs)"
        for k in ("max_steps", "max_epochs")
    },
    **{
        k: "fastloop sets how long a measured run trains"
        for k in ("min_steps", "min_epochs", "max_time", "limit_train_batches")
    },
    **{
        k: "fastloop's runs do not validate"
        for k in ("limit_val_batches", "num_sanity_val_steps", "val_check_interval", "check_val_every_n_epoch")
    },
    **{
        k: "fastloop chooses the device (--device) and the number of devices (--devices, --strategy)"
        for k in ("accelerator", "devices", "strategy", "num_nodes")
    },
    **{
        k: "fastloop's runs write no logs, checkpoints or progress bars (their cost is not the training's)"
        for k in (
            "logger",
            "enable_checkpointing",
            "enable_progress_bar",
            "enable_model_summary",
            "default_root_dir",
            "log_every_n_steps",
        )
    },
    "profiler": "fastloop's feed clock is the run's profiler",
}
"""Trainer settings a target may not carry, and why: fastloop's measurement owns them (they are
left out of the run, and the report says so). Everything else (gradient_clip_val,
accumulate_grad_batches, precision, deterministic, benchmark, callbacks, ...) is the user's."""

OWNED_CALLBACKS: dict[str, str] = {
    "ModelCheckpoint": "fastloop's runs write no checkpoints",
    "EarlyStopping": "fastloop's runs do not validate, and fastloop sets how long a measured run trains",
    "Timer": "fastloop sets how long a measured run trains",
    "LearningRateMonitor": "fastloop's runs write no logs",
    "DeviceStatsMonitor": "fastloop's runs write no logs",
    "ProgressBar": "fastloop's runs show no progress bars (their cost is not the training's)",
    "ModelSummary": "fastloop's runs print no model summary",
    "BatchSizeFinder": "a search before fit is not the training's step (`fastloop batch-size` searches batch sizes)",
    "LearningRateFinder": "a search before fit is not the training's step",
}
"""Lightning's callbacks a target's Trainer settings may not carry into a measured run, by the
class (or base class) name, and why: each needs what fastloop's runs turn off (a logger,
checkpointing, validation, a progress bar) or changes how long the run trains. The rest of the
user's callbacks run."""


def split_callbacks(callbacks: list) -> tuple[list, dict[str, str]]:
    """(the user's callbacks a run keeps, ``{"callbacks: Name": why}`` for those it leaves out).

    Example:
        >>> from fastloop._compat import pl
        >>> user = [pl.callbacks.LearningRateMonitor(), pl.callbacks.GradientAccumulationScheduler({0: 2})]
        >>> kept, left = split_callbacks(user)
        >>> [type(c).__name__ for c in kept], left
        (['GradientAccumulationScheduler'], {'callbacks: LearningRateMonitor': "fastloop's runs write no logs"})
    """
    kept, left = [], {}
    for cb in callbacks:
        why = next(
            (
                OWNED_CALLBACKS[k.__name__]
                for k in type(cb).__mro__
                if k.__module__.split(".")[0] in ("lightning", "pytorch_lightning") and k.__name__ in OWNED_CALLBACKS
            ),
            None,
        )
        if why is None:
            kept.append(cb)
        else:
            left[f"callbacks: {type(cb).__name__}"] = why
    return kept, left


RECIPES: dict[str, str] = {
    "gpt": "fastloop.recipes.gpt.target:make",
    "demo": "fastloop.recipes.demo.target:make",
    "imagenet": "fastloop.recipes.imagenet.target:make",
}


def recipe_rungs(name: str | None) -> tuple[list[str] | None, list[str]]:
    """A built-in recipe's ladder: its own list of rungs (``LADDER`` in its target module) or
    None, and the rungs it adds to the default ladder (``EXTRA_RUNGS``); (None, []) for any
    other target. The recipes hold their rungs; the drivers know no speedup by name."""
    if name not in RECIPES:
        return None, []
    module = importlib.import_module(RECIPES[name].partition(":")[0])
    own = getattr(module, "LADDER", None)
    return (list(own) if own else None), list(getattr(module, "EXTRA_RUNGS", []))


def recipe_fit_settings(name: str | None) -> dict[str, Any]:
    """A built-in recipe's Trainer settings for ``fastloop fit`` (``FIT_TRAINER`` in its target
    module: how often it validates, as its own training script does); {} for any other target."""
    if name not in RECIPES:
        return {}
    module = importlib.import_module(RECIPES[name].partition(":")[0])
    return dict(getattr(module, "FIT_TRAINER", {}))


def load_target(spec: str) -> Callable[..., Any]:
    """The target's factory function; raises FastloopError with a one-line reason."""
    spec = RECIPES.get(spec, spec)
    if spec.count(":") != 1 or not all(spec.split(":")):
        raise FastloopError(
            f"malformed target {shorten(spec)!r}: use FILE.py:FUNCTION, package.module:FUNCTION, "
            f"or a recipe name ({', '.join(RECIPES)})"
        )
    where, func = spec.split(":")
    if where.endswith(".py"):
        path = Path(where)
        if path.is_dir():
            raise FastloopError(f"target {shorten(where)} is a folder; give a Python file: FILE.py:FUNCTION")
        if not path.is_file():
            raise FastloopError(f"target file not found: {shorten(where)}")
        name = f"_fastloop_target_{abs(hash(str(path.resolve())))}"
        mspec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(mspec)  # type: ignore[arg-type]
        sys.modules[name] = module
        sys.path.insert(0, str(path.resolve().parent))
        try:
            mspec.loader.exec_module(module)  # type: ignore[union-attr]
        except SystemExit as err:
            raise UserCodeError(
                f"importing {shorten(where)} called sys.exit({err.code}); nothing was trained"
            ) from None
        except Exception as err:
            raise UserCodeError(f"while importing {shorten(where)}") from err
        finally:
            sys.path.remove(str(path.resolve().parent))
    else:
        if str(Path.cwd()) not in sys.path:
            sys.path.insert(0, str(Path.cwd()))
        try:
            module = importlib.import_module(where)
        except ModuleNotFoundError as err:
            if err.name and where.startswith(err.name):
                raise FastloopError(f"target module {shorten(where)!r} not found ({err})") from None
            raise UserCodeError(f"while importing {shorten(where)}") from err
        except SystemExit as err:
            raise UserCodeError(
                f"importing {shorten(where)} called sys.exit({err.code}); nothing was trained"
            ) from None
        except Exception as err:
            raise UserCodeError(f"while importing {shorten(where)}") from err
    fn = getattr(module, func, None)
    if fn is None:
        raise FastloopError(f"{shorten(where)} has no function {func!r}")
    if not callable(fn):
        raise FastloopError(f"{shorten(where)}:{func} is not callable")
    return fn


class TrainingLength(Callback):
    """The length of the user's training, shown to their code while the Trainer sets up.

    A measured run has no end of its own (the measurement stops it), so its Trainer says
    ``max_epochs=-1``: ``trainer.estimated_stepping_batches`` would be infinite, and the schedule
    the Lightning docs build from it (``OneCycleLR(total_steps=self.trainer.estimated_stepping_batches)``,
    a warm-up cosine over it) would fail or differ from the user's. From ``setup`` until
    ``on_fit_start`` (``configure_optimizers`` runs in between) the run's Trainer says the user's
    ``max_epochs``/``max_steps`` (the target's Trainer settings), or Lightning's defaults where they
    gave none (1000 epochs); then the run is unbounded again.

    Example:
        >>> TrainingLength.asked({"max_epochs": 30}).lengths(), TrainingLength.asked({}).lengths()
        ((30, -1), (1000, -1))
        >>> TrainingLength.asked({"max_steps": 5000}).lengths()
        (-1, 5000)
    """

    def __init__(self, max_epochs: int | None = None, max_steps: int | None = None) -> None:
        self.max_epochs, self.max_steps = max_epochs, max_steps
        self._run_limits: tuple[Any, int] | None = None
        self.batch_limit: int | None = None
        """Batches the user's own settings train (None: Lightning's default length, or unbounded);
        a run that reaches it stops there, as their training would: their schedule ends there."""
        self.stopped = False

    @classmethod
    def asked(cls, kwargs: object) -> TrainingLength:
        """From a target's Trainer settings (anything else: Lightning's defaults)."""
        given = kwargs if isinstance(kwargs, dict) else {}
        return cls(given.get("max_epochs"), given.get("max_steps"))

    def lengths(self) -> tuple[int, int]:
        """(max_epochs, max_steps) as the user's Trainer would have them (Lightning's defaults)."""
        steps = -1 if self.max_steps is None else int(self.max_steps)
        default = LIGHTNING_DEFAULT_MAX_EPOCHS if steps == -1 else -1
        return (int(self.max_epochs) if self.max_epochs is not None else default), steps

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if stage == "fit":
            loop = trainer.fit_loop
            self._run_limits = (loop.max_epochs, loop.epoch_loop.max_steps)
            loop.max_epochs, loop.epoch_loop.max_steps = self.lengths()

    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        if self._run_limits is None:
            return
        if self.max_epochs is not None or self.max_steps is not None:
            try:
                total = trainer.estimated_stepping_batches  # optimizer steps, with the user's lengths
            except Exception:  # noqa: BLE001 - Lightning cannot estimate it (a changing accumulation): no limit
                total = math.inf
            if math.isfinite(total) and total > 0:  # an iterable with max_epochs only says max_steps (-1)
                self.batch_limit = int(total) * max(1, int(trainer.accumulate_grad_batches))
        trainer.fit_loop.max_epochs, trainer.fit_loop.epoch_loop.max_steps = self._run_limits
        self._run_limits = None

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        if self.batch_limit is not None and trainer.fit_loop.total_batch_idx + 1 >= self.batch_limit:
            trainer.should_stop, self.stopped = True, True

    def notes(self) -> list[str]:
        """What the run reports when the user's length ended it before the measurement did."""
        if not self.stopped:
            return []
        said = ", ".join(
            f"{k}={v}" for k, v in (("max_epochs", self.max_epochs), ("max_steps", self.max_steps)) if v is not None
        )
        return [
            f"the target's Trainer settings ({said}) train {self.batch_limit} batches: the run stopped there, as "
            f"the training would (its schedule ends there), before the measurement's planned end; give a longer "
            f"training for a longer measurement"
        ]


def check_trainer_kwargs(spec: str, kwargs: object) -> tuple[dict[str, Any], dict[str, str]]:
    """(the Trainer settings a run uses, the ones it leaves out -> why). FastloopError for a
    value that is not a dict of Trainer keyword arguments.

    Example:
        >>> used, left = check_trainer_kwargs("t", {"gradient_clip_val": 1.0, "max_epochs": 3})
        >>> used, sorted(left)
        ({'gradient_clip_val': 1.0}, ['max_epochs'])
    """
    import inspect

    from fastloop._compat import Trainer

    if not isinstance(kwargs, dict) or not all(isinstance(k, str) for k in kwargs):
        raise FastloopError(
            f"target {shorten(spec)} returned {type(kwargs).__name__} as its third element, where a "
            "dict of Trainer keyword arguments was expected (e.g. {'gradient_clip_val': 1.0})"
        )
    accepted = set(inspect.signature(Trainer.__init__).parameters) - {"self"}
    unknown = sorted(k for k in kwargs if k not in accepted)
    if unknown:
        raise FastloopError(
            f"target {shorten(spec)} returned Trainer settings that Trainer does not take: "
            f"{shorten(', '.join(unknown))}"
        )
    used = {k: v for k, v in kwargs.items() if k not in OWNED_TRAINER_KWARGS}
    left = {k: OWNED_TRAINER_KWARGS[k] for k in kwargs if k in OWNED_TRAINER_KWARGS}
    if used.get("callbacks"):  # those that need what a run turns off stay out too (OWNED_CALLBACKS)
        cbs = used["callbacks"]
        kept, left_cbs = split_callbacks(list(cbs) if isinstance(cbs, (list, tuple)) else [cbs])
        used["callbacks"] = kept
        left.update(left_cbs)
    return used, left


def build_target(
    spec: str, *, optional_kwargs: dict[str, Any] | None = None, **kwargs: Any
) -> tuple[LightningModule, LightningDataModule | DataLoader | None, dict[str, Any]]:
    """Call the target and check what it returned: ``(module, data, trainer_kwargs)`` (data None:
    the module's own ``train_dataloader()``; ``trainer_kwargs`` the user's Trainer settings, ``{}``
    when the target returned two elements). ``optional_kwargs``: keyword arguments passed only where the
    target's function takes them (a fit's ``seed``)."""
    fn = load_target(spec)
    if optional_kwargs:
        import inspect

        try:
            params = inspect.signature(fn).parameters
        except (TypeError, ValueError):  # a builtin or C function: no signature to read
            params = {}
        takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
        kwargs = {**{k: v for k, v in optional_kwargs.items() if takes_any or k in params}, **kwargs}
    try:
        out = fn(**kwargs)
    except TypeError as err:
        if "unexpected keyword" in str(err) and err.__traceback__ is not None and err.__traceback__.tb_next is None:
            raise FastloopError(f"target {shorten(spec)} does not accept {err}") from None
        raise UserCodeError(f"while building target {shorten(spec)}") from err
    except (FastloopError, UserCodeError, KeyboardInterrupt):
        raise
    except SystemExit as err:
        raise UserCodeError(
            f"target {shorten(spec)} called sys.exit({err.code}) while being built; nothing was trained"
        ) from None
    except Exception as err:
        raise UserCodeError(f"while building target {shorten(spec)}") from err
    if not (isinstance(out, tuple) and len(out) in (2, 3)):
        raise FastloopError(
            f"target {shorten(spec)} must return (LightningModule, DataModule or DataLoader) or "
            f"(LightningModule, data, Trainer keyword arguments), got {type(out).__name__}"
        )
    module, data = out[0], out[1]
    trainer_kwargs = out[2] if len(out) == 3 else {}
    if not isinstance(trainer_kwargs, dict):
        check_trainer_kwargs(spec, trainer_kwargs)  # raises with the reason
    if not isinstance(module, LightningModule):
        hint = (
            (
                "; torch.compile wraps the module it is given: return the LightningModule itself and compile its "
                "children (or use the compile speedup)"
            )
            if isinstance(getattr(module, "_orig_mod", None), LightningModule)
            else ""
        )
        raise FastloopError(
            f"target {shorten(spec)} returned {type(module).__name__} where a LightningModule was expected{hint}"
        )
    if data is None and type(module).train_dataloader is LightningModule.train_dataloader:
        raise FastloopError(
            f"target {shorten(spec)} returned (module, None) but {type(module).__name__} defines no "
            f"train_dataloader(): return a DataModule or a DataLoader, or define train_dataloader()"
        )
    if data is not None and not isinstance(data, (LightningDataModule, DataLoader)):
        raise FastloopError(
            f"target {shorten(spec)} returned {type(data).__name__} where a LightningDataModule, a DataLoader "
            f"or None (the module's own train_dataloader()) was expected"
        )
    return module, data, trainer_kwargs
