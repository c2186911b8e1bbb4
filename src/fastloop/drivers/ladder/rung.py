"""A rung: what one step of the ladder measured (its configuration's runs, merged, with the
bottleneck, the step's breakdown and the feed line) and what the search decided there. It is
written into the document as the rung dict of the JSON contract (DESIGN.md): the measured
configuration's keys, then ``rung``, ``spec``, ``rung_status``, ``rung_reason`` and the decision's.

Example:
    >>> rung = Rung.of_runs("+bf16", "bf16", None, "skipped", "no CUDA")
    >>> rung.to_dict()
    {'speedups': [], 'repeats': 0, 'rung': '+bf16', 'spec': 'bf16', 'rung_status': 'skipped', 'rung_reason': 'no CUDA'}
"""

from __future__ import annotations

from dataclasses import dataclass, field

from fastloop.compare import Runs, merge_runs
from fastloop.drivers.doctor import diagnose
from fastloop.drivers.ladder.wording import feed_line
from fastloop.measure.run_result import RunResult

__all__ = ["Rung", "breakdown"]


def breakdown(doc: dict) -> dict:
    """Where a rung's mean step goes: waiting for data, and the rest (host + GPU work); on CUDA,
    with the run's GPU profile, the rest splits into GPU busy and GPU idle while the host works.

    Example:
        >>> breakdown({"step_s": {"mean": 0.1}, "data_wait_frac": 0.25})["data_wait_s"]
        0.025
    """
    run = RunResult.from_dict(doc)
    mean, wait = run.step_s.mean, run.data_wait_frac
    if not mean or wait is None:
        return {}
    out = {"step_s": mean, "data_wait_s": mean * wait, "compute_s": mean * (1 - wait), "data_wait_frac": wait}
    busy = (run.gpu_profile or {}).get("gpu_busy_frac")
    if busy is not None:  # CUDA: the rest of the step splits into GPU busy and GPU idle while the host works
        out["gpu_busy_s"] = mean * busy
        out["host_idle_s"] = max(0.0, mean * (1 - busy - wait))
        out["gpu_busy_frac"] = busy
    return out


@dataclass(frozen=True, kw_only=True, slots=True)
class Rung:
    """One rung of the ladder. Made by :meth:`of_runs`; what the search decided is added with
    :func:`dataclasses.replace` before the ladder's state records it (it is never changed after)."""

    label: str
    """What the rung tried: ``+bf16``, ``-compile`` (an ablation), ``baseline``, ``selected: ...``."""
    spec: str
    """The configuration it measured."""
    status: str
    """applied, skipped, failed; in progress or interrupted for a comparison still under way."""
    reason: str = ""
    measured: dict = field(default_factory=dict)
    """Its configuration's runs merged (:func:`~fastloop.compare.merge_runs`), the steps' times left out."""
    bottleneck: dict | None = None
    """The doctor's diagnosis of its runs (None where none finished)."""
    breakdown: dict | None = None
    feed: str | None = None
    """The loader's rate against the step's demand (:func:`~fastloop.drivers.ladder.wording.feed_line`)."""
    compared: bool = False
    """Measured against the configuration it was added to or taken out of (``vs_spec``)."""
    vs_spec: str | None = None
    runs_per_side: int | None = None
    speedup_vs_prev: dict | None = None
    """The comparison's interval (None where it had no verdict), written where ``compared``."""
    stage: str | None = None
    members: list[str] | None = None
    ablation: str | None = None
    """The member an ablation took out."""
    sized: str | None = None
    """The self-sized speedup whose size this rung measured."""
    inactive: dict[str, str] | None = None
    """Members that skipped themselves or fell back inside the runs: name -> status and reason."""
    decision: str | None = None
    measured_not_faster: list[str] | None = None
    moved: str | None = None
    """How the bottleneck moved after this rung was kept (:func:`~fastloop.drivers.ladder.wording.moved_head`)."""
    final: bool = False
    """The final comparison of the selected set with the baseline (its interval: ``speedup_vs_baseline``)."""
    speedup_vs_baseline: dict | None = None

    @classmethod
    def of_runs(cls, label: str, spec: str, runs: Runs | None, status: str, reason: str = "") -> Rung:
        """A rung of ``runs`` (None: nothing was run), with its bottleneck, breakdown and feed line."""
        doc = merge_runs(runs) if runs is not None else {"speedups": [], "repeats": 0}
        diagnosed: dict = {}
        if runs is not None and runs.docs:
            diagnosed = {"bottleneck": diagnose(doc), "breakdown": breakdown(doc), "feed": feed_line(doc) or None}
        doc.pop("step_s_all", None)
        doc.pop("wait_s_all", None)
        return cls(label=label, spec=spec, status=status, reason=reason, measured=doc, **diagnosed)

    def to_dict(self) -> dict:
        """The rung as the document holds it."""
        out = dict(self.measured)
        out.update(rung=self.label, spec=self.spec, rung_status=self.status, rung_reason=self.reason)
        if self.bottleneck is not None:
            out["bottleneck"] = self.bottleneck
            out["breakdown"] = self.breakdown
        if self.feed:
            out["feed"] = self.feed
        if self.compared:
            out.update(vs_spec=self.vs_spec, runs_per_side=self.runs_per_side, speedup_vs_prev=self.speedup_vs_prev)
        for key in ("stage", "members", "ablation", "sized", "inactive", "decision", "measured_not_faster"):
            value = getattr(self, key)
            if value is not None:
                out[key] = value
        if self.moved is not None and self.bottleneck is not None:
            out["bottleneck_moved"] = f"{self.moved} next: {self.bottleneck['recommendation']}"
        if self.final:
            out.update(speedup_vs_baseline=self.speedup_vs_baseline, final=True)
        return out

    @property
    def result(self) -> RunResult:
        """What it measured, typed (its configuration's runs merged)."""
        return RunResult.from_dict(self.measured)

    @property
    def data_wait_frac(self) -> float | None:
        return self.result.data_wait_frac

    @property
    def extra(self) -> dict:
        return self.result.extra
