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
    "fastloop.drivers.ladder.budget",
    "fastloop.drivers.ladder.candidates",
    "fastloop.drivers.ladder.gates",
    "fastloop.drivers.ladder.rung",
    "fastloop.drivers.ladder.run",
    "fastloop.drivers.ladder.sizing",
    "fastloop.drivers.ladder.state",
    "fastloop.drivers.ladder.wording",
    "fastloop.drivers.doctor",
    "fastloop.speedups.batch_size.batch_size",
    "fastloop.device",
    "fastloop.drivers.targets",
    "fastloop.lightning",
    "fastloop.measure.stats",
    "fastloop.measure.flops",
    "fastloop.measure.timer",
    "fastloop.speedups.base",
    "fastloop.speedups.ladder_traits",
    "fastloop.adapters.lightning_graph",
    "fastloop.speedups.cuda_graph.captured_step",
    "fastloop.speedups.cuda_graph.graph_capture",
    "fastloop.speedups.cuda_graph.graph_guard",
    "fastloop.cuda_env",
    "fastloop.speedups.cudnn_benchmark",
    "fastloop.speedups.workers",
    "fastloop.speedups.deferred_logging",
    "fastloop.adapters.lightning_logging",
    "fastloop.streams",
    "fastloop.drivers.run_document",
    "fastloop.drivers.pick_check",
    "fastloop.drivers.paired_run",
    "fastloop.report.format",
    "fastloop.adapters.step_source",
    "fastloop.measure.sync_site",
    "fastloop.recipes.imagenet.module",
    "fastloop.recipes.imagenet.target",
    "fastloop.report.figure_check",
    "fastloop.report.figures",
    "fastloop.measure.fit_clock",
    "fastloop.measure.until",
    "fastloop.drivers.fit",
    "fastloop.drivers.fit_result",
    "fastloop.drivers.ab_fit",
    "fastloop.drivers.fit_share",
    "fastloop.report.fit",
    "fastloop.recipes.demo.target",
]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.failed == 0 and result.attempted > 0
