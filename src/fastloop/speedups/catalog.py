"""Every registered speedup and its options, from their one definition (the registry's classes and
their options dataclasses): what ``fastloop speedups`` prints and the options table of
docs/guide.md, which a test compares with :func:`options_markdown`.

Example:
    >>> print(options_text(["workers"]))  # doctest: +NORMALIZE_WHITESPACE
    workers: DataLoader worker processes, the count chosen by measuring the loader
      workers:COUNT
        count: loader worker processes; none: measure 0, 1, 2, 4, ... and use the fastest
        (an integer from 1 to 256 or none; default: none)
"""

from __future__ import annotations

import dataclasses

from fastloop.speedups.base import REGISTRY, speedup_names

__all__ = ["options_markdown", "options_text", "summary"]


def summary(name: str) -> str:
    """The first sentence of the speedup's card (its module's docstring), without its name."""
    text = " ".join((REGISTRY[name].__doc__ or "").strip().split("\n\n")[0].split())
    if text.startswith("``") and ":" in text:
        text = text.split(":", 1)[1].strip()
    return text.split(". ")[0].rstrip(".")


def _typed(name: str) -> str:
    t = REGISTRY[name].options_type
    if t is None:
        return name
    first, *rest = dataclasses.fields(t)
    return f"{name}:{first.name.upper()}" + "".join(f"[:{f.name}=...]" for f in rest)


def options_text(names: list[str] | None = None) -> str:
    """Each speedup (all, or ``names``): its one line, how it is typed, and each option's doc
    exactly as its field's doc says, what it accepts and its default."""
    lines: list[str] = []
    for name in names or speedup_names():
        cls = REGISTRY[name]
        lines.append(f"{name}: {summary(name)}")
        if cls.options_type is not None:
            lines.append(f"  {_typed(name)}")
            lines += [
                f"    {r['name']}: {r['doc']} ({r['accepted']}; default: {r['default']})"
                for r in cls.options_type.rows()
            ]
    return "\n".join(lines)


def options_markdown() -> str:
    """The options table of docs/guide.md: one row per option of every speedup that has any."""
    rows = ["| speedup | option | accepts | default | what it does |", "| --- | --- | --- | --- | --- |"]
    for name in speedup_names():
        t = REGISTRY[name].options_type
        for r in t.rows() if t is not None else []:
            rows.append(f"| `{name}` | `{r['name']}` | {r['accepted']} | {r['default']} | {r['doc']} |")
    return "\n".join(rows)
