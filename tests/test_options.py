"""Options are objects: each speedup's options are one keyword-only frozen dataclass
whose fields give the parsing, the check, the help and the spec; a spec reads back as an equal
object for every registered speedup and every option, built from keywords or from text."""

from __future__ import annotations

import dataclasses
import re
import subprocess
import sys
from pathlib import Path

import pytest

from fastloop.errors import FastloopError
from fastloop.speedups import REGISTRY, Compile, Workers, resolve
from fastloop.speedups.catalog import options_markdown, options_text
from fastloop.speedups.options import Options

ROOT = Path(__file__).resolve().parents[1]
WITH_OPTIONS = sorted(n for n, c in REGISTRY.items() if c.options_type is not None)


def _values(t: type[Options], f: dataclasses.Field) -> list:
    """Values other than the default that field ``f`` accepts: its choices, or its range's ends
    and a point inside."""
    m, default = f.metadata, f.default
    if m.get("choices"):
        return [c for c in m["choices"] if c != default]
    if isinstance(default, bool):
        return [not default]
    kind = type(default) if default is not None else int
    low, high = m.get("low"), m.get("high")
    if kind is float or (low is not None and isinstance(low, float)) or (high is not None and isinstance(high, float)):
        lo, hi = float(low if low is not None else 0.0), float(high if high is not None else 1.0)
        return [v for v in (lo + (hi - lo) / 4, hi if not m["high_open"] else (lo + hi) / 2) if v != default]
    lo, hi = int(low if low is not None else 1), int(high if high is not None else 64)
    return [v for v in (lo if not m["low_open"] else lo + 1, (lo + hi) // 2, hi) if v != default]


def _cases():
    for name in WITH_OPTIONS:
        t = REGISTRY[name].options_type
        for f in dataclasses.fields(t):
            for v in _values(t, f):
                try:
                    t(**{f.name: v})
                except FastloopError:  # a rule between fields refuses it alone (check_batches > sample_batches)
                    continue
                yield pytest.param(name, f.name, v, id=f"{name}-{f.name}={v}")


def test_every_options_class_is_keyword_only_frozen_and_documented():
    assert set(WITH_OPTIONS) >= {"workers", "compile", "fp8", "gpu_resident", "ddp_comm", "pad_buckets"}
    for name in WITH_OPTIONS:
        t = REGISTRY[name].options_type
        assert issubclass(t, Options) and t.__dataclass_params__.frozen, name
        assert t.speedup == name, t
        for f in dataclasses.fields(t):
            assert f.kw_only and f.metadata.get("doc"), f"{name}.{f.name}"
        with pytest.raises(TypeError):
            t(*[f.default for f in dataclasses.fields(t)])  # keyword-only: no positional fields
        REGISTRY[name]()  # the defaults are valid


@pytest.mark.parametrize("name, field, value", list(_cases()))
def test_a_spec_reads_back_as_an_equal_object_from_keywords_and_from_text(name, field, value):
    cls = REGISTRY[name]
    built = cls(**{field: value})
    assert built.opts == cls.options_type(**{field: value})
    assert field in built.options and built.spec != name  # the spec names the option
    again = resolve(built.spec)
    assert again == [built] and getattr(again[0].opts, field) == value, (built.spec, again)
    assert resolve(again[0].spec) == [built]  # from text, and back again
    assert hash(again[0]) == hash(built)


def test_every_option_at_once_round_trips_and_the_spec_names_them_all():
    for name in WITH_OPTIONS:
        t = REGISTRY[name].options_type
        kw = {f.name: _values(t, f)[0] for f in dataclasses.fields(t) if _values(t, f)}
        if name == "pad_buckets":
            kw["check_batches"] = min(kw["check_batches"], kw["sample_batches"])
        built = REGISTRY[name](**kw)
        assert resolve(built.spec) == [built], built.spec
        assert all(k in built.spec or k == dataclasses.fields(t)[0].name for k in kw), built.spec


def test_the_issues_must_show_compile_and_workers_name_their_options():
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            "from fastloop.speedups import Compile, Workers; "
            "print(Compile(shapes='static').spec, Workers(count=4).spec)",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert out == ["compile:shapes=static", "workers:4"]
    assert resolve(out[0]) == [Compile(shapes="static")] and resolve(out[1]) == [Workers(count=4)]
    both = Compile(mode="reduce-overhead", shapes="static")
    assert both.spec == "compile:reduce-overhead:shapes=static" and resolve(both.spec) == [both]
    assert Compile() != Compile(mode="max-autotune") and Compile() == resolve("compile")[0]


@pytest.mark.parametrize(
    "spec, attr, value",
    [
        ("workers:4", "count", 4),
        ("workers", "count", None),
        ("compile:max-autotune", "mode", "max-autotune"),
        ("compile", "mode", "default"),
        ("fp8:rowwise", "recipe", "rowwise"),
        ("gpu_resident:0.3", "share", 0.3),
        ("ddp_comm:50", "bucket_mb", 50),
        ("compile:shapes=static", "shapes", "static"),
        ("pad_buckets:rtol=0.001:max_buckets=4", "rtol", 0.001),
    ],
)
def test_parsed_options_are_typed(spec, attr, value):
    s = resolve(spec)[0]
    assert getattr(s.opts, attr) == value and type(getattr(s.opts, attr)) is type(value)


@pytest.mark.parametrize(
    "build, words",
    [
        (lambda: Workers(count=0), "workers: count must be an integer from 1 to 256 or none, got 0"),
        (lambda: Workers(count="4"), "workers: count must be an integer from 1 to 256 or none, got '4'"),
        (lambda: resolve("workers:four"), "workers: count must be an integer from 1 to 256 or none, got 'four'"),
        (lambda: Compile(mode="warp"), "compile: mode must be one of default, reduce-overhead"),
        (
            lambda: resolve("compile:shapes=wobbly"),
            "compile: shapes must be one of auto, static, dynamic, got 'wobbly'",
        ),
        (lambda: resolve("compile:colour=red"), "compile has no option 'colour'; its options: mode, shapes"),
        (lambda: Compile(colour="red"), "compile has no option 'colour'; its options: mode, shapes"),
        (lambda: resolve("compile:default:max-autotune"), "needs a name (KEY=VALUE)"),
        (lambda: resolve("compile:mode=default:mode=max-autotune"), "option mode given twice"),
        (lambda: resolve("fp8:blockwise"), "fp8: recipe must be one of tensorwise, rowwise"),
        (lambda: resolve("gpu_resident:0.95"), "gpu_resident: share must be a number in (0, 0.9], got 0.95"),
        (lambda: resolve("ddp_comm:0"), "ddp_comm: bucket_mb must be an integer from 1 to 1024 or none, got 0"),
        (
            lambda: resolve("pad_buckets:check_batches=9:sample_batches=4"),
            "pad_buckets: check_batches must be at most sample_batches (4), got 9",
        ),
        (lambda: resolve("bf16:fast"), "'bf16' takes no option"),
        (lambda: REGISTRY["tf32"](mode="x"), "'tf32' takes no option"),
    ],
)
def test_one_message_form_from_python_and_from_the_command_line(build, words):
    with pytest.raises(FastloopError, match=re.escape(words)):
        build()


def test_the_help_and_the_docs_table_are_each_fields_doc():
    text = options_text()
    for name in WITH_OPTIONS:
        for f in dataclasses.fields(REGISTRY[name].options_type):
            assert f"    {f.name}: {f.metadata['doc']} (" in text, (name, f.name)
    cli = subprocess.run(
        [sys.executable, "-m", "fastloop.cli", "speedups", "pad_buckets"], capture_output=True, text=True, check=True
    ).stdout
    assert cli.strip() == options_text(["pad_buckets"]).strip()
    guide = (ROOT / "docs" / "guide.md").read_text()
    table = guide.split("options_markdown) -->\n", 1)[1].split("\n<!-- end of the options table -->", 1)[0]
    assert table == options_markdown(), "docs/guide.md's options table is not the one the fields give: regenerate it"


def test_no_option_help_is_written_by_hand():
    hand = [str(p) for p in (ROOT / "src").rglob("*.py") if re.search(r"option_help\s*=", p.read_text())]
    assert hand == []
