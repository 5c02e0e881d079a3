"""How fast the ranks' link is, measured at start-up for ``--pipeline.communicator auto``.

Every rank sends one message of ``size`` bytes to every other rank through the exchange the
communicators use (``exchange.exchange``: isend/irecv pairs), for two sizes, a few times each; the
slowest rank's median time per size gives a line ``t = latency + bytes / bandwidth`` (bytes: what
one rank sends in all). All ranks take part and get the same estimate (the times are all-reduced
with MAX), so they all choose the same exchange. A probe costs a few collectives of at most
``max(sizes) * (world - 1)`` bytes per rank, once per run.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Sequence

import torch
import torch.distributed as dist

from bytesplat_ns.distributed.exchange import all_reduce_, comm_device, exchange, rank_and_world

DEFAULT_SIZES = (1 << 18, 1 << 23)  # 256 KiB and 8 MiB per peer


@dataclass(frozen=True)
class LinkEstimate:
    bandwidth_bytes_per_s: float  # what one rank sends to all others per second
    latency_s: float  # fixed cost of one exchange round
    source: str  # "probe" or "config"

    @staticmethod
    def from_config(gbps: float, latency_us: float = 20.0) -> "LinkEstimate":
        """A link given in the config (``--pipeline.link-bandwidth-gbps``): gigabits per second."""
        return LinkEstimate(gbps * 1e9 / 8.0, latency_us * 1e-6, "config")

    def seconds(self, num_bytes: float, rounds: int = 1) -> float:
        return rounds * self.latency_s + num_bytes / self.bandwidth_bytes_per_s

    def describe(self) -> str:
        return f"{self.bandwidth_bytes_per_s * 8 / 1e9:.1f} Gb/s, {self.latency_s * 1e6:.0f} us per round ({self.source})"


def _timed_round(size: int, world: int, rank: int, device: torch.device, group) -> float:
    send = [torch.empty(0 if d == rank else size, dtype=torch.uint8, device=device) for d in range(world)]
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    exchange(send, [0 if s == rank else size for s in range(world)], group, phase="link probe")
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - start


def probe_link(group=None, sizes: Sequence[int] = DEFAULT_SIZES, repeats: int = 3) -> LinkEstimate:
    """The link estimate of ``group`` (one process: an infinitely fast link, no latency)."""
    rank, world = rank_and_world(group)
    if world == 1:
        return LinkEstimate(float("inf"), 0.0, "probe")
    device = comm_device(group)
    medians = []
    for size in sizes:
        _timed_round(size, world, rank, device, group)  # warm-up: connections, buffers
        medians.append(statistics.median(_timed_round(size, world, rank, device, group) for _ in range(repeats)))
    times = torch.tensor(medians, dtype=torch.float64, device=device)
    all_reduce_(times, op=dist.ReduceOp.MAX, group=group, phase="link probe")  # the slowest rank's, on every rank
    t_small, t_large = times.tolist()[0], times.tolist()[-1]
    b_small, b_large = sizes[0] * (world - 1), sizes[-1] * (world - 1)
    slope = max((t_large - t_small) / max(b_large - b_small, 1), 1e-15)  # seconds per byte
    latency = max(t_small - slope * b_small, 0.0)
    return LinkEstimate(1.0 / slope, latency, "probe")
