"""A run's typed result (fastloop.measure.run_result): it writes exactly the document a run wrote
before it was typed, it reads one back field by field, and it writes strict JSON (a loss that was
not finite becomes null, with the reason beside it)."""

from __future__ import annotations

import json
import math

import pytest

from fastloop.measure.run_result import RunResult, SpeedupRecord, StepTimes, Throughput
from tests.ladder_sim import load_fixture


def _strict(doc: dict) -> dict:
    return json.loads(json.dumps(doc, allow_nan=False))


def test_a_real_run_document_reads_back_field_by_field_and_writes_the_same_document():
    doc = load_fixture("demo_run.json")
    result = RunResult.from_dict(doc)
    assert result.to_dict() == doc
    assert list(result.to_dict()) == list(doc)  # in its order, the stamp first
    assert result.data_wait_frac == doc["data_wait_frac"] and result.step_s.mean == doc["step_s"]["mean"]
    assert result.throughput.unit == doc["throughput"]["unit"] and result.timings.build_s == doc["timings"]["build_s"]
    assert result.env == doc["env"] and result.kind == "run" and result.rest == {}


def test_a_document_with_keys_the_dataclass_does_not_know_keeps_them():
    doc = {"steps": 3, "speedups": [{"name": "bf16", "status": "applied", "reason": "", "detail": "", "new": 1}]}
    doc["throughput"] = {"value": 2.0, "unit": "samples/s", "later": "x"}
    result = RunResult.from_dict(doc)
    assert result.speedups[0].rest == {"new": 1} and result.throughput.rest == {"later": "x"}
    assert result.applied() == {"bf16"}
    assert RunResult.from_dict(result.to_dict()) == result


def test_a_partial_document_reads_with_defaults():
    result = RunResult.from_dict({"step_s_all": [0.1, 0.2], "data_wait_frac": 0.5})
    assert result.step_s == StepTimes() and result.throughput == Throughput() and result.peak_mem_bytes is None
    assert result.step_s_all == [0.1, 0.2] and result.data_wait_frac == 0.5 and result.rest == {}


def test_a_loss_that_was_not_finite_is_written_as_null_with_its_reason():
    result = RunResult(
        speedups=[SpeedupRecord(name="bf16", status="applied")],
        steps=4,
        losses=[2.0, math.nan, math.inf, None],
    )
    result.loss.first, result.loss.last = 2.0, math.inf
    doc = _strict(result.to_dict())  # json.dumps(allow_nan=False) raises on a NaN left anywhere
    assert doc["losses"] == [2.0, None, None, None]
    assert doc["losses_not_finite"] == {"1": "nan", "2": "inf"}
    assert doc["loss"] == {"first": 2.0, "last": None}
    assert math.isnan(result.losses[1])  # the result itself keeps what was measured
    back = RunResult.from_dict(doc)
    assert back.to_dict() == doc  # read back, the reason stays and nothing is added twice


def test_finite_losses_write_no_reason():
    doc = RunResult(steps=2, losses=[1.0, None]).to_dict()
    assert "losses_not_finite" not in doc and doc["losses"] == [1.0, None]


@pytest.mark.parametrize("key", ["weights_digest", "paired", "loss_finite", "ranks", "loss_definition"])
def test_what_a_run_has_only_sometimes_is_written_only_when_it_is_there(key):
    assert key not in RunResult(steps=1).to_dict()
