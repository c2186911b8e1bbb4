"""``compile``: ``torch.compile`` on the step's model; the compile cache that outlives the process
(:mod:`.cache`).
"""

from fastloop.speedups.compile.compile import (
    CUDAGRAPH_MODES,
    Compile,
    apply_compile,
    check_compiled,
    compile_counters,
    compiled_by_user,
    compiled_nothing,
    compiles,
    graphs_so_far,
)

__all__ = [
    "CUDAGRAPH_MODES",
    "Compile",
    "apply_compile",
    "check_compiled",
    "compile_counters",
    "compiled_by_user",
    "compiled_nothing",
    "compiles",
    "graphs_so_far",
]
