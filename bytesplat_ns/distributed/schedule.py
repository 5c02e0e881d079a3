"""Conflict-free camera-view consolidation (Splaxel; docs/design.md, "Distributed design"): which rank composites which view.

Every view of a batch is composited by exactly one rank (no two ranks composite the same view: no
conflict), and the ranks get a balanced share: ``floor(B/R)`` or ``ceil(B/R)`` views each, with
the extra views going where the predicted work is lowest. Within that constraint the schedule
minimises what has to move: the compositing rank of a view receives the partial images of every
cell it does not own itself, so a view is best composited where most of its (predicted) pixels
are already local.

Input: ``pixels[v][r]``, the predicted partial-image pixels rank r produces for view v (the sum of
its cells' projected-rectangle areas, known on every rank from the cells' content bounds, so every
rank computes the same schedule without communication). Cost of compositing v at r: the remote
pixels ``sum_{s != r} pixels[v][s]`` (what r receives), plus the work of compositing all of them.

Greedy with regret: views are assigned in order of decreasing regret (the cost difference between
their best and second-best rank), each to its cheapest rank that still has capacity, ties broken
by the lower current load then the lower rank. Deterministic.

Idle time: every rank renders its cells for all views (the same work whoever composites), then
waits for the exchange and composites its share. The predicted idle time of rank r is
``max_s load_s - load_r`` with ``load_r`` the pixels it receives and composites
(``ScheduleReport``); the measured idle time (the seconds each rank spent blocked in exchanges) is
reported by ``pixel.PixelStats`` and logged per rank.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Sequence


@dataclass
class ScheduleReport:
    views_of_rank: List[List[int]]
    load: List[float]  # predicted pixels received + composited per rank
    remote_pixels: float  # predicted pixels that cross ranks in total

    def predicted_idle(self) -> List[float]:
        """Per rank, how much less compositing work than the busiest rank (in pixels)."""
        top = max(self.load) if self.load else 0.0
        return [top - x for x in self.load]

    def log_line(self) -> str:
        idle = self.predicted_idle()
        top = max(self.load) if self.load else 0.0
        parts = [f"rank {r}: views {v} load {int(l)} px idle {100.0 * i / top if top else 0.0:.0f}%" for r, (v, l, i) in enumerate(zip(self.views_of_rank, self.load, idle))]
        return f"pixel schedule: {int(self.remote_pixels)} remote px; " + "; ".join(parts)


def schedule_views(pixels: Sequence[Sequence[float]], world: int) -> ScheduleReport:
    """Assign the B views (rows of ``pixels`` [B][R]) to compositing ranks (see module docstring)."""
    B = len(pixels)
    base, extra = divmod(B, world)
    total = [float(sum(row)) for row in pixels]
    cost = [[total[v] - float(pixels[v][r]) for r in range(world)] for v in range(B)]
    # ranks may take ``base`` views each, and ``extra`` of them one more
    taken = [0] * world
    extras_left = extra
    load = [0.0] * world
    assign = [-1] * B

    def regret(v: int) -> float:
        c = sorted(cost[v])
        return (c[1] - c[0]) if len(c) > 1 else 0.0

    for v in sorted(range(B), key=lambda v: (-regret(v), v)):
        best = None
        for r in sorted(range(world), key=lambda r: (cost[v][r], load[r], r)):
            if taken[r] < base or (taken[r] == base and extras_left > 0):
                best = r
                break
        assert best is not None
        if taken[best] == base:
            extras_left -= 1
        taken[best] += 1
        assign[v] = best
        load[best] += total[v]
    views_of_rank = [[v for v in range(B) if assign[v] == r] for r in range(world)]
    remote = sum(cost[v][assign[v]] for v in range(B))
    return ScheduleReport(views_of_rank, load, remote)
