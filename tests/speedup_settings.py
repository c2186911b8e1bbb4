"""Parity settings for every registered speedup (the pattern of Composer's per-algorithm test
settings). A speedup added to the registry without an entry here fails tests/test_parity.py.

Each entry: the target both adapters train, the largest relative loss difference allowed
between the Lightning run and the plain-loop run with the speedup on (0.0: bitwise equal,
because the math is the same), and whether the speedup can apply on a CPU at all (if not, both
adapters must skip it with the same reason; its GPU parity is in tests/test_gpu.py).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Parity:
    target: str
    rtol: float
    cpu: bool
    plain_loop: bool = True
    """False where the speedup exists only in the run driver (the batch-size search) or only under
    Lightning (deferred_logging: the plain loop has no logging to defer)."""
    slow: bool = False
    """Marks the CPU parity run slow (compile: tens of seconds per process on a CPU)."""
    option: str = ""
    """Run as ``name:option`` (workers: a fixed count, so that it applies whatever it measures)."""
    step_skip: str = ""
    """Where the speedup acts only in a whole fit (fast_validation): the reason a step run skips it with."""


MLP, CONV = "tests/targets.py:tiny_mlp", "tests/targets.py:tiny_conv"
FIT_ONLY = (
    "limit_val_batches=0: nothing is validated (as in a step benchmark, `fastloop run` or `ab` without --fit): "
    "fast_validation acts in whole fits"
)

PARITY: dict[str, Parity] = {
    "gpu_resident": Parity(MLP, 0.0, cpu=False),
    "workers": Parity(MLP, 0.0, cpu=True, option="2"),
    "pin_memory": Parity(MLP, 0.0, cpu=False),
    "prefetch": Parity(MLP, 0.0, cpu=False),
    "tf32": Parity(MLP, 0.0, cpu=False),
    "cudnn_benchmark": Parity(CONV, 0.0, cpu=False),
    "bf16": Parity(MLP, 2e-2, cpu=True),  # both autocast on the CPU; Lightning's plugin casts alike
    "fp16": Parity(MLP, 0.0, cpu=False),
    "fused_optimizer": Parity(MLP, 1e-5, cpu=True),
    "channels_last": Parity(CONV, 1e-5, cpu=True),
    "compile": Parity(MLP, 1e-4, cpu=True),  # Inductor on the CPU: ~20 s
    "cuda_graph": Parity(MLP, 0.0, cpu=False),
    "batch_size": Parity(MLP, 0.0, cpu=True, plain_loop=False),
    "dali": Parity(MLP, 0.0, cpu=False),
    "fp8": Parity(MLP, 0.0, cpu=False),
    "ddp_comm": Parity(MLP, 0.0, cpu=False),  # multi-rank only: tests/test_ddp.py  # GPU parity: tests/test_gpu.py
    "fused_loss": Parity(MLP, 0.0, cpu=False),
    "gpu_augment": Parity("tests/targets.py:augmented_images", 0.0, cpu=False),  # the same seeded draws
    "pad_buckets": Parity("tests/targets.py:masked_text", 1e-5, cpu=True),  # the padding is masked
    # the values are read later, the training is the same; the plain loop has no logging (it skips:
    # tests/test_deferred_logging.py)
    "deferred_logging": Parity(MLP, 0.0, cpu=True, plain_loop=False),
    "async_checkpoint": Parity(MLP, 0.0, cpu=True),  # saves only; its files: tests/test_async_checkpoint.py
    # validation only: a step run validates nothing and the plain loop has no validation loop; its fits (the
    # same training with it, the same metrics) are in tests/test_fast_validation.py
    "fast_validation": Parity(MLP, 0.0, cpu=True, plain_loop=False, step_skip=FIT_ONLY),
}
