"""The per-warp culling masks of the render kernels, in PyTorch: the twin of ``warp_mask`` in
``cuda/common.cuh`` and of ``cuda/warp_masks.cu``, op for op in float32.

A tile's 8 warps each hold a block of its 16x16 pixels (8x4 in the plain render kernels, 16x2 rows in
the fused one-launch kernel). Bit w of a Gaussian's mask is set when a pixel centre of warp w's block
can be composited, i.e. lies in the ellipse ``sigma <= t = ln(o / (1/255))``; a warp whose bit is clear
skips the Gaussian at every one of its pixels, so culling it changes no image and no gradient. The test
is the ellipse's bounding box and, with ``rows``, then each row of blocks against the ellipse's own
x-extent over that row's band of pixel centres (exact: the right edge ``x(v) = (-b v + sqrt(2at -
det v^2)) / a``, ``v = y - my``, is concave, so its maximum over a band is at the band's point nearest
the rightmost point ``v* = -b sqrt(2t / (c det))``; the left edge mirrors it). Both are widened (t by
1% + 0.02, extents by 0.01 px) far beyond float rounding; nearly degenerate conics (det < 1e-3 ac) and
non-finite values keep every warp, opacities below 1/255 none.

The plain backward reads one byte per tile-list entry computed by ``cuda/warp_masks.cu``
(``FusedOptions.warp_cull_rows``: with the rows test); the forward and the fused kernel compute the box
inline (docs/fused_ssim.md, "Per-warp culling"). With ``FusedOptions.trim_tile_lists`` the entries whose
rows mask is empty leave the tile lists before any pass walks them (:func:`trim_tile_lists_torch`).
"""

from __future__ import annotations

import math
from typing import Union

import torch
from torch import Tensor

TILE, WARPS = 16, 8
F = torch.float32
ALPHA_MIN = torch.tensor(1.0, dtype=F) / torch.tensor(255.0, dtype=F)


def _f(value) -> Tensor:
    return torch.tensor(value, dtype=F)


def block_span(lo: Tensor, hi: Tensor, origin: Union[int, Tensor], size: int, n: int):
    """common.cuh's block_span: the first and last of the n blocks of ``size`` pixels from ``origin`` whose
    pixel centres meet [lo, hi], and whether any does."""
    origin = origin.to(F) if isinstance(origin, Tensor) else _f(origin)
    inv = _f(1.0 / size)  # a power of two: exact
    first = torch.clamp(torch.ceil((lo - origin - _f(size - 0.5)) * inv), -1, n)
    last = torch.clamp(torch.floor((hi - origin - _f(0.5)) * inv), -1, n)
    first = torch.clamp(torch.nan_to_num(first, nan=0.0).long(), min=0)
    last = torch.clamp(torch.nan_to_num(last, nan=n - 1.0).long(), max=n - 1)
    return first, last, first <= last


def span_bits(first: Tensor, last: Tensor) -> Tensor:
    """Bits first..last."""
    return ((2 << last) - 1) & ~((1 << first) - 1)


def warp_mask(mx: Tensor, my: Tensor, o: Tensor, a: Tensor, b: Tensor, c: Tensor, x0: Union[int, Tensor],
              y0: Union[int, Tensor], ww: int = 8, rows: bool = True, margin: bool = True) -> Tensor:
    """common.cuh's warp_mask<WW> on float32 tensors (one Gaussian per entry, in the tile whose top-left pixel
    is (x0, y0)): int64 masks. ``margin=False`` drops the widening (to show what it is for)."""
    cols, wh = TILE // ww, 32 // ww
    n_rows = WARPS // cols
    det = a * c - b * b
    ok = (a > 0) & (c > 0) & (det > _f(1e-3) * a * c) & (o <= _f(1e30)) & (mx.abs() <= _f(1e30)) & (my.abs() <= _f(1e30))
    t = _f(1.01) * torch.log(o / ALPHA_MIN) + _f(0.02) if margin else torch.log(o / ALPHA_MIN)
    pad = _f(0.01) if margin else _f(0.0)
    rx = torch.sqrt(_f(2.0) * t * c / det) + pad
    ry = torch.sqrt(_f(2.0) * t * a / det) + pad
    ok &= (rx < _f(1e30)) & (ry < _f(1e30))
    c0, c1, cany = block_span(mx - rx, mx + rx, x0, ww, cols)
    r0, r1, rany = block_span(my - ry, my + ry, y0, wh, n_rows)
    colbits = span_bits(c0, c1)
    zero = torch.zeros_like(colbits)
    mask = zero.clone()
    two_at, inv_a = _f(2.0) * a * t, _f(1.0) / a
    v_right = -b * torch.sqrt(_f(2.0) * t / (c * det))  # v of the ellipse's rightmost point
    y0f = y0.to(F) if isinstance(y0, Tensor) else None
    for r in range(n_rows):
        kept = (r >= r0) & (r <= r1)
        if not rows:
            mask |= torch.where(kept, colbits << (r * cols), zero)
            continue
        band = ((y0f + _f(r * wh)) if y0f is not None else _f(y0 + r * wh)) - my
        v0 = torch.maximum(band + (_f(0.49) if margin else _f(0.5)), -ry)
        v1 = torch.minimum(band + (_f(wh - 0.49) if margin else _f(wh - 0.5)), ry)
        vr = torch.minimum(torch.maximum(v_right, v0), v1)
        vl = torch.minimum(torch.maximum(-v_right, v0), v1)
        xr = mx + (torch.sqrt(torch.clamp(two_at - det * vr * vr, min=0.0)) - b * vr) * inv_a + pad
        xl = mx - (torch.sqrt(torch.clamp(two_at - det * vl * vl, min=0.0)) + b * vl) * inv_a - pad
        k0, k1, kany = block_span(xl, xr, x0, ww, cols)
        mask |= torch.where(kept & (v0 <= v1) & kany, span_bits(k0, k1) << (r * cols), zero)
    mask = torch.where(cany & rany, mask, zero)
    mask = torch.where(ok, mask, torch.full_like(mask, (1 << WARPS) - 1))
    return torch.where(o < ALPHA_MIN, zero, mask)


def warp_masks_torch(means2d: Tensor, conics: Tensor, opacities: Tensor, offsets: Tensor, flatten_ids: Tensor,
                     C: int, W: int, H: int, rows: bool) -> Tensor:
    """cuda/warp_masks.cu: the 8x4-block mask of every tile-list entry, [entries] uint8. ``means2d`` [C*N,2]
    (or [C,N,2]), ``conics`` [.., 3] and ``opacities`` [..] as the kernels take them; ``flatten_ids`` index
    their flattened rows; ``offsets`` [C*tiles+1] each tile's first entry."""
    m, cn, o = means2d.reshape(-1, 2).float(), conics.reshape(-1, 3).float(), opacities.reshape(-1).float()
    tw = math.ceil(W / TILE)
    counts = (offsets[1:] - offsets[:-1]).long().cpu()
    tile = torch.repeat_interleave(torch.arange(counts.numel()), counts).to(flatten_ids.device)
    g = flatten_ids.long()
    x0 = (tile % tw) * TILE
    y0 = ((tile // tw) % math.ceil(H / TILE)) * TILE
    mask = warp_mask(m[g, 0], m[g, 1], o[g], cn[g, 0], cn[g, 1], cn[g, 2], x0, y0, ww=8, rows=rows)
    return mask.to(torch.uint8)


def compact_tile_lists(offsets: Tensor, flatten_ids: Tensor, masks: Tensor):
    """The tile lists (``offsets``, ``flatten_ids``, one mask byte per entry) without the entries whose mask is
    empty, each list in its order: ``(offsets, flatten_ids, masks)``, the arrays as long as the lists. The
    compaction half of cuda/warp_masks.cu's trim_tile_lists (the tests apply it to the kernel's own masks)."""
    ntot = offsets.numel() - 1
    keep = masks != 0
    counts = (offsets[1:] - offsets[:-1]).long()
    tile = torch.repeat_interleave(torch.arange(ntot, device=flatten_ids.device), counts.to(flatten_ids.device))
    kept = torch.bincount(tile[keep], minlength=ntot)
    new_offsets = torch.zeros(ntot + 1, dtype=offsets.dtype, device=offsets.device)
    new_offsets[1:] = torch.cumsum(kept, 0).to(offsets.device, offsets.dtype)
    return new_offsets, flatten_ids[keep], masks[keep]


def trim_tile_lists_torch(means2d: Tensor, conics: Tensor, opacities: Tensor, offsets: Tensor, flatten_ids: Tensor,
                          C: int, W: int, H: int):
    """cuda/warp_masks.cu's trim_tile_lists: the tile lists without the entries whose rows mask is empty (no 8x4
    block of the tile can composite the Gaussian; dropping them changes no pixel), each list in its order.
    Returns ``(offsets, flatten_ids, masks)`` like the lists given, the arrays exactly as long as the lists
    (the kernel's may run on: only their first ``offsets[-1]`` entries are lists)."""
    flatten_ids = flatten_ids[:int(offsets[-1])]
    masks = warp_masks_torch(means2d, conics, opacities, offsets, flatten_ids, C, W, H, rows=True)
    return compact_tile_lists(offsets, flatten_ids, masks)
