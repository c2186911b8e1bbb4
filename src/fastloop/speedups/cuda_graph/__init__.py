"""``cuda_graph``: the whole training step as CUDA graphs, in tiers; its capture engine
(:mod:`.captured_step`), the capture core (:mod:`.graph_capture`) and the guard before every replay
(:mod:`.graph_guard`).
"""

from fastloop.speedups.cuda_graph.cuda_graph import (
    MAX_GRAPHS,
    TIERS,
    CudaGraph,
    Tier,
    TierFacts,
    below_whole,
    common_blocker,
    tier_below_whole,
)

__all__ = [
    "CudaGraph",
    "MAX_GRAPHS",
    "TIERS",
    "Tier",
    "TierFacts",
    "below_whole",
    "common_blocker",
    "tier_below_whole",
]
