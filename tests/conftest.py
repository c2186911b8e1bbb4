import os
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
for p in (str(ROOT), str(ROOT / "src")):
    if p not in sys.path:
        sys.path.insert(0, p)
os.chdir(ROOT)  # targets are given as tests/targets.py:FUNC


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA (run on the GPU machine: pytest -m gpu)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    """Each test compiles with an empty dynamo cache, as each of fastloop's runs is a fresh process.
    Without it, enough tests compiling ``nn.Sequential`` in one pytest process reach dynamo's
    recompile limit (8 per code object), and a later test's compile silently runs eagerly
    ("compiled no graph"): test_zoo's bn_net failed that way depending on which tests ran first."""
    torch._dynamo.reset()
    yield
