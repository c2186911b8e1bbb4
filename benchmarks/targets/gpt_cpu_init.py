"""The GPT recipe with its weights initialised on the CPU (as before round 10) and moved to the
GPU by Lightning: the other side of an A/B of the recipe's ``init_device``."""

from __future__ import annotations

from fastloop.recipes.gpt.target import make as _make


def make(**kwargs):
    kwargs.setdefault("init_device", "cpu")
    return _make(**kwargs)
