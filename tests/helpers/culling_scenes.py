"""2D Gaussians that sit on the edges of the kernels' per-warp culling (``warp_mask`` in
cuda/common.cuh): footprints from a twentieth of a pixel to tens of pixels, rotated and stretched up
to the anisotropy where culling gives up (det = 1e-3 ac) and beyond, opacities from just above the
1/255 threshold (the culling ellipse shrinks to nothing) to exactly 1, centres inside, on the border
of and outside the tile. CPU tests check the mask's arithmetic on them (tests/raster/test_warp_cull.py); the
GPU tests render them through the kernels against the reference (tests/raster/test_fused_gpu.py)."""

from __future__ import annotations

import math
from typing import Dict, Tuple

import torch

ALPHA_MIN = 1.0 / 255.0


def _draw(n: int, g: torch.Generator) -> Tuple[torch.Tensor, ...]:
    """Opacity and conic (a, b, c) of n Gaussians, float32."""
    u = lambda: torch.rand(n, generator=g, dtype=torch.float64)  # noqa: E731
    sigma1 = torch.exp(math.log(0.05) + (math.log(30.0) - math.log(0.05)) * u())  # px
    # anisotropy: mostly moderate, some up to 1:300
    sigma2 = sigma1 * torch.exp(-math.log(300.0) * u() ** 3)
    theta = math.pi * u()
    cs, sn = torch.cos(theta), torch.sin(theta)
    xx = cs * cs * sigma1**2 + sn * sn * sigma2**2
    yy = sn * sn * sigma1**2 + cs * cs * sigma2**2
    xy = cs * sn * (sigma1**2 - sigma2**2)
    det = xx * yy - xy * xy
    a, b, c = yy / det, -xy / det, xx / det
    kind = torch.randint(0, 4, (n,), generator=g)
    o = torch.where(kind == 0, ALPHA_MIN * (1.0 + 1e-3 * u()),  # the ellipse is all but empty
        torch.where(kind == 1, torch.ones(n, dtype=torch.float64), 0.9 * u() + 0.01))
    o = torch.where(kind == 3, ALPHA_MIN * (1.0 - 1e-4 * u()), o)  # just below: never composited
    return tuple(v.to(torch.float32) for v in (o, a, b, c))


def culling_edge_scene(n: int, x0: int, y0: int, seed: int = 0) -> Tuple[torch.Tensor, ...]:
    """(mx, my, o, a, b, c) float32 [n] around the 16x16 tile whose top-left pixel is (x0, y0):
    centres within 24 px of the tile, some exactly on pixel centres and row boundaries."""
    g = torch.Generator().manual_seed(seed)
    o, a, b, c = _draw(n, g)
    mx = x0 - 24.0 + 64.0 * torch.rand(n, generator=g, dtype=torch.float64)
    my = y0 - 24.0 + 64.0 * torch.rand(n, generator=g, dtype=torch.float64)
    snap = torch.rand(n, generator=g) < 0.25  # on pixel centres / pixel corners
    mx = torch.where(snap, torch.round(mx * 2) / 2, mx)
    my = torch.where(snap, torch.round(my * 2) / 2, my)
    return mx.to(torch.float32), my.to(torch.float32), o, a, b, c


def culling_edge_scene_2d(C: int = 2, W: int = 77, H: int = 53, n: int = 300, seed: int = 0,
                          device="cpu") -> Dict:
    """C views of such Gaussians over a W x H image: means2d [C,n,2], conics [C,n,3], colors
    [C,n,3], opacities [C,n], radii [C,n] int32 (the 3.5-sigma box, past the alpha extent of an
    opaque Gaussian), depths [C,n], width, height."""
    g = torch.Generator().manual_seed(seed)
    views = []
    for _ in range(C):
        o, a, b, c = _draw(n, g)
        det = (a * c - b * b).double()
        sig_max = torch.sqrt(torch.maximum(c.double(), a.double()) / det)  # >= the larger std along x or y
        means = torch.rand(n, 2, generator=g) * torch.tensor([W + 16.0, H + 16.0]) - 8.0
        views.append(dict(
            means2d=means, conics=torch.stack([a, b, c], -1), colors=torch.rand(n, 3, generator=g),
            opacities=o, radii=torch.ceil(3.5 * sig_max).clamp(1, 4096).to(torch.int32),
            depths=1.0 + torch.rand(n, generator=g)))
    out = {k: torch.stack([v[k] for v in views]).to(device) for k in views[0]}
    out.update(width=W, height=H)
    return out


def warp_hits_of_entries(m, c, o, offsets, fids, W, H):
    """[entries] int64: bit w set when a pixel of warp w's 8x4 block (inside the image) composites the entry's
    Gaussian (sigma >= 0 and alpha >= 1/255), in float64."""
    tw, th = math.ceil(W / 16), math.ceil(H / 16)
    counts = (offsets[1:] - offsets[:-1]).long()
    tile = torch.repeat_interleave(torch.arange(counts.numel()), counts)
    x0, y0 = (tile % tw) * 16, ((tile // tw) % th) * 16
    lane = torch.arange(256)
    w = lane // 32
    px = x0[:, None] + (w % 2) * 8 + (lane % 32) % 8
    py = y0[:, None] + (w // 2) * 4 + (lane % 32) // 8
    g = fids.long()
    dx = m[g, 0, None].double() - (px + 0.5)
    dy = m[g, 1, None].double() - (py + 0.5)
    a, b, cc = (c[g, i, None].double() for i in range(3))
    sigma = 0.5 * (a * dx * dx + cc * dy * dy) + b * dx * dy
    alpha = torch.clamp(o[g, None].double() * torch.exp(-sigma), max=0.999)
    hit = (sigma >= 0) & (alpha >= 1.0 / 255.0) & (px < W) & (py < H)
    return (hit.view(-1, 8, 32).any(-1).long() << torch.arange(8)).sum(-1)
