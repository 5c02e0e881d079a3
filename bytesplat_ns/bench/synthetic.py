"""The benchmarks' random scene: N Gaussians in one pinhole camera's frustum with a blurred-noise
target image, deterministic in its seed on any device (``synthetic_scene``)."""

from __future__ import annotations

import os
from typing import Dict

import torch


# Gaussians are drawn in blocks of this many, each block from its own CPU generator, so that large
# counts (100M+) are drawn by all cores at once; a scene of at most one block is the same as before.
SCENE_BLOCK = 1 << 22


def _draw_gaussians(out: Dict[str, torch.Tensor], lo: int, hi: int, width: int, height: int, g: torch.Generator) -> None:
    """Rows lo:hi of ``out`` from generator ``g`` (the draw order fixes the scene for a seed)."""
    n, f = hi - lo, 0.9 * width
    z = 2.0 + 18.0 * torch.rand(n, generator=g)
    u = torch.rand(n, generator=g) * width * 1.1 - 0.05 * width
    v = torch.rand(n, generator=g) * height * 1.1 - 0.05 * height
    out["means"][lo:hi] = torch.stack([(u - width / 2) / f * z, (v - height / 2) / f * z, z], -1)
    # ~1.5 px median projected sigma at any depth, spread x/÷ 1.6
    out["scales"][lo:hi] = (z[:, None] * 1.5 / f) * torch.exp(torch.randn(n, 3, generator=g) * 0.5)
    out["quats"][lo:hi] = torch.randn(n, 4, generator=g)
    out["opacities"][lo:hi] = torch.sigmoid(torch.randn(n, generator=g))
    sh = out["colors"][lo:hi]
    sh.copy_(torch.randn(sh.shape, generator=g) * 0.1)
    sh[:, 0, :] = torch.rand(n, 3, generator=g) * 1.5 - 0.75


def synthetic_scene(n: int, width: int, height: int, sh_degree: int = 3, seed: int = 0, device: str = "cuda"):
    """N random Gaussians filling one pinhole camera's frustum (depth 2..20, uniform on screen),
    log-normal world scales giving a few pixels of footprint, SH degree ``sh_degree`` colors.
    Deterministic in ``seed`` whatever the device (drawn on the CPU, in ``SCENE_BLOCK`` blocks: the
    first from ``seed``'s generator, block i from its own, in parallel threads)."""
    from concurrent.futures import ThreadPoolExecutor

    g = torch.Generator(device="cpu").manual_seed(seed)
    f = 0.9 * width
    k = (sh_degree + 1) ** 2
    out = {"means": torch.empty(n, 3), "scales": torch.empty(n, 3), "quats": torch.empty(n, 4),
           "opacities": torch.empty(n), "colors": torch.empty(n, k, 3)}
    _draw_gaussians(out, 0, min(n, SCENE_BLOCK), width, height, g)
    blocks = [(lo, min(n, lo + SCENE_BLOCK)) for lo in range(SCENE_BLOCK, n, SCENE_BLOCK)]

    def draw(i_block):
        i, (lo, hi) = i_block
        _draw_gaussians(out, lo, hi, width, height, torch.Generator().manual_seed(seed * 1_000_003 + 7919 * (i + 1)))

    if blocks:  # torch's CPU kernels release the GIL, so the threads draw side by side; every core,
        # since torchrun's one intra-op thread per rank would leave them idle during the draw
        with ThreadPoolExecutor(max_workers=max(1, min(len(blocks), os.cpu_count() or 1))) as pool:
            list(pool.map(draw, enumerate(blocks)))
    viewmats = torch.eye(4)[None]
    Ks = torch.tensor([[f, 0, width / 2], [0, f, height / 2], [0, 0, 1.0]])[None]
    gt = torch.rand(1, height, width, 3, generator=g)
    gt = torch.nn.functional.avg_pool2d(gt.permute(0, 3, 1, 2), 5, 1, 2).permute(0, 2, 3, 1).contiguous()
    to = lambda t: t.to(device)  # noqa: E731
    out["scales"].log_().exp_()  # the rounding of the scenes measured before the blocks came in
    return dict(means=to(out["means"]), quats=to(out["quats"]), scales=to(out["scales"]), opacities=to(out["opacities"]),
                colors=to(out["colors"]), viewmats=to(viewmats), Ks=to(Ks), gt=to(gt),
                backgrounds=torch.zeros(1, 3, device=device), width=width, height=height, sh_degree=sh_degree)
