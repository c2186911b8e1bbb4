"""How busy the GPU is during a step, and how often the host waits for it.

CUDA events time a step from the host's point of view of the stream; they cannot say whether
the GPU worked all that time or sat idle while the host (Python, framework hooks, kernel
launches) prepared the next kernels. A short profile of a few extra steps can: the union of the
kernel, copy and memset intervals on the GPU timeline over the span from the first GPU activity
to the last is the busy fraction; the rest is idle, and what of it is not data wait is idle
*while the host works*. The same trace counts the host's synchronizing CUDA calls per step
(``cudaStreamSynchronize`` from ``.item()``, a pageable copy's implicit wait, ...), the usual
reason a fast GPU waits for a slow host.

The profiled steps are extra steps after the measured ones (the profiler's own overhead never
touches the step statistics); with 3 or more steps the edges of the span weigh little.

Example (the interval arithmetic, which needs no GPU):
    >>> busy_span([(0, 10), (5, 20), (30, 40)])
    (30.0, 40.0)
"""

from __future__ import annotations

from typing import Any

__all__ = ["SYNC_CALLS", "GpuProfile", "busy_span", "summarize_trace"]

SYNC_CALLS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpy",
              "cudaStreamWaitEvent_host", "cuStreamSynchronize", "cuCtxSynchronize")
"""CUDA runtime/driver calls that make the host wait for the GPU (``cudaMemcpy``: the
synchronous copy ``.item()``/``.cpu()`` use). ``cudaMemcpyAsync`` from pageable memory also waits
but cannot be told apart in the trace; pinned batches avoid it."""


def busy_span(intervals: list[tuple[float, float]]) -> tuple[float, float]:
    """(busy, span): the length of the union of ``intervals`` and the span from the first start
    to the last end (same unit as the input)."""
    if not intervals:
        return 0.0, 0.0
    ivs = sorted(intervals)
    busy, (cur_s, cur_e) = 0.0, ivs[0]
    for s, e in ivs[1:]:
        if s > cur_e:
            busy += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    busy += cur_e - cur_s
    return float(busy), float(max(e for _, e in ivs) - ivs[0][0])


def summarize_trace(gpu_intervals: list[tuple[float, float]], host_calls: list[str], steps: int) -> dict:
    """The profile's answer from GPU activity intervals (microseconds) and host CUDA call names."""
    busy, span = busy_span(gpu_intervals)
    syncs: dict[str, int] = {}
    for name in host_calls:
        if name in SYNC_CALLS:
            syncs[name] = syncs.get(name, 0) + 1
    return {
        "profiled_steps": steps,
        "gpu_busy_frac": busy / span if span > 0 else None,
        "gpu_busy_ms_per_step": busy / 1e3 / steps if steps else None,
        "span_ms_per_step": span / 1e3 / steps if steps else None,
        "host_syncs_per_step": sum(syncs.values()) / steps if steps else None,
        "sync_calls": syncs,
        "method": (f"torch.profiler (CUDA activity) over {steps} extra steps after the measured ones: union of "
                   "kernel/copy/memset intervals / span from the first GPU activity to the last"),
    }


class GpuProfile:
    """Profile a few steps of any loop: ``start()``, run the steps, ``stop(steps)``.

    ``stop`` returns :func:`summarize_trace`'s dict, or ``{"error": ...}`` when the profiler is
    unavailable (no CUPTI, another profiler active): a missing profile never fails a run.
    """

    def __init__(self) -> None:
        self._prof: Any = None
        self.error: str | None = None

    def start(self) -> None:
        import torch

        try:
            torch.cuda.synchronize()
            self._prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA])
            self._prof.__enter__()
        except Exception as err:  # noqa: BLE001 - the profile is optional evidence
            self._prof, self.error = None, f"{type(err).__name__}: {err}"

    def stop(self, steps: int) -> dict:
        import torch

        if self._prof is None:
            return {"error": self.error or "the profiler did not start"}
        try:
            torch.cuda.synchronize()
            self._prof.__exit__(None, None, None)
            gpu, host = [], []
            for ev in self._prof.events():
                kind = str(getattr(ev, "device_type", "")).rsplit(".", 1)[-1]
                if kind == "CUDA":
                    gpu.append((float(ev.time_range.start), float(ev.time_range.end)))
                else:
                    host.append(ev.name)
            return summarize_trace(gpu, host, steps)
        except Exception as err:  # noqa: BLE001
            return {"error": f"{type(err).__name__}: {err}"}
        finally:
            self._prof = None
