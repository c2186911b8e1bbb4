"""Every speedup, one module each; importing this package fills the registry. The speedup
classes are exported here, where a user looks for them: ``Compile(mode="max-autotune")``,
``Workers(count=8)`` build the same objects as ``resolve("compile:max-autotune,workers:8")``.

Example:
    >>> from fastloop.speedups import Compile, Workers, resolve
    >>> Compile(shapes="static").spec, Workers(count=4).spec
    ('compile:shapes=static', 'workers:4')
    >>> resolve(Compile(shapes="static").spec) == [Compile(shapes="static")]
    True
"""

from fastloop.speedups.async_checkpoint import AsyncCheckpoint
from fastloop.speedups.base import (
    REGISTRY,
    Context,
    Fallback,
    Options,
    Record,
    Skip,
    Speedup,
    apply_all,
    register,
    resolve,
    speedup_names,
)
from fastloop.speedups.batch_size.batch_size import BatchSize
from fastloop.speedups.channels_last import ChannelsLast
from fastloop.speedups.compile.compile import Compile
from fastloop.speedups.cuda_graph.cuda_graph import CudaGraph
from fastloop.speedups.cudnn_benchmark import CudnnBenchmark
from fastloop.speedups.dali.dali import Dali
from fastloop.speedups.ddp_comm import DDPComm
from fastloop.speedups.deferred_logging import DeferredLogging
from fastloop.speedups.fast_validation import FastValidation
from fastloop.speedups.fp8 import FP8
from fastloop.speedups.fused_loss import FusedLoss
from fastloop.speedups.fused_optimizer import FusedOptimizer
from fastloop.speedups.gpu_augment.gpu_augment import GPUAugment
from fastloop.speedups.gpu_resident.gpu_resident import GPUResident
from fastloop.speedups.pad_buckets.pad_buckets import PadBuckets
from fastloop.speedups.pin_memory import PinMemory
from fastloop.speedups.precision import BF16, FP16
from fastloop.speedups.prefetch import Prefetch
from fastloop.speedups.run import Run
from fastloop.speedups.tf32 import TF32
from fastloop.speedups.workers import Workers

__all__ = [
    "BF16",
    "FP16",
    "FP8",
    "REGISTRY",
    "TF32",
    "AsyncCheckpoint",
    "BatchSize",
    "ChannelsLast",
    "Compile",
    "Context",
    "CudaGraph",
    "CudnnBenchmark",
    "DDPComm",
    "DeferredLogging",
    "Dali",
    "Fallback",
    "FastValidation",
    "FusedLoss",
    "FusedOptimizer",
    "GPUAugment",
    "GPUResident",
    "Options",
    "PadBuckets",
    "PinMemory",
    "Prefetch",
    "Record",
    "Run",
    "Skip",
    "Speedup",
    "Workers",
    "apply_all",
    "register",
    "resolve",
    "speedup_names",
]
