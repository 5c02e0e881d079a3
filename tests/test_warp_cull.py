"""The per-warp culling mask of the CUDA kernels (``warp_mask`` in cuda/common.cuh), mirrored op for
op in float32: it must keep every warp that has a pixel where the compositing test passes
(``composite_step``: sigma >= 0 and min(0.999, o exp(-sigma)) >= 1/255), or culling would change
the image; and it must actually cull, or it buys nothing. The GPU tests hold the kernels themselves
against the reference rasterizer (tests/test_fused_gpu.py, including the scene of
``culling_edge_scene`` below)."""

import torch

from tests.culling_scenes import culling_edge_scene

TILE, WARPS = 16, 8
F = torch.float32
ALPHA_MIN = torch.tensor(1.0, dtype=F) / torch.tensor(255.0, dtype=F)


def warp_mask(mx, my, o, a, b, c, x0: int, y0: int) -> torch.Tensor:
    """common.cuh's warp_mask on float32 tensors (one Gaussian per entry)."""
    f = lambda v: torch.tensor(v, dtype=F)  # noqa: E731
    all_warps = (1 << WARPS) - 1
    det = a * c - b * b
    ok = (a > 0) & (c > 0) & (det > f(1e-3) * a * c) & (o <= f(1e30)) & (mx.abs() <= f(1e30)) & (my.abs() <= f(1e30))
    t = f(1.01) * torch.log(o / ALPHA_MIN) + f(0.02)
    rx = torch.sqrt(f(2.0) * t * c / det) + f(0.01)
    ry = torch.sqrt(f(2.0) * t * a / det) + f(0.01)
    ok &= (rx < f(1e30)) & (ry < f(1e30))
    outside_x = (mx + rx < f(x0 + 0.5)) | (mx - rx > f(x0 + TILE - 0.5))
    lo = torch.clamp(torch.ceil((my - ry - f(y0) - f(1.5)) * f(0.5)), -1, WARPS)
    hi = torch.clamp(torch.floor((my + ry - f(y0) - f(0.5)) * f(0.5)), -1, WARPS)
    wlo = torch.clamp(torch.nan_to_num(lo, nan=0.0).long(), min=0)
    whi = torch.clamp(torch.nan_to_num(hi, nan=WARPS - 1.0).long(), max=WARPS - 1)
    span = ((2 << whi) - 1) & ~((1 << wlo) - 1)
    mask = torch.where(whi < wlo, torch.zeros_like(span), span)
    mask = torch.where(outside_x, torch.zeros_like(mask), mask)
    mask = torch.where(ok, mask, torch.full_like(mask, all_warps))
    return torch.where(o < ALPHA_MIN, torch.zeros_like(mask), mask)


def composited(mx, my, o, a, b, c, x0: int, y0: int, dtype=F) -> torch.Tensor:
    """[N, 256] bool: composite_step's test at each pixel of the tile (thread i: column i % 16, row
    i // 16), in ``dtype``."""
    i = torch.arange(TILE * TILE)
    px = (x0 + i % TILE).to(dtype) + 0.5
    py = (y0 + i // TILE).to(dtype) + 0.5
    mx, my, o, a, b, c = (v.to(dtype)[:, None] for v in (mx, my, o, a, b, c))
    dx, dy = mx - px, my - py
    sigma = 0.5 * (a * dx * dx + c * dy * dy) + b * dx * dy
    alpha = torch.clamp(o * torch.exp(-sigma), max=0.999)
    return (sigma >= 0) & (alpha >= ALPHA_MIN.to(dtype))


def _warp_hits(hit: torch.Tensor) -> torch.Tensor:
    """[N, 256] -> [N] int: bit w set if some pixel of warp w (rows 2w, 2w+1) is hit."""
    per_warp = hit.view(-1, WARPS, 32).any(-1).long()
    return (per_warp << torch.arange(WARPS)).sum(-1)


def _check(scene, x0, y0):
    mask = warp_mask(*scene, x0, y0)
    for dtype in (torch.float32, torch.float64):  # float64: what an FMA-contracted sigma tends to
        need = _warp_hits(composited(*scene, x0, y0, dtype))
        missing = need & ~mask
        assert int((missing != 0).sum()) == 0, f"culled a warp the pixel test composites ({dtype})"
    return mask


def test_mask_keeps_every_warp_the_pixel_test_composites():
    for seed in range(4):
        for x0, y0 in ((0, 0), (1904, 1072), (512, 96)):
            scene = culling_edge_scene(20000, x0, y0, seed=seed)
            mask = _check(scene, x0, y0)
            # ...and it culls: most of these Gaussians are small against the tile
            culled = WARPS - sum(((mask >> w) & 1) for w in range(WARPS)).float().mean()
            assert culled > 2.0


def test_mask_of_simple_gaussians():
    f = lambda *v: [torch.tensor([x], dtype=F) for x in v]  # noqa: E731
    # a round Gaussian of 1 px standard deviation, opaque, at pixel (5, 0): rows 0..3 -> warps 0, 1
    g = f(5.5, 0.5, 1.0, 1.0, 0.0, 1.0)
    assert int(warp_mask(*g, 0, 0)) == 0b11
    # the same Gaussian one tile to the right: no column of the tile is reached
    assert int(warp_mask(*g, 16, 0)) == 0
    # ... and at the bottom rows of the tile above: its last warp
    assert int(warp_mask(*f(5.5, 16.5, 1.0, 1.0, 0.0, 1.0), 0, 0)) == 0b1000_0000 | 0b0100_0000
    # too faint to composite anywhere
    assert int(warp_mask(*f(5.5, 0.5, 0.003, 1.0, 0.0, 1.0), 0, 0)) == 0
    # degenerate, non-finite: every warp
    assert int(warp_mask(*f(5.5, 0.5, 1.0, 1.0, 1.0, 1.0), 0, 0)) == 255
    assert int(warp_mask(*f(5.5, 0.5, float("nan"), 1.0, 0.0, 1.0), 0, 0)) == 255
    assert int(warp_mask(*f(float("nan"), 0.5, 1.0, 1.0, 0.0, 1.0), 0, 0)) == 255
