"""Timing helpers of the GPU benchmarks: CUDA-event medians, and one failing path recorded
without hiding the others."""

from __future__ import annotations

import statistics
import sys
from typing import Callable, Dict, List, Optional

import torch


# How long the raster benchmark's GPU spins before each timed pass (``time_ms(queue_ms=)``): well above the host's
# time to issue one raster + loss pass (under 2 ms for gsplat + fussim or ours), so no launch waits on the host.
QUEUE_MS = 5.0
_SPIN_CYCLES_PER_MS: Optional[float] = None


def spin_cycles_per_ms() -> float:
    """GPU clock cycles of ``torch.cuda._sleep`` per millisecond, measured once per process."""
    global _SPIN_CYCLES_PER_MS
    if _SPIN_CYCLES_PER_MS is None:
        torch.cuda._sleep(1_000_000)  # the first launch loads the kernel
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        torch.cuda._sleep(10_000_000)
        b.record()
        torch.cuda.synchronize()
        _SPIN_CYCLES_PER_MS = 10_000_000 / max(a.elapsed_time(b), 1e-3)
    return _SPIN_CYCLES_PER_MS


def time_ms(fn: Callable[[], None], warmup: int, repeats: int, prepare: Optional[Callable[[], None]] = None,
            queue_ms: float = 0.0) -> Dict[str, float]:
    """Median, min and max milliseconds of ``fn`` between two CUDA events, over ``repeats`` calls after ``warmup``.

    ``prepare``: called before each call, outside the timing (e.g. fresh input tensors for a pass that
    consumes its inputs' gradients). ``queue_ms`` > 0: the GPU spins that long before each timed call, so the
    host has issued the call's launches before the first one runs and the events time the GPU's work alone, as
    a CUDA graph replays it; ``host_caught_up`` counts the calls whose launches the host had not all issued
    when the GPU reached the first (the spin was too short for them: raise ``queue_ms``).
    """
    for _ in range(warmup):
        if prepare is not None:
            prepare()
        fn()
    torch.cuda.synchronize()
    spin = int(queue_ms * spin_cycles_per_ms()) if queue_ms > 0 else 0
    times: List[float] = []
    caught_up = 0
    for _ in range(repeats):
        if prepare is not None:
            prepare()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        if spin:
            torch.cuda._sleep(spin)
        a.record()
        fn()
        b.record()
        caught_up += bool(spin) and a.query()  # the GPU already past the start: it may have waited for launches
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b))
    out = {"median_ms": statistics.median(times), "min_ms": min(times), "max_ms": max(times)}
    if spin:
        out.update(queue_ms=queue_ms, host_caught_up=caught_up)
    return out


def record_or_error(out: Dict, key: str, fn: Callable[[], object]) -> None:
    """Record fn()'s result under key, or the error (one failing path must not hide the others)."""
    try:
        out[key] = fn()
    except Exception as e:  # noqa: BLE001
        out[key] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
        print(f"[bench] {key} failed: {out[key]['error']}", file=sys.stderr, flush=True)
