"""The ``auto`` strategy: pick ``sparse-grad`` or ``pixel`` per scene from a model of the step's time:
the bytes each exchange moves over the link measured at start-up (``link_probe``), plus the work
each exchange does besides the transfer.

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
favour ``sparse-grad``. Bytes alone mislead on a fast link: on NVLink the pixel exchange moves
10-60x fewer bytes and is still slower (its cells are rendered and composited as partial images).
So each exchange's time per step is modelled as::

    t = link.seconds(bytes / R, rounds) + per_pixel_view * B * W * H + per_gaussian_view * B * visible

with the link from a start-up probe (or ``--pipeline.link-bandwidth-gbps``) and the two work terms
per exchange (``ComputeCosts``: fitted to the ``distributed-counts`` suite, two H200 on NVLink, 4
views of 1080p, 1M-140M Gaussians; provisional until the slow-link runs refit them). ``choose``
returns the faster one and a log line with both times, the bytes and the link. Transmittance
pruning is not credited (it depends on the trained opacities); the estimate for ``pixel`` is
therefore an upper bound.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Optional

import torch
from torch import Tensor

from bytesplat_ns.distributed.cells import KdCells, content_bounds, gaussian_extent
from bytesplat_ns.distributed.communicators import dense_grad_record_bytes, forward_record_bytes, sparse_grad_record_bytes
from bytesplat_ns.distributed.link_probe import LinkEstimate
from bytesplat_ns.distributed.pixel import RECT_BYTES, _area, project_box_rect
from bytesplat_ns.distributed.step import Views


LOG = logging.getLogger("bytesplat.auto")


EXCHANGE_ROUNDS = 4  # per step and exchange: forward and backward messages, each after a size exchange


@dataclass(frozen=True)
class ComputeCosts:
    """Seconds per step that an exchange spends besides the transfer: per pixel of every view and
    per Gaussian visible in a view. Fitted to the ``distributed-counts`` suite (2x H200, NVLink,
    4 views of 1920x1080, 1M to 140M Gaussians; link time at 350 GB/s taken out)."""

    sparse_grad_per_pixel_view: float = 3.0e-9
    sparse_grad_per_gaussian_view: float = 0.94e-9
    pixel_per_pixel_view: float = 5.3e-9
    pixel_per_gaussian_view: float = 1.40e-9

    def work_s(self, exchange: str, pixel_views: float, gaussian_views: float) -> float:
        if exchange == "pixel":
            return self.pixel_per_pixel_view * pixel_views + self.pixel_per_gaussian_view * gaussian_views
        return self.sparse_grad_per_pixel_view * pixel_views + self.sparse_grad_per_gaussian_view * gaussian_views


@dataclass
class AutoDecision:
    choice: str  # "pixel" or "sparse-grad"
    pixel_bytes: float
    sparse_grad_bytes: float
    visible_per_view: float
    cell_pixels_per_view: float
    world: int
    num_views: int
    link: Optional[LinkEstimate] = None
    pixel_time_s: Optional[float] = None  # modelled (None: decided on bytes alone, no link given)
    sparse_grad_time_s: Optional[float] = None
    pixel_transfer_s: Optional[float] = None
    sparse_grad_transfer_s: Optional[float] = None

    def log_line(self) -> str:
        mib = 1024.0 * 1024.0
        other = "sparse-grad" if self.choice == "pixel" else "pixel"
        quantities = (f"on {self.world} ranks, {self.num_views} views/step: {self.visible_per_view:.0f} Gaussians visible per view "
                      f"(records: {self.sparse_grad_bytes / mib:.3f} MiB/step) vs {self.cell_pixels_per_view:.0f} cell pixels per view "
                      f"(partial images: {self.pixel_bytes / mib:.3f} MiB/step)")
        if self.link is None:
            mine, theirs = (self.pixel_bytes, self.sparse_grad_bytes) if self.choice == "pixel" else (self.sparse_grad_bytes, self.pixel_bytes)
            return (f"auto communicator: {self.choice} (est. {mine / mib:.3f} MiB/step) over {other} "
                    f"(est. {theirs / mib:.3f} MiB/step) {quantities}")
        times = {"pixel": (self.pixel_time_s, self.pixel_transfer_s),
                 "sparse-grad": (self.sparse_grad_time_s, self.sparse_grad_transfer_s)}

        def said(name):
            total, transfer = times[name]
            return f"modelled {total * 1e3:.1f} ms/step: {transfer * 1e3:.1f} ms transfer + {(total - transfer) * 1e3:.1f} ms work"

        return (f"auto communicator: {self.choice} ({said(self.choice)}) over {other} ({said(other)}) "
                f"with the link at {self.link.describe()}, {quantities}")


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
    link: Optional[LinkEstimate] = None,
    costs: ComputeCosts = ComputeCosts(),
) -> AutoDecision:
    """Estimate both communicators' bytes per step for this scene and batch and, on ``link``, their
    modelled time; pick the faster (with no link: the one moving fewer bytes).

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
    if link is not None:
        pixel_views, gaussian_views = float(B * views.width * views.height), B * vis
        decision.pixel_transfer_s = link.seconds(px / world, EXCHANGE_ROUNDS)
        decision.sparse_grad_transfer_s = link.seconds(sg / world, EXCHANGE_ROUNDS)
        decision.pixel_time_s = decision.pixel_transfer_s + costs.work_s("pixel", pixel_views, gaussian_views)
        decision.sparse_grad_time_s = decision.sparse_grad_transfer_s + costs.work_s("sparse-grad", pixel_views, gaussian_views)
        decision.link = link
        decision.choice = "pixel" if decision.pixel_time_s < decision.sparse_grad_time_s else "sparse-grad"
    LOG.info(decision.log_line())
    return decision
