"""The runnable examples in the public modules' docstrings stay true."""

import doctest
import importlib

import pytest

MODULES = [
    "fastloop",
    "fastloop.loop",
    "fastloop.data",
    "fastloop.drivers.ab",
    "fastloop.drivers.ladder",
    "fastloop.drivers.doctor",
    "fastloop.drivers.batch_size",
    "fastloop.speedups.batch_size",
    "fastloop.device",
    "fastloop.drivers.targets",
    "fastloop.lightning",
    "fastloop.measure.stats",
    "fastloop.measure.flops",
    "fastloop.measure.timer",
    "fastloop.speedups.base",
    "fastloop.adapters.lightning_graph",
    "fastloop.cuda_env",
    "fastloop.speedups.cudnn_benchmark",
    "fastloop.speedups.workers",
    "fastloop.streams",
    "fastloop.drivers.run_document",
    "fastloop.drivers.pick_check",
    "fastloop.drivers.paired_run",
    "fastloop.report.format",
    "fastloop.adapters.step_source",
    "fastloop.measure.sync_site",
    "fastloop.recipes.imagenet.module",
    "fastloop.recipes.imagenet.target",
]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.failed == 0 and result.attempted > 0
