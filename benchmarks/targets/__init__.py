"""Targets written as their authors wrote them (not for fastloop), for the GPU benchmarks."""
