"""The typed configuration of a run (fastloop.drivers.config): it refuses what the command line
refuses, with the same line, because both read one bound per number (``BOUNDS``); the speedup list
is parsed once into speedup objects and handed to a process of its own as a spec that reads back."""

from __future__ import annotations

import pytest

from fastloop.cli import _parser
from fastloop.drivers.config import BOUNDS, RunConfig
from fastloop.errors import FastloopError

REFUSED = [
    ("steps", "--steps", 0),
    ("warmup", "--warmup", -1),
    ("devices", "--devices", 2000),
    ("measure_s", "--measure-s", 0),
    ("step_rate", "--step-rate", -3.5),
    ("seed", "--seed", 2**31),
]


@pytest.mark.parametrize(("key", "flag", "value"), REFUSED)
def test_the_configuration_refuses_what_the_command_line_refuses_with_the_same_line(capsys, key, flag, value):
    with pytest.raises(FastloopError) as refused:
        RunConfig(target="demo", **{key: value})
    with pytest.raises(SystemExit):
        _parser().parse_args(["run", "demo", flag, str(value)])
    said = capsys.readouterr().err
    assert str(refused.value) in said and str(refused.value).startswith(BOUNDS[key].accepted)


@pytest.mark.parametrize(("key", "flag", "value"), REFUSED)
def test_the_edges_of_each_bound_are_accepted_by_both(key, flag, value):
    edge = BOUNDS[key].low if not BOUNDS[key].low_open else BOUNDS[key].low + 1
    edge = BOUNDS[key].kind(edge)
    assert getattr(RunConfig(target="demo", **{key: edge}), key) == edge
    assert getattr(_parser().parse_args(["run", "demo", flag, str(edge)]), key) == edge


def test_a_bool_is_not_a_count_and_the_strategy_is_one_of_two():
    with pytest.raises(FastloopError, match="--steps must be an integer"):
        RunConfig(target="demo", steps=True)
    with pytest.raises(FastloopError, match="--strategy must be ddp or fsdp"):
        RunConfig(target="demo", strategy="zero3")


def test_the_speedups_are_parsed_once_into_objects_whose_spec_reads_back():
    config = RunConfig(target="demo", speedups="compile:max-autotune,bf16")
    assert [s.name for s in config.speedups] == ["bf16", "compile"]  # ladder order
    assert RunConfig(target="demo", speedups=config.spec).spec == config.spec
    assert RunConfig(target="demo", speedups=config.speedups).speedups == config.speedups
    assert RunConfig(target="demo", speedups="none").spec == "none" and RunConfig(target="demo").speedups == []
    with pytest.raises(FastloopError, match="unknown speedup"):
        RunConfig(target="demo", speedups="bf17")
