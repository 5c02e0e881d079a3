"""2D scenes for the pruning score (``info["contribution"]``) tests, CPU and GPU.

:func:`stop_scene_2d` builds projected Gaussians directly (means2d, conics, opacities, radii,
depths, colors) so that the score's stop rule decides some maxima: at a few spots per view a
"wall" of three wide, opaque Gaussians leaves T ~ 3e-4 in front of a small opaque Gaussian, which
therefore stops the pixels at its center (T would drop to ~3e-5) and is composited only at its rim,
where its weight is lower. Its score (the largest alpha*T) is the weight it would have had at a
stopped pixel, about twice what the composited pixels give it. Random clutter behind the spots
(some of it hidden entirely: score 0) fills the tiles; ``crowd`` more Gaussians around one spot
make its tiles long enough for the kernels' streaming path with a small capacity.
"""

from __future__ import annotations

import math
from typing import Dict

import torch

WALL_OPACITY = 0.933  # three of them: T = (1 - 0.933)^3 = 3.0e-4 at the wall's center
WALL_SIGMA = 10.0  # px
BACK_OPACITY = 0.9
BACK_SIGMA = 0.6  # px: a pixel off its center it gets alpha ~0.2 (composited, lower weight)
SPOT_X = (18.0, 56.0, 94.0)  # 38 px apart: the walls never reach another spot's center


def _conic(sx, sy, theta):
    """Conic (a, b, c) = inverse of the covariance R diag(sx^2, sy^2) R^T, and its 3-sigma radius."""
    c, s = math.cos(theta), math.sin(theta)
    xx = c * c * sx * sx + s * s * sy * sy
    yy = s * s * sx * sx + c * c * sy * sy
    xy = c * s * (sx * sx - sy * sy)
    det = xx * yy - xy * xy
    return (yy / det, -xy / det, xx / det), math.ceil(3.0 * max(sx, sy))


def stop_scene_2d(C: int = 2, W: int = 112, H: int = 64, clutter: int = 300, crowd: int = 0, seed: int = 0,
                  device="cpu") -> Dict:
    """C views of 2D Gaussians (see the module docstring). Returns means2d [C,N,2], conics [C,N,3],
    colors [C,N,3], opacities [C,N], radii [C,N] int32, depths [C,N], width, height and
    ``back`` [C, spots] (the indices of the small Gaussians behind the walls)."""
    g = torch.Generator().manual_seed(seed)
    views = []
    backs = []
    for _ in range(C):
        gs = []  # (x, y, (a, b, c), radius, opacity, depth)
        spots = [(x + 4 * float(torch.rand(1, generator=g)), 20 + 24 * float(torch.rand(1, generator=g)))
                 for x in SPOT_X]
        back = []
        for x, y in spots:
            cx, cy = math.floor(x) + 0.5, math.floor(y) + 0.5  # on a pixel center
            for i in range(3):
                conic, r = _conic(WALL_SIGMA, WALL_SIGMA * 0.9, 0.3 * i)
                gs.append((cx + 0.3 * i, cy - 0.2 * i, conic, r, WALL_OPACITY, 1.0 + 0.01 * i))
            conic, r = _conic(BACK_SIGMA, BACK_SIGMA * 0.8, 0.7)
            back.append(len(gs))
            gs.append((cx + 0.15, cy - 0.1, conic, r, BACK_OPACITY, 2.0))
        for i in range(clutter + crowd):
            if i < clutter:
                x, y = W * float(torch.rand(1, generator=g)), H * float(torch.rand(1, generator=g))
                sx, sy = 1.0 + 3.0 * float(torch.rand(1, generator=g)), 1.0 + 3.0 * float(torch.rand(1, generator=g))
            else:  # crowd the first spot's tiles
                x = spots[0][0] + 6.0 * float(torch.randn(1, generator=g))
                y = spots[0][1] + 6.0 * float(torch.randn(1, generator=g))
                sx, sy = 1.0 + float(torch.rand(1, generator=g)), 1.0 + float(torch.rand(1, generator=g))
            conic, r = _conic(sx, sy, math.pi * float(torch.rand(1, generator=g)))
            o = 0.05 + 0.9 * float(torch.rand(1, generator=g))
            gs.append((x, y, conic, r, o, 2.5 + 2.5 * float(torch.rand(1, generator=g))))
        views.append(gs)
        backs.append(back)
    N = len(views[0])
    means2d = torch.tensor([[(x, y) for x, y, *_ in gs] for gs in views], dtype=torch.float32)
    conics = torch.tensor([[c for _, _, c, *_ in gs] for gs in views], dtype=torch.float32)
    radii = torch.tensor([[r for *_, r, _, _ in gs] for gs in views], dtype=torch.int32)
    opacities = torch.tensor([[o for *_, o, _ in gs] for gs in views], dtype=torch.float32)
    depths = torch.tensor([[d for *_, d in gs] for gs in views], dtype=torch.float32)
    colors = torch.rand(C, N, 3, generator=g)
    out = dict(means2d=means2d, conics=conics, colors=colors, opacities=opacities, radii=radii, depths=depths,
               back=torch.tensor(backs))
    out = {k: v.to(device) for k, v in out.items()}
    out.update(width=W, height=H)
    return out
