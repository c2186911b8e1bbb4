"""Load a target: ``FILE.py:FUNCTION``, ``package.module:FUNCTION`` or a recipe's short name.

The function takes keyword arguments (all optional) and returns ``(lightning_module, data)``,
where data is a ``LightningDataModule`` or a training ``DataLoader``.

Example:
    >>> load_target("nonexistent.py:make")
    Traceback (most recent call last):
    ...
    fastloop.errors.FastloopError: target file not found: nonexistent.py
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from torch.utils.data import DataLoader

from fastloop._compat import LightningDataModule, LightningModule
from fastloop.errors import FastloopError, UserCodeError, shorten

__all__ = ["RECIPES", "RECIPE_LADDER", "RECIPE_RUNGS", "build_target", "load_target"]

RECIPES: dict[str, str] = {
    "gpt": "fastloop.recipes.gpt.target:make",
    "demo": "fastloop.recipes.demo.target:make",
    "imagenet": "fastloop.recipes.imagenet.target:make",
}

# recipe-level speedups a recipe's default ladder adds to the generic ones
RECIPE_RUNGS: dict[str, list[str]] = {"imagenet": ["cudnn_benchmark", "dali"], "gpt": ["fp8", "fused_loss"]}
# recipes whose default ladder is their own list (the demo: the CPU main job, no compile, which
# costs tens of seconds per process on a CPU)
RECIPE_LADDER: dict[str, list[str]] = {"demo": ["workers", "bf16", "fused_optimizer"]}


def load_target(spec: str) -> Callable[..., Any]:
    """The target's factory function; raises FastloopError with a one-line reason."""
    spec = RECIPES.get(spec, spec)
    if spec.count(":") != 1 or not all(spec.split(":")):
        raise FastloopError(f"malformed target {shorten(spec)!r}: use FILE.py:FUNCTION, package.module:FUNCTION, "
                            f"or a recipe name ({', '.join(RECIPES)})")
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
            raise UserCodeError(f"importing {shorten(where)} called sys.exit({err.code}); nothing was trained") from None
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
            raise UserCodeError(f"importing {shorten(where)} called sys.exit({err.code}); nothing was trained") from None
        except Exception as err:
            raise UserCodeError(f"while importing {shorten(where)}") from err
    fn = getattr(module, func, None)
    if fn is None:
        raise FastloopError(f"{shorten(where)} has no function {func!r}")
    if not callable(fn):
        raise FastloopError(f"{shorten(where)}:{func} is not callable")
    return fn


def build_target(spec: str, **kwargs: Any) -> tuple[LightningModule, LightningDataModule | DataLoader | None]:
    """Call the target and check what it returned (data None: the module's own ``train_dataloader()``)."""
    fn = load_target(spec)
    try:
        out = fn(**kwargs)
    except TypeError as err:
        if "unexpected keyword" in str(err) and err.__traceback__ is not None and err.__traceback__.tb_next is None:
            raise FastloopError(f"target {shorten(spec)} does not accept {err}") from None
        raise UserCodeError(f"while building target {shorten(spec)}") from err
    except (FastloopError, UserCodeError, KeyboardInterrupt):
        raise
    except SystemExit as err:
        raise UserCodeError(f"target {shorten(spec)} called sys.exit({err.code}) while being built; nothing was trained") from None
    except Exception as err:
        raise UserCodeError(f"while building target {shorten(spec)}") from err
    if not (isinstance(out, tuple) and len(out) == 2):
        raise FastloopError(f"target {shorten(spec)} must return (LightningModule, DataModule or DataLoader), got {type(out).__name__}")
    module, data = out
    if not isinstance(module, LightningModule):
        raise FastloopError(f"target {shorten(spec)} returned {type(module).__name__} where a LightningModule was expected")
    if data is None and type(module).train_dataloader is LightningModule.train_dataloader:
        raise FastloopError(f"target {shorten(spec)} returned (module, None) but {type(module).__name__} defines no "
                            f"train_dataloader(): return a DataModule or a DataLoader, or define train_dataloader()")
    if data is not None and not isinstance(data, (LightningDataModule, DataLoader)):
        raise FastloopError(f"target {shorten(spec)} returned {type(data).__name__} where a LightningDataModule, a DataLoader "
                            f"or None (the module's own train_dataloader()) was expected")
    return module, data
