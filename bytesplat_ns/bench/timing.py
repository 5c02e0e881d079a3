"""Timing helpers of the GPU benchmarks: CUDA-event medians, and one failing path recorded
without hiding the others."""

from __future__ import annotations

import statistics
import sys
from typing import Callable, Dict, List

import torch


def time_ms(fn: Callable[[], None], warmup: int, repeats: int) -> Dict[str, float]:
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times: List[float] = []
    for _ in range(repeats):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b))
    return {"median_ms": statistics.median(times), "min_ms": min(times), "max_ms": max(times)}


def record_or_error(out: Dict, key: str, fn: Callable[[], object]) -> None:
    """Record fn()'s result under key, or the error (one failing path must not hide the others)."""
    try:
        out[key] = fn()
    except Exception as e:  # noqa: BLE001
        out[key] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
        print(f"[bench] {key} failed: {out[key]['error']}", file=sys.stderr, flush=True)
