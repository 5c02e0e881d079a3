"""The benchmarks' CUDA-event timing: inputs prepared outside the timing, and launches queued ahead of the GPU
so that the host's issue time is not timed."""

from __future__ import annotations

import pytest
import torch

from bytesplat_ns.bench.timing import time_ms

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def test_what_prepare_does_is_not_timed():
    x = torch.zeros(1024, device="cuda")
    slow = time_ms(lambda: x.add_(1), 1, 5, prepare=lambda: torch.cuda._sleep(50_000_000))
    assert slow["median_ms"] < 1.0  # the spin (tens of ms) ran before the start event


def test_queued_launches_time_the_gpu_work_not_the_hosts_issue():
    """Many tiny launches: the host issues them slower than the GPU runs them, so timed from an idle GPU the
    events measure the host; queued behind a spin they measure the GPU, and the host never caught up."""
    x = torch.zeros(16, device="cuda")

    def many_launches():
        for _ in range(300):
            x.add_(1)

    issued = time_ms(many_launches, 2, 7)
    queued = time_ms(many_launches, 2, 7, queue_ms=20.0)
    assert "host_caught_up" not in issued
    assert queued["host_caught_up"] == 0 and queued["queue_ms"] == 20.0
    assert queued["median_ms"] < issued["median_ms"]
    # a spin shorter than the host's issue time is reported, not hidden
    short = time_ms(many_launches, 2, 5, queue_ms=0.001)
    assert short["host_caught_up"] > 0
