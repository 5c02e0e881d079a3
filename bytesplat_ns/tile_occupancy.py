"""How crowded the fused kernel's tiles are during training (what hardware-aware pruning acts on).

Every ``--pipeline.model.tile-stats-every`` steps the model's render of that step is binned the way
the fused backend bins it (``pruning.tile_entries``, any backend) and the share of tiles whose list
is longer than the fused kernel's on-chip capacity is logged (tensorboard ``tiles/*``) and kept in
``model.tile_occupancy.log`` (the training benchmark writes it to its JSON). Off by default: it
costs one binning pass per logged step.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional

import torch

from bytesplat_ns.pruning import configured_tile_capacity, tile_entries


@torch.no_grad()
def tile_occupancy(info: Dict[str, Any], capacity: int, opacity_aware: bool = False) -> Dict[str, float]:
    """Tile-list statistics of one render's ``info`` (radii, means2d, depths, width, height; conics and
    opacities with ``opacity_aware``, the fused backend's reach: ``pruning.tile_entries``)."""
    keys, _, n_tiles = tile_entries(info, opacity_aware=opacity_aware)
    counts = torch.bincount(keys, minlength=n_tiles).float()
    if counts.numel() == 0:
        return dict(tiles=0, over_capacity_share=0.0, mean=0.0, p99=0.0, max=0.0, capacity=float(capacity))
    return dict(
        tiles=float(n_tiles),
        over_capacity_share=float((counts > capacity).float().mean()),
        mean=float(counts.mean()),
        p99=float(torch.quantile(counts, 0.99)),
        max=float(counts.max()),
        capacity=float(capacity),
    )


class TileOccupancyMonitor:
    """The model's tile statistics: every ``every`` steps (0: never) the render's ``info`` against the
    tile capacity (``configured`` or the fused kernel's on the render's CUDA device, resolved on the
    first logged step); each logged step appends to :attr:`log`. ``opacity_aware``: the fused
    backend's tile reach (``fused.opacity_aware_tiles``), so the lists counted are the ones it bins."""

    def __init__(self, every: int, configured_capacity: int = 0, opacity_aware: bool = False):
        self.every = int(every or 0)
        self.configured_capacity = int(configured_capacity or 0)
        self.opacity_aware = bool(opacity_aware)
        self.capacity: Optional[int] = None
        self._resolved = False
        self.log: List[Dict[str, float]] = []

    def record(self, info: Optional[Dict[str, Any]], step: int, gaussians: int) -> Optional[Dict[str, float]]:
        """Called before the densification of ``step`` (``info`` is that step's render)."""
        if self.every <= 0 or step % self.every != 0 or not info or "radii" not in info or "means2d" not in info:
            return None
        if not self._resolved:
            self.capacity = configured_tile_capacity(self.configured_capacity, info["means2d"].device)
            self._resolved = True
        if self.capacity is None:
            return None  # CPU without a configured capacity: nothing to compare against
        stats = tile_occupancy(info, self.capacity, self.opacity_aware)
        stats.update(step=float(step), gaussians=float(gaussians))
        self.log.append(stats)
        try:
            from nerfstudio.utils import writer

            for k in ("over_capacity_share", "p99", "max"):
                writer.put_scalar(f"tiles/{k}", stats[k], step)
        except Exception:  # pragma: no cover - logging must never break training
            pass
        return stats
