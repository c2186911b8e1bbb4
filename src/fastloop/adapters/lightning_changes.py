"""How the Lightning callbacks change a user's objects for one fit and put them back: patched
attributes with their undo, the Trainer's precision a speedup must leave alone, and the children
compile wraps."""

from __future__ import annotations

from typing import Any

import torch
from torch.utils.data import DataLoader

from fastloop._compat import Trainer

__all__ = ["compilable_children", "describe_children", "loader_members", "patch_attr", "trainer_precision_conflict"]


_ORIGINALS: dict[tuple[int, str], tuple[Any, bool, Any]] = {}
"""What each attribute fastloop patched held before the first patch: (object, had an instance
attribute, its value). Several callbacks may patch the same attribute; the first undo puts the
original back and the others find nothing left to do, whatever order Lightning tears down in."""


def patch_attr(obj: Any, attr: str, value: Any, undo: list) -> None:
    """``obj.attr = value`` for this fit; ``undo`` gets the function that puts back the original."""
    key = (id(obj), attr)
    if key not in _ORIGINALS:
        had = attr in vars(obj)
        _ORIGINALS[key] = (obj, had, vars(obj).get(attr))
    setattr(obj, attr, value)

    def restore() -> None:
        entry = _ORIGINALS.pop(key, None)
        if entry is None:
            return
        target, had, old = entry
        if had:
            setattr(target, attr, old)
        elif attr in vars(target):
            delattr(target, attr)

    undo.append(restore)


def trainer_precision_conflict(trainer: Trainer, dtype: torch.dtype, name: str) -> str | None:
    """Why an autocast speedup must leave the Trainer's precision alone (None: it may set it)."""
    want = "bf16-mixed" if dtype == torch.bfloat16 else "16-mixed"
    chosen = str(trainer.precision)
    if chosen == want:
        return f"the Trainer already trains in {chosen}: nothing to change"
    if chosen not in ("32-true", "32"):
        return (
            f"the Trainer's precision is {chosen!r}, which you set; {name} would replace it with {want}. "
            f"Remove precision= from the Trainer to let {name} apply"
        )
    if type(trainer.strategy.precision_plugin).__name__ != "Precision":
        return (
            f"the strategy uses its own precision plugin ({type(trainer.strategy.precision_plugin).__name__}); "
            f"{name} would replace it"
        )
    return None


def compilable_children(module: torch.nn.Module, prefix: str = "") -> list[tuple[str, torch.nn.Module]]:
    """The children of ``module`` with parameters that its code calls: a ``ModuleList`` or
    ``ModuleDict`` has no forward of its own (the step iterates it and calls each member), so
    its members stand in for it, recursively.

    Example:
        >>> net = torch.nn.Module()
        >>> net.blocks = torch.nn.ModuleList([torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)])
        >>> net.head = torch.nn.Linear(2, 1)
        >>> [n for n, _ in compilable_children(net)]
        ['blocks.0', 'blocks.1', 'head']
    """
    out: list[tuple[str, torch.nn.Module]] = []
    for n, c in module.named_children():
        if not any(True for _ in c.parameters()):
            continue
        if isinstance(c, (torch.nn.ModuleList, torch.nn.ModuleDict)):
            out += compilable_children(c, f"{prefix}{n}.")
        else:
            out.append((f"{prefix}{n}", c))
    return out


def describe_children(children: list[tuple[str, torch.nn.Module]]) -> str:
    """The children's names for a record, the members of one list of the same type in one range.

    Example:
        >>> blocks = [(f"blocks.{i}", torch.nn.Linear(2, 2)) for i in range(12)]
        >>> describe_children(blocks + [("head", torch.nn.Linear(2, 1))])
        'blocks.0-11 (Linear), head (Linear)'
    """
    groups: list[tuple[str, str, list[str]]] = []  # (parent, type, member names)
    for name, child in children:
        parent, _, last = name.rpartition(".")
        kind = type(child).__name__
        if parent and last.isdigit() and groups and groups[-1][:2] == (parent, kind):
            groups[-1][2].append(last)
        else:
            groups.append((parent, kind, [last] if parent and last.isdigit() else [name]))
    out = []
    for parent, kind, names in groups:
        label = (
            f"{parent}.{names[0]}-{names[-1]}" if len(names) > 1 else (f"{parent}.{names[0]}" if parent else names[0])
        )
        out.append(f"{label} ({kind})")
    return ", ".join(out)


def loader_members(loader: Any) -> dict | None:
    """The DataLoaders of a dict, list or tuple of them (what ``train_dataloader`` may return for
    Lightning to combine, or ``val_dataloader`` for it to run in turn), by key or position; None for
    anything else.

    Example:
        >>> sorted(loader_members({"a": DataLoader([1]), "b": DataLoader([2])})), loader_members(DataLoader([1]))
        (['a', 'b'], None)
    """
    if isinstance(loader, dict):
        items = dict(loader)
    elif isinstance(loader, (list, tuple)):
        items = dict(enumerate(loader))
    else:
        return None
    return items if items and all(isinstance(v, DataLoader) for v in items.values()) else None
