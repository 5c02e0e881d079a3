"""The ``auto`` strategy: pick ``sparse-grad`` or ``pixel`` per scene from a cost model of bytes to move.

Per training step of B views on R ranks (each view composited on one rank, the Gaussians or cells
spread evenly, so a fraction ``(R-1)/R`` of everything a view needs lives on other ranks):

- ``sparse-grad`` moves Gaussian records: every Gaussian visible in a view (in front of the camera,
  its mean's projection inside the image widened by 10%) travels forward as one 2D record
  (``forward_record_bytes``: 48 B with RGB), and the non-zero part of them (``nonzero_fraction``)
  comes back as a sparse gradient record (``sparse_grad_record_bytes``: 40 B), or all of them as
  dense 36 B rows where that is smaller::

      bytes_sg = B * visible_per_view * (R-1)/R * (48 + min(nonzero_fraction * 40, 36))

- ``pixel`` moves partial images: every cell sends its projected bounding rectangle (color D and
  transmittance, 4 B each) forward and receives the same amount of gradient back::

      bytes_px = B * sum_cells(rect area) * (R-1)/R * 2 * (D+1) * 4   (+ 16 B per rectangle)

The first grows with the number of Gaussians in view, the second with pixels (and the number of
cells covering them): many Gaussians on few pixels favour ``pixel``, few Gaussians on many pixels
favour ``sparse-grad``. ``choose`` returns the cheaper one and a log line with both estimates and
the quantities behind them. Transmittance pruning is not credited (it depends on the trained
opacities); the estimate for ``pixel`` is therefore an upper bound.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Optional

import torch
from torch import Tensor

from bytesplat_ns.distributed.cells import KdCells, content_bounds, gaussian_extent
from bytesplat_ns.distributed.communicators import dense_grad_record_bytes, forward_record_bytes, sparse_grad_record_bytes
from bytesplat_ns.distributed.pixel import RECT_BYTES, _area, project_box_rect
from bytesplat_ns.distributed.step import Views


LOG = logging.getLogger("bytesplat.auto")


@dataclass
class AutoDecision:
    choice: str  # "pixel" or "sparse-grad"
    pixel_bytes: float
    sparse_grad_bytes: float
    visible_per_view: float
    cell_pixels_per_view: float
    world: int
    num_views: int

    def log_line(self) -> str:
        mib = 1024.0 * 1024.0
        other = "sparse-grad" if self.choice == "pixel" else "pixel"
        mine, theirs = (self.pixel_bytes, self.sparse_grad_bytes) if self.choice == "pixel" else (self.sparse_grad_bytes, self.pixel_bytes)
        return (
            f"auto communicator: {self.choice} (est. {mine / mib:.3f} MiB/step) over {other} (est. {theirs / mib:.3f} MiB/step) "
            f"on {self.world} ranks, {self.num_views} views/step: {self.visible_per_view:.0f} Gaussians visible per view "
            f"(records: sparse-grad) vs {self.cell_pixels_per_view:.0f} cell pixels per view (partial images: pixel)"
        )


def sparse_grad_bytes(visible_per_view: float, num_views: int, world: int, channels: int = 3, nonzero_fraction: float = 0.7) -> float:
    remote = (world - 1) / world
    grad = min(nonzero_fraction * sparse_grad_record_bytes(channels), dense_grad_record_bytes(channels))  # sends_dense
    return num_views * visible_per_view * remote * (forward_record_bytes(channels) + grad)


def pixel_bytes(cell_pixels_per_view: float, cells_per_view: float, num_views: int, world: int, channels: int = 3) -> float:
    remote = (world - 1) / world
    return num_views * remote * (cell_pixels_per_view * 2 * (channels + 1) * 4 + cells_per_view * RECT_BYTES)


def visible_counts(means: Tensor, views: Views, slack: float = 0.1, near_plane: float = 0.01) -> Tensor:
    """[B] Gaussians whose mean is in front of the camera and projects inside the (widened) image."""
    m = means.detach().to(torch.float64).cpu()  # means and cameras may live on different devices
    R = views.viewmats[:, :3, :3].detach().to(torch.float64).cpu()
    t = views.viewmats[:, :3, 3].detach().to(torch.float64).cpu()
    cam = torch.einsum("bij,nj->bni", R, m) + t[:, None, :]
    z = cam[..., 2]
    K = views.Ks.detach().to(torch.float64).cpu()
    zs = z.clamp_min(near_plane)
    u = K[:, 0, 0, None] * cam[..., 0] / zs + K[:, 0, 2, None]
    v = K[:, 1, 1, None] * cam[..., 1] / zs + K[:, 1, 2, None]
    W, H = views.width, views.height
    ok = (z > near_plane) & (u > -slack * W) & (u < (1 + slack) * W) & (v > -slack * H) & (v < (1 + slack) * H)
    return ok.sum(1)


def choose(
    means: Tensor,
    scales: Tensor,
    views: Views,
    world: int,
    cells_per_rank: int = 1,
    channels: int = 3,
    nonzero_fraction: float = 0.7,
    tree: Optional[KdCells] = None,
    margin_px: float = 2.0,
) -> AutoDecision:
    """Estimate both communicators' bytes per step for this scene and batch; pick the cheaper.

    ``means`` [N,3] and ``scales`` [N,3] (linear) of the whole scene (or a representative sample:
    scale ``visible_per_view`` accordingly). Runs on one process; every rank gets the same answer.
    """
    B = views.num_views
    vis = visible_counts(means, views).to(torch.float64).mean().item()
    n_cells = cells_per_rank * world
    tree = tree or KdCells.build(means, n_cells)
    cell = tree.locate(means)
    lo, hi, has = content_bounds(means, gaussian_extent(scales), cell, tree.num_cells)
    total_px = 0.0
    rects = 0
    for v in range(B):
        for c in range(tree.num_cells):
            if not bool(has[c]):
                continue
            r = project_box_rect(lo[c].tolist(), hi[c].tolist(), views.viewmats[v], views.Ks[v], views.width, views.height, margin_px)
            a = _area(r)
            total_px += a
            rects += 1 if a else 0
    px_per_view = total_px / max(B, 1)
    sg = sparse_grad_bytes(vis, B, world, channels, nonzero_fraction)
    px = pixel_bytes(px_per_view, rects / max(B, 1), B, world, channels)
    decision = AutoDecision("pixel" if px < sg else "sparse-grad", px, sg, vis, px_per_view, world, B)
    LOG.info(decision.log_line())
    return decision
