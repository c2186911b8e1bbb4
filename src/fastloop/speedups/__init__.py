"""Every speedup, one module each; importing this package fills the registry."""

from fastloop.speedups import (  # noqa: F401  (imported for registration)
    batch_size,
    channels_last,
    compile,
    cuda_graph,
    cudnn_benchmark,
    dali,
    ddp_comm,
    fp8,
    fused_loss,
    fused_optimizer,
    gpu_augment,
    gpu_resident,
    pad_buckets,
    pin_memory,
    precision,
    prefetch,
    tf32,
    workers,
)
from fastloop.speedups.run import Run
from fastloop.speedups.base import (
    REGISTRY,
    Context,
    Fallback,
    Record,
    Skip,
    Speedup,
    apply_all,
    register,
    resolve,
    speedup_names,
)

__all__ = ["REGISTRY", "Context", "Fallback", "Record", "Run", "Skip", "Speedup", "apply_all", "register", "resolve", "speedup_names"]
