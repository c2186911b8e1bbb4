"""Typed options: every speedup that takes an option declares a frozen dataclass with documented
fields; the spec parser and the Python API check values the same way."""

from __future__ import annotations

import dataclasses

import pytest

from fastloop.errors import FastloopError
from fastloop.speedups import REGISTRY, resolve


def test_every_speedup_with_an_option_has_a_documented_options_dataclass():
    with_option = [cls for cls in REGISTRY.values() if cls.option_help]
    assert {c.name for c in with_option} >= {"workers", "compile", "fp8", "gpu_resident", "ddp_comm"}
    for cls in with_option:
        t = cls.options_type
        assert t is not None and dataclasses.is_dataclass(t), cls.name
        assert t.__dataclass_params__.frozen, cls.name
        for f in dataclasses.fields(t):
            assert f.metadata.get("doc"), f"{cls.name}.{f.name} has no doc"
        cls()  # the defaults are valid
    for cls in REGISTRY.values():
        if not cls.option_help:
            assert cls.options_type is None, f"{cls.name} declares options but no option_help"


@pytest.mark.parametrize("spec, attr, value", [
    ("workers:4", "count", 4), ("workers", "count", None), ("compile:max-autotune", "mode", "max-autotune"),
    ("compile", "mode", "default"), ("fp8:rowwise", "recipe", "rowwise"), ("gpu_resident:0.3", "share", 0.3),
    ("ddp_comm:50", "bucket_mb", 50), ("compile:shapes=static", "shapes", "static"),
])
def test_parsed_options_are_typed(spec, attr, value):
    s = resolve(spec)[0]
    assert getattr(s.opts, attr) == value and type(getattr(s.opts, attr)) is type(value)
    assert s.spec == spec  # the spec reads back as typed


@pytest.mark.parametrize("cls_name, kwargs, words", [
    ("workers", {"count": 0}, "from 1 to 256"), ("workers", {"count": "4"}, "from 1 to 256"),
    ("compile", {"mode": "warp"}, "accepted: default"), ("fp8", {"recipe": "blockwise"}, "accepted: tensorwise"),
    ("gpu_resident", {"share": 0.95}, "(0, 0.9]"), ("ddp_comm", {"bucket_mb": 0}, "from 1 to 1024"),
])
def test_the_python_api_checks_option_values_like_the_parser(cls_name, kwargs, words):
    t = REGISTRY[cls_name].options_type
    with pytest.raises(FastloopError, match=__import__("re").escape(words)):
        t(**kwargs)
    with pytest.raises(FastloopError):
        REGISTRY[cls_name](mode=next(iter(kwargs.values())))


def test_a_keyed_option_sets_that_field_and_a_bad_value_or_key_says_what_is_accepted():
    s = resolve("compile:shapes=dynamic")[0]
    assert (s.opts.mode, s.opts.shapes) == ("default", "dynamic")
    with pytest.raises(FastloopError, match="accepted: auto, static, dynamic"):
        resolve("compile:shapes=wobbly")
    with pytest.raises(FastloopError, match="accepted: default"):  # not a field: read as a mode, refused
        resolve("compile:colour=red")
