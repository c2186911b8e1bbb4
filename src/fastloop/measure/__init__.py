"""Honest measurement: step timing with data wait, statistics, FLOPs/MFU, environment stamp."""

from fastloop.measure.env import env_stamp
from fastloop.measure.stats import RatioCI, bootstrap_ratio_ci, summarize
from fastloop.measure.timer import StepStats, StepTimer

__all__ = ["RatioCI", "StepStats", "StepTimer", "bootstrap_ratio_ci", "env_stamp", "summarize"]
