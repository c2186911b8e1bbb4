"""A schedule sized from the Trainer (``trainer.estimated_stepping_batches``, as the Lightning docs
build OneCycleLR) sees the user's training length in a measured run, whose own Trainer has no end."""

from __future__ import annotations

import pytest

from fastloop.drivers.runner import run_configuration
from fastloop.errors import UserCodeError

TARGET = "tests/targets.py:onecycle_from_estimate"


@pytest.mark.parametrize("lengths, total", [({}, 1000 * 16), ({"max_epochs": 3}, 3 * 16), ({"max_steps": 500}, 500)])
def test_configure_optimizers_sees_the_users_length_or_lightnings_default(tmp_path, lengths, total):
    record = tmp_path / "total.txt"
    doc = run_configuration(
        TARGET,
        "none",
        steps=20,
        warmup=2,
        device="cpu",
        steady_warmup=False,
        target_kwargs={"record": str(record), **lengths},
    )
    assert int(record.read_text()) == total  # was inf: OneCycleLR raised "Expected positive integer total_steps"
    assert doc["steps"] == 20 and not any("the run stopped there" in w for w in doc["warnings"])
    if lengths:
        assert "configure_optimizers still sees this length" in doc["trainer_settings"]["left_out"][next(iter(lengths))]


def test_a_training_shorter_than_the_measurement_ends_the_run_where_the_schedule_ends(tmp_path):
    doc = run_configuration(
        TARGET, "none", steps=40, warmup=2, device="cpu", steady_warmup=False, target_kwargs={"max_steps": 12}
    )
    assert doc["steps"] == 10  # 12 batches, 2 of them warm-up; OneCycleLR would raise at the 13th step
    assert any("(max_steps=12) train 12 batches: the run stopped there" in w for w in doc["warnings"])


def test_a_training_too_short_for_the_warm_up_says_so():
    with pytest.raises(
        UserCodeError,
        match=r"no step was measured: the target's Trainer settings \(max_steps=3\) "
        r"train 3 batches",
    ):
        run_configuration(
            TARGET, "none", steps=20, warmup=5, device="cpu", steady_warmup=False, target_kwargs={"max_steps": 3}
        )


def test_the_batch_size_trials_build_a_schedule_sized_from_the_trainer(tmp_path):
    """The trials run without a Trainer: configure_optimizers sees a stand-in of Lightning's
    default length instead of 'M is not attached to a `Trainer`'."""
    from fastloop.drivers.targets import build_target
    from fastloop.speedups.batch_size import search_batch_size

    record = tmp_path / "total.txt"
    module, loader, _ = build_target(TARGET, record=str(record))
    doc = search_batch_size(module, loader, device="cpu", max_size=64, init=16, objective="max")
    total = int(record.read_text())  # the last trial's: 1000 epochs of its loader (256 samples at its size)
    assert doc["batch_size"] >= 16 and total % 1000 == 0 and 1000 <= total <= 1000 * len(loader)
    with pytest.raises(RuntimeError, match="not attached to a `Trainer`"):
        module.trainer  # noqa: B018 - the stand-in is gone after the trials


def test_a_stream_whose_length_lightning_cannot_count_is_not_cut_short():
    doc = run_configuration(
        "tests/targets.py:stream_with_epochs", "none", steps=20, warmup=2, device="cpu", steady_warmup=False
    )
    assert doc["steps"] == 20 and not any("the run stopped there" in w for w in doc["warnings"])
