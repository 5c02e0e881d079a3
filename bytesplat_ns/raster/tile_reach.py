"""Opacity-aware tile reach: bin a Gaussian only into the tiles where it can be composited.

The projection's radius is three standard deviations along the 2D covariance's major axis, the
same in x and y: a square box. The kernels composite a Gaussian at a pixel only where
``o * exp(-sigma) >= 1/255`` (``cuda/common.cuh``), i.e. inside the ellipse ``sigma <= ln(255 o)``,
whose bounding box has the half-extents ``sqrt(2 t c / det)`` along x and ``sqrt(2 t a / det)``
along y (conic ``[a b; b c]``, ``det = ac - b^2``, ``t = ln(255 o)``). A faint or elongated Gaussian's
box is much smaller than the square, so binning into the smaller box (per axis, never beyond the
square) gives shorter tile lists and a shorter sort. Exact: a tile outside the box holds no pixel
the Gaussian would be composited at, so every render and gradient is the same (the per-warp cull
in the kernels already skips such pairs; this skips them before the sort). The box is widened as
the kernels' per-warp cull widens it (``t`` by 1% + 0.02, the half-extents by 0.01 px), far beyond
float rounding; nearly degenerate or non-finite conics keep the square.

On by default; ``--pipeline.model.fused.opacity-aware-tiles False`` (``FusedOptions.opacity_aware_tiles``)
bins into the square boxes instead.
"""

from __future__ import annotations

import torch
from torch import Tensor

ALPHA_MIN = 1.0 / 255.0  # the compositing threshold of the kernels and their twins


@torch.no_grad()
def opacity_aware_radii(radii: Tensor, conics: Tensor, opacities: Tensor) -> Tensor:
    """Per-axis tile radii [C,N,2] int32 (x, y) for ``fused.bin_tiles``: each the smaller of the
    projection's ``radii`` [C,N] and the ceiling of the opacity ellipse's half-extent along that
    axis; 0 (not binned) where the radius is 0 or the opacity is below 1/255 (never composited).
    ``conics`` [C,N,3], ``opacities`` [C,N] (post-activation), as ``fused.project`` returns them."""
    a, b, c = (conics[..., i].detach().float() for i in range(3))
    o = opacities.detach().float()
    det = a * c - b * b
    # below 1/255 nothing is ever composited; a NaN opacity is not faint (the kernels keep it)
    faint = o < ALPHA_MIN
    t = 1.01 * torch.log(torch.where(faint, torch.ones_like(o), o) / ALPHA_MIN) + 0.02
    # c / det, not 1 / (a - b^2 / c): the kernels' form, finite wherever the conic is well formed
    half_x = torch.sqrt(2.0 * t * c / det) + 0.01
    half_y = torch.sqrt(2.0 * t * a / det) + 0.01
    well_formed = ((a > 0) & (c > 0) & (det > 1e-3 * a * c) & (o <= 1e30)
                   & torch.isfinite(half_x) & torch.isfinite(half_y) & (half_x < 1e9) & (half_y < 1e9))
    square = radii.to(torch.int64)
    per_axis = torch.stack([torch.ceil(half_x), torch.ceil(half_y)], -1).nan_to_num(0.0).clamp(0, 1e9).long()
    reach = torch.where(well_formed[..., None], torch.minimum(per_axis, square[..., None]), square[..., None])
    reach = torch.where((~faint & (square > 0))[..., None], reach, torch.zeros_like(reach))
    return reach.to(torch.int32)
