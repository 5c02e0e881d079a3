"""Tile / block binning of projected Gaussians (integer work, no gradients).

gsplat 1.4.0 rule: a Gaussian with radius r > 0 and 2D mean m reaches the tiles
``[floor((m - r)/tile), ceil((m + r)/tile))`` in x and y, clamped to the tile grid. Within a tile
Gaussians are composited front to back by camera depth (ties: lower Gaussian index first).

The reference rasterizer works on *blocks* that subdivide tiles (block_size divides tile_size) and
additionally drops (block, Gaussian) pairs whose block cannot contain a pixel where the Gaussian's
alpha reaches 1/255 (see ``alpha_block_rects``). Those pairs would be skipped per pixel anyway, so
the rendered image is identical to compositing each full tile list; only less work is done.
"""

from __future__ import annotations

import math
from typing import NamedTuple, Optional, Tuple

import torch
from torch import Tensor


class Bins(NamedTuple):
    flatten_ids: Tensor  # [n_isects] int64 index into the flattened [C*N], sorted by (cell, depth)
    counts: Tensor  # [C*grid_h*grid_w] int64 entries per cell
    offsets: Tensor  # [C*grid_h*grid_w] int64 start of each cell's run in flatten_ids
    grid_w: int
    grid_h: int


def tile_grid(width: int, height: int, tile_size: int) -> Tuple[int, int]:
    """(tile_width, tile_height): number of tiles across and down."""
    return math.ceil(width / tile_size), math.ceil(height / tile_size)


@torch.no_grad()
def tile_rects(
    means2d: Tensor, radii: Tensor, tile_size: int, tile_width: int, tile_height: int
) -> Tensor:
    """Tile box of each Gaussian, [C,N,4] int64 ``(x_min, x_max, y_min, y_max)``, max exclusive.

    Gaussians with radius 0 get an empty box.
    """
    r = radii.to(means2d.dtype)
    mx = means2d[..., 0].detach()
    my = means2d[..., 1].detach()
    x0 = torch.floor((mx - r) / tile_size).clamp(0, tile_width)
    x1 = torch.ceil((mx + r) / tile_size).clamp(0, tile_width)
    y0 = torch.floor((my - r) / tile_size).clamp(0, tile_height)
    y1 = torch.ceil((my + r) / tile_size).clamp(0, tile_height)
    rect = torch.stack([x0, x1, y0, y1], dim=-1).to(torch.int64)
    return torch.where((radii > 0)[..., None], rect, torch.zeros_like(rect))


@torch.no_grad()
def alpha_block_rects(
    means2d: Tensor,
    conics: Tensor,
    opacities: Tensor,
    block_size: int,
    rel_margin: float = 1e-3,
    abs_margin: float = 0.05,
) -> Tensor:
    """Blocks that may hold a pixel with ``opacity * exp(-sigma) >= 1/255``, [C,N,4] int64.

    That region is the ellipse ``d^T Q d <= 2 ln(255 o)`` (Q the conic), whose half extents are
    ``sqrt(2 ln(255 o) Q^-1_xx)`` and ``sqrt(2 ln(255 o) Q^-1_yy)``. Pixel centers sit at
    ``(x + 0.5, y + 0.5)``. The box is widened by a small margin so rounding never drops a pixel
    that passes the test; boxes are not clamped to any grid. ``opacities`` is [C,N].
    """
    # float64 where the device has it (the margin below also covers float32 rounding)
    work = torch.float32 if means2d.device.type == "mps" else torch.float64
    m = means2d.detach().to(work)
    q = conics.detach().to(work)
    o = opacities.detach().to(work)
    a, b, c = q.unbind(-1)
    det = a * c - b * b
    ok = (det > 0) & (o * 255.0 > 1.0)
    L = torch.log(torch.where(ok, o * 255.0, torch.full_like(o, 2.0)))
    det = torch.where(ok, det, torch.ones_like(det))
    ex = torch.sqrt(2.0 * L * torch.clamp_min(c, 0) / det) * (1 + rel_margin) + abs_margin
    ey = torch.sqrt(2.0 * L * torch.clamp_min(a, 0) / det) * (1 + rel_margin) + abs_margin
    # pixel column X is inside iff |X + 0.5 - mx| <= ex
    x0 = torch.floor((m[..., 0] - ex - 0.5) / block_size)
    x1 = torch.floor((m[..., 0] + ex - 0.5) / block_size) + 1
    y0 = torch.floor((m[..., 1] - ey - 0.5) / block_size)
    y1 = torch.floor((m[..., 1] + ey - 0.5) / block_size) + 1
    big = 2.0**40
    rect = torch.stack([x0, x1, y0, y1], dim=-1).clamp(-big, big).to(torch.int64)
    return torch.where(ok[..., None], rect, torch.zeros_like(rect))


@torch.no_grad()
def intersect_rects(r1: Tensor, r2: Tensor) -> Tensor:
    """Intersection of two [...,4] (x0,x1,y0,y1) boxes (may come out empty)."""
    return torch.stack(
        [
            torch.maximum(r1[..., 0], r2[..., 0]),
            torch.minimum(r1[..., 1], r2[..., 1]),
            torch.maximum(r1[..., 2], r2[..., 2]),
            torch.minimum(r1[..., 3], r2[..., 3]),
        ],
        dim=-1,
    )


@torch.no_grad()
def bin_rects(rects: Tensor, depths: Tensor, grid_w: int, grid_h: int) -> Bins:
    """Expand per-Gaussian cell boxes [C,N,4] into per-cell lists sorted front to back.

    Cell ids are ``(camera * grid_h + y) * grid_w + x``; boxes are clamped to the grid here.
    """
    C, N = depths.shape
    device = depths.device
    n_cells = C * grid_h * grid_w
    x0 = rects[..., 0].clamp(0, grid_w)
    x1 = rects[..., 1].clamp(0, grid_w)
    y0 = rects[..., 2].clamp(0, grid_h)
    y1 = rects[..., 3].clamp(0, grid_h)
    w = (x1 - x0).clamp_min(0)
    h = (y1 - y0).clamp_min(0)
    # Visit Gaussians in (camera, depth, index) order, so one stable sort by cell finishes the job.
    order = torch.sort(depths.detach(), dim=1, stable=True).indices  # [C,N]
    flat = (order + torch.arange(C, device=device)[:, None] * N).reshape(-1)
    cnt = (w * h).reshape(-1)[flat]
    sel = cnt > 0
    flat = flat[sel]
    cnt = cnt[sel]
    total = int(cnt.sum().item()) if cnt.numel() else 0
    if total == 0:
        empty = torch.zeros(0, dtype=torch.int64, device=device)
        zeros = torch.zeros(n_cells, dtype=torch.int64, device=device)
        return Bins(empty, zeros, zeros.clone(), grid_w, grid_h)
    gid = torch.repeat_interleave(flat, cnt, output_size=total)
    start = torch.cumsum(cnt, 0) - cnt
    local = torch.arange(total, device=device) - torch.repeat_interleave(start, cnt, output_size=total)
    wg = w.reshape(-1)[gid]
    bx = x0.reshape(-1)[gid] + local % wg
    by = y0.reshape(-1)[gid] + torch.div(local, wg, rounding_mode="floor")
    cam = torch.div(gid, N, rounding_mode="floor")
    key = (cam * grid_h + by) * grid_w + bx
    key, perm = torch.sort(key, stable=True)
    flatten_ids = gid[perm]
    counts = torch.bincount(key, minlength=n_cells)
    offsets = torch.cumsum(counts, 0) - counts
    return Bins(flatten_ids, counts, offsets, grid_w, grid_h)


# A tile order's entries pack a tile as tx | ty << 11 | cam << 22 (cuda/common.cuh block_tile reads them
# with shifts); the kernels check that the grid fits.
TILE_ORDER_BITS = 11


def tile_order(offsets: Tensor, policy: str, width: int, height: int, tile_size: int = 16) -> Optional[Tensor]:
    """The order in which the plain rasterizer's blocks take the tiles of ``offsets`` (the [C*tiles+1]
    int32 list starts the kernels take, for images of width x height in tiles of tile_size): None for
    ``"raster"`` (each block its own tile); for ``"longest_first"`` the tiles by list length, longest
    first (ties in any order), each packed as ``tx | ty << 11 | cam << 22`` (int32). Blocks start in
    launch order, so long tiles then run in the first waves instead of possibly the last."""
    if policy == "raster":
        return None
    if policy != "longest_first":
        raise ValueError(f"tile order must be raster or longest_first, got {policy!r}")
    tw, th = tile_grid(width, height, tile_size)
    t = torch.argsort(offsets[1:] - offsets[:-1], descending=True)
    cam, rest = t // (tw * th), t % (tw * th)
    return ((rest % tw) | ((rest // tw) << TILE_ORDER_BITS) | (cam << (2 * TILE_ORDER_BITS))).to(torch.int32)


def unpack_tile_order(order: Tensor, width: int, height: int, tile_size: int = 16) -> Tensor:
    """The tile indices ((cam * th + ty) * tw + tx, int64) of a packed :func:`tile_order`."""
    tw, th = tile_grid(width, height, tile_size)
    v = order.long()
    mask = (1 << TILE_ORDER_BITS) - 1
    tx, ty, cam = v & mask, (v >> TILE_ORDER_BITS) & mask, v >> (2 * TILE_ORDER_BITS)
    return (cam * th + ty) * tw + tx
