"""A speedup's options, defined once: each option is a field of a keyword-only frozen dataclass
(a subclass of :class:`Options`) made with :func:`option`, which gives its type (the annotation),
its default, what it accepts and its one-line doc. Everything else is derived from that one
definition: the check of a value (:meth:`Options.__post_init__`, one exception type and one
message form, the same from Python and from the command line), the parsing of the text after the
speedup's name (:meth:`Options.parse`: ``compile:max-autotune:shapes=static``), the spec that
reads back (:meth:`Options.spec`), and the help of ``fastloop speedups`` and the docs table
(:meth:`Options.rows`).

Example:
    >>> from dataclasses import dataclass
    >>> @dataclass(frozen=True, kw_only=True)
    ... class DemoOptions(Options):
    ...     speedup = "demo"
    ...     count: int | None = option(None, "worker processes; none: measured", low=1, high=8)
    ...     mode: str = option("fast", "how it runs", choices=("fast", "safe"))
    >>> DemoOptions.parse("4:mode=safe")
    DemoOptions(count=4, mode='safe')
    >>> DemoOptions.parse("4:mode=safe").spec()
    '4:mode=safe'
    >>> DemoOptions(count=9)
    Traceback (most recent call last):
    ...
    fastloop.errors.FastloopError: demo: count must be an integer from 1 to 8 or none, got 9
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import field
from typing import Any, ClassVar

from fastloop.errors import FastloopError, shorten

__all__ = ["Options", "option"]


def option(
    default: Any,
    doc: str,
    *,
    choices: tuple | None = None,
    low: float | None = None,
    high: float | None = None,
    low_open: bool = False,
    high_open: bool = False,
) -> Any:
    """One option's field: ``default``, its one-line ``doc``, and what it accepts (``choices``, or
    a range ``low``..``high``, either end open); its type is the field's annotation."""
    return field(
        default=default,
        metadata={
            "doc": doc,
            "choices": tuple(choices) if choices else None,
            "low": low,
            "high": high,
            "low_open": low_open,
            "high_open": high_open,
        },
    )


def _kind(annotation: Any) -> tuple[type, bool]:
    """(the value type, whether None is accepted) of a field's annotation (``int | None``)."""
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        return args[0], len(args) < len(typing.get_args(annotation))
    return annotation, False


def _num(x: float) -> str:
    return f"{x:g}" if isinstance(x, float) else f"{x:,}" if abs(x) >= 10_000 else str(x)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Options:
    """The base of every speedup's options (see the module's docstring); ``speedup`` names the
    speedup in messages. A subclass may add :meth:`check` for a rule between fields."""

    speedup: ClassVar[str] = "speedup"

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            self._check(f, getattr(self, f.name))
        self.check()

    def check(self) -> None:
        """A rule between fields (the fields are each valid); raise FastloopError via :meth:`refuse`."""
        return None

    @classmethod
    def refuse(cls, name: str, value: Any, accepted: str | None = None) -> FastloopError:
        """The one message form: ``SPEEDUP: NAME must be ACCEPTED, got VALUE``."""
        f = next(f for f in dataclasses.fields(cls) if f.name == name)
        return FastloopError(
            f"{cls.speedup}: {name} must be {accepted or cls.accepted(f)}, got {shorten(repr(value), 40)}"
        )

    @classmethod
    def _types(cls) -> dict[str, Any]:
        return typing.get_type_hints(cls)

    @classmethod
    def accepted(cls, f: dataclasses.Field) -> str:
        """What field ``f`` accepts, in words: ``one of a, b``, ``an integer from 1 to 256``, ..."""
        kind, nullable = _kind(cls._types()[f.name])
        m = f.metadata
        if m.get("choices"):
            text = "one of " + ", ".join(map(str, m["choices"]))
        elif kind is bool:
            text = "true or false"
        elif kind in (int, float):
            low, high = m.get("low"), m.get("high")
            noun = "an integer" if kind is int else "a number"
            if low is not None and high is not None and kind is int and not (m["low_open"] or m["high_open"]):
                text = f"{noun} from {_num(low)} to {_num(high)}"
            elif low is not None and high is not None:
                opening, closing = "(" if m["low_open"] else "[", ")" if m["high_open"] else "]"
                text = f"{noun} in {opening}{_num(low)}, {_num(high)}{closing}"
            elif low is not None:
                text = f"{noun} {'>' if m['low_open'] else '>='} {_num(low)}"
            else:
                text = noun
        else:
            text = "text"
        return text + (" or none" if nullable else "")

    @classmethod
    def _check(cls, f: dataclasses.Field, value: Any) -> None:
        kind, nullable = _kind(cls._types()[f.name])
        if value is None:
            if nullable:
                return
            raise cls.refuse(f.name, value)
        ok = (
            isinstance(value, bool)
            if kind is bool
            else (
                isinstance(value, int) and not isinstance(value, bool)
                if kind is int
                else isinstance(value, (int, float)) and not isinstance(value, bool)
                if kind is float
                else isinstance(value, kind)
            )
        )
        m = f.metadata
        if ok and m.get("choices") and value not in m["choices"]:
            ok = False
        if ok and kind in (int, float):
            low, high = m.get("low"), m.get("high")
            if low is not None and (value <= low if m["low_open"] else value < low):
                ok = False
            if high is not None and (value >= high if m["high_open"] else value > high):
                ok = False
        if not ok:
            raise cls.refuse(f.name, value)

    @classmethod
    def _convert(cls, f: dataclasses.Field, text: str) -> Any:
        kind, nullable = _kind(cls._types()[f.name])
        if nullable and text.lower() == "none":
            return None
        try:
            if kind is bool:
                if text.lower() not in ("true", "false"):
                    raise ValueError(text)
                return text.lower() == "true"
            return kind(text) if kind in (int, float) else text
        except ValueError:
            raise cls.refuse(f.name, text) from None

    @classmethod
    def parse(cls, text: str) -> Options:
        """The options typed after the speedup's name: parts joined by ``:``, each ``KEY=VALUE``
        or, first, a bare value of the first field (``workers:8``, ``compile:max-autotune:shapes=static``)."""
        fields = {f.name: f for f in dataclasses.fields(cls)}
        first = next(iter(fields))
        kw: dict[str, Any] = {}
        for i, part in enumerate(text.split(":")):
            key, eq, value = part.partition("=")
            key, value = (key.strip(), value.strip()) if eq else (first, part.strip())
            if not eq and i > 0:
                raise FastloopError(
                    f"{cls.speedup}: {shorten(part, 30)!r} needs a name (KEY=VALUE); only the first "
                    f"option, {first}, may be given bare; its options: {', '.join(fields)}"
                )
            if key not in fields:
                raise FastloopError(
                    f"{cls.speedup} has no option {shorten(key, 30)!r}; its options: {', '.join(fields)}"
                )
            if key in kw:
                raise FastloopError(f"{cls.speedup}: option {key} given twice")
            if not value:
                raise FastloopError(f"{cls.speedup}: {key} has no value; it must be {cls.accepted(fields[key])}")
            kw[key] = cls._convert(fields[key], value)
        return cls(**kw)

    def non_default(self) -> dict[str, Any]:
        """The fields whose value is not their default, in field order."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if getattr(self, f.name) != f.default}

    def spec(self) -> str:
        """The options as :meth:`parse` reads them back (``""`` when all are their defaults)."""
        given = self.non_default()
        first = dataclasses.fields(self)[0].name
        parts = []
        for name, value in given.items():
            text = (
                ("true" if value else "false")
                if isinstance(value, bool)
                else "none"
                if value is None
                else (repr(value) if isinstance(value, float) else str(value))
            )
            parts.append(text if name == first and not parts else f"{name}={text}")
        return ":".join(parts)

    @classmethod
    def rows(cls) -> list[dict[str, str]]:
        """Each option: its name, what it accepts, its default and its doc (the help and the docs table)."""
        return [
            {
                "name": f.name,
                "accepted": cls.accepted(f),
                "default": "none" if f.default is None else str(f.default),
                "doc": f.metadata["doc"],
            }
            for f in dataclasses.fields(cls)
        ]

    @classmethod
    def usage(cls) -> str:
        """One line for an error message: how the options are typed and what each accepts."""
        first, *rest = dataclasses.fields(cls)
        typed = f"{cls.speedup}:{first.name.upper()}" + "".join(f"[:{f.name}=...]" for f in rest)
        return typed + " with " + "; ".join(f"{f.name} {cls.accepted(f)}" for f in dataclasses.fields(cls))
