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


@pytest.fixture(autouse=True)
def _process_state_as_it_was():
    """What one test changes of the process, put back after it, so that no test passes or fails for
    what an earlier one left: the thread count (a test that sets 1 made every later test slower),
    Lightning's ``rank_zero_only.rank`` (``LightningEnvironment.set_global_rank(1)`` sets it, and
    every later logger then wrote nothing: CSV files went missing), Inductor's settings (a setting
    deleted by ``monkeypatch``'s undo is hidden from Inductor, whose compile then fails), the float32
    matmul precision and the default dtype."""
    from lightning.fabric.utilities.rank_zero import rank_zero_only

    threads, rank = torch.get_num_threads(), getattr(rank_zero_only, "rank", 0)
    precision, dtype = torch.get_float32_matmul_precision(), torch.get_default_dtype()
    import torch._inductor.config as inductor

    inductor_before = inductor.save_config()
    yield
    torch.set_num_threads(threads)
    rank_zero_only.rank = rank
    torch.set_float32_matmul_precision(precision)
    torch.set_default_dtype(dtype)
    inductor.load_config(inductor_before)
    for entry in inductor._config.values():
        entry.hide = False
