"""Random Gaussian scenes seen by random cameras, in float64: the inputs of the rasterizer tests
(the reference against the dense oracle, the backends against each other, pruning's scores)."""

from __future__ import annotations

import math

import torch


def _look_at(campos: torch.Tensor, target: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """World-to-camera matrix (OpenCV: +z forward) of a camera at ``campos`` facing ``target``."""
    z = target - campos
    z = z / z.norm()
    x = torch.linalg.cross(z, up)
    x = x / x.norm()
    y = torch.linalg.cross(z, x)
    c2w = torch.eye(4, dtype=torch.float64)
    c2w[:3, 0], c2w[:3, 1], c2w[:3, 2], c2w[:3, 3] = x, y, z, campos
    return torch.linalg.inv(c2w)


def make_scene(seed, N=80, W=37, H=23, C=1, sh_degree=None, n_sh=16, scale_range=(0.04, 0.4),
               opacity_range=(0.05, 0.98), cam_dist=4.0, focal=0.9):
    """Random Gaussians around the origin seen by C cameras about ``cam_dist`` away."""
    g = torch.Generator().manual_seed(seed)

    def rnd(*shape):
        return torch.rand(*shape, generator=g, dtype=torch.float64)

    def rndn(*shape):
        return torch.randn(*shape, generator=g, dtype=torch.float64)

    means = rndn(N, 3) * torch.tensor([1.0, 0.8, 0.8], dtype=torch.float64)
    quats = rndn(N, 4)
    lo, hi = math.log(scale_range[0]), math.log(scale_range[1])
    scales = torch.exp(lo + (hi - lo) * rnd(N, 3))
    opacities = opacity_range[0] + (opacity_range[1] - opacity_range[0]) * rnd(N)
    if sh_degree is None:
        colors = rnd(N, 3)
    else:
        colors = 0.4 * rndn(N, n_sh, 3)
    viewmats, Ks = [], []
    for _ in range(C):
        d = rndn(3)
        d = d / d.norm()
        campos = cam_dist * d * (1.0 + 0.2 * float(rnd(1)))
        viewmats.append(_look_at(campos, 0.3 * rndn(3), rndn(3)))
        f = focal * W * (0.9 + 0.2 * float(rnd(1)))
        cx = W / 2 + (float(rnd(1)) - 0.5) * 0.2 * W
        cy = H / 2 + (float(rnd(1)) - 0.5) * 0.2 * H
        Ks.append(torch.tensor([[f, 0, cx], [0, f * (0.95 + 0.1 * float(rnd(1))), cy], [0, 0, 1]],
                               dtype=torch.float64))
    return dict(means=means, quats=quats, scales=scales, opacities=opacities, colors=colors,
                viewmats=torch.stack(viewmats), Ks=torch.stack(Ks), W=W, H=H,
                sh_degree=sh_degree, gen=g)
