"""How crowded the fused kernel's tiles are during training (issue 4's measurement).

Every ``--pipeline.model.tile-stats-every`` steps the model's render of that step is binned the way
the fused backend bins it (``pruning.tile_entries``, any backend) and the share of tiles whose list
is longer than the fused kernel's on-chip capacity is logged (tensorboard ``tiles/*``) and kept in
``model.tile_occupancy_log`` (the training benchmark writes it to its JSON). Off by default: it
costs one binning pass per logged step.
"""

from __future__ import annotations

from typing import Any, Dict, Optional

import torch

from bytesplat_ns.pruning import model_tile_capacity, tile_entries


@torch.no_grad()
def tile_occupancy(info: Dict[str, Any], capacity: int) -> Dict[str, float]:
    """Tile-list statistics of one render's ``info`` (radii, means2d, depths, width, height)."""
    keys, _, n_tiles = tile_entries(info)
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


def record_tile_occupancy(model: Any, step: int) -> Optional[Dict[str, float]]:
    """Called from the model's post-backward hook; logs every ``tile_stats_every`` steps."""
    every = int(getattr(model.config, "tile_stats_every", 0) or 0)
    info = getattr(model, "info", None)
    if every <= 0 or step % every != 0 or not info or "radii" not in info or "means2d" not in info:
        return None
    if not hasattr(model, "_tile_capacity"):
        model._tile_capacity = model_tile_capacity(model)
    if model._tile_capacity is None:
        return None  # CPU without a configured capacity: nothing to compare against
    stats = tile_occupancy(info, model._tile_capacity)
    stats.update(step=float(step), gaussians=float(model.num_points))
    if not hasattr(model, "tile_occupancy_log"):
        model.tile_occupancy_log = []
    model.tile_occupancy_log.append(stats)
    try:
        from nerfstudio.utils import writer

        for k in ("over_capacity_share", "p99", "max"):
            writer.put_scalar(f"tiles/{k}", stats[k], step)
    except Exception:  # pragma: no cover - logging must never break training
        pass
    return stats
