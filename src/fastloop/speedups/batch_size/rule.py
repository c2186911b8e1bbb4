"""The batch-size search's rule, apart from training anything: double until a size fails,
bisect to the largest that fits, then choose under the margin (the largest, or the fastest)."""

from __future__ import annotations

from collections.abc import Callable

from fastloop.errors import FastloopError

__all__ = ["largest_fitting"]


def check_search(objective: str, margin: float, max_size: int) -> None:
    if objective not in ("max", "throughput"):
        raise FastloopError(f"--objective must be max or throughput, got {objective!r}")
    if not 0 < margin <= 1:
        raise FastloopError(f"--margin must be in (0, 1], got {margin}")
    if max_size < 1:
        raise FastloopError(f"--max must be >= 1, got {max_size}")


def largest_fitting(
    fits: Callable[[int], bool],
    start: int,
    max_size: int,
    precision: float,
    data_limited: Callable[[], bool] = lambda: False,
) -> int:
    """The largest batch size for which ``fits(size)`` holds: double from ``start`` until a size
    fails (or ``max_size``, or the data yields smaller batches: ``data_limited()``), then bisect
    until the gap is at most ``precision`` of the failing size.

    Example:
        >>> tried = []
        >>> largest_fitting(lambda n: tried.append(n) or n <= 100, 8, 4096, 1 / 16)
        100
        >>> tried
        [8, 16, 32, 64, 128, 96, 112, 104, 100]
    """
    if not fits(start):
        if start == 1:
            raise FastloopError(
                "batch size 1 does not fit in memory: the model itself is too large for this device "
                "(try bf16, a smaller model, or more GPUs via FSDP)"
            )
        lo, hi = 0, start
    else:
        lo, hi = start, None
        while hi is None and not data_limited():
            nxt = min(lo * 2, max_size)
            if nxt == lo:
                break
            if fits(nxt):
                lo = nxt
            else:
                hi = nxt
    if hi is not None:
        while hi - lo > max(1, int(precision * hi)):
            mid = (lo + hi) // 2
            if fits(mid):
                lo = mid
            else:
                hi = mid
    if lo == 0:
        lo = 1
        if not fits(1):
            raise FastloopError("batch size 1 does not fit in memory: the model itself is too large for this device")
    return lo


def choose_batch_size(
    trials: list[dict], attempt: Callable[[int], bool], max_fitting: int, margin: float, objective: str
) -> int:
    """The chosen size: at most ``margin * max_fitting``; the largest (``max``) or, among the sizes
    tried under that cap, the largest within 2% of the best throughput (``throughput``)."""
    cap = max(1, int(margin * max_fitting))
    ok = [t for t in trials if t["ok"] and t["batch_size"] <= cap]
    if objective == "throughput" and not any(t["batch_size"] == cap for t in ok) and cap != max_fitting:
        attempt(cap)
        ok = [t for t in trials if t["ok"] and t["batch_size"] <= cap]
    if objective == "max" or not ok:
        return cap
    best = max(t["throughput"] or 0 for t in ok)
    # the largest size within 2% of the best throughput: noise should not pick a tiny batch
    return max(t["batch_size"] for t in ok if (t["throughput"] or 0) >= 0.98 * best)
