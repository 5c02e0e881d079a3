"""The per-warp culling mask of the CUDA kernels (``warp_mask`` in cuda/common.cuh), mirrored op for
op in float32 for both warp layouts (``thread_pixel``: 16x2 pixel rows, the fused one-launch kernel's;
8x4 blocks, the plain render kernels'): it must keep every warp that has a pixel where the
compositing test passes (``composite_step``: sigma >= 0 and min(0.999, o exp(-sigma)) >= 1/255), or
culling would change the image; and it must actually cull, or it buys nothing. The GPU tests hold
the kernels themselves with culling against the kernels without it (tests/raster/test_fused_gpu.py)."""

import pytest
import torch

from tests.helpers.culling_scenes import culling_edge_scene

TILE, WARPS = 16, 8
F = torch.float32
ALPHA_MIN = torch.tensor(1.0, dtype=F) / torch.tensor(255.0, dtype=F)
LAYOUTS = (16, 8)  # warp width WW: 16x2 or 8x4 pixels per warp


def thread_pixel(ww: int):
    """common.cuh's thread_pixel for one tile at (0, 0): (x, y) of threads 0..255."""
    i = torch.arange(TILE * TILE)
    lane, w = i % 32, i // 32
    cols = TILE // ww
    return (w % cols) * ww + lane % ww, (w // cols) * (32 // ww) + lane // ww


def _block_span(lo, hi, origin: int, size: int, n: int):
    """common.cuh's block_span on tensors: (first, last, any)."""
    f = lambda v: torch.tensor(v, dtype=F)  # noqa: E731
    inv = f(1.0 / size)
    first = torch.clamp(torch.ceil((lo - f(origin) - f(size - 0.5)) * inv), -1, n)
    last = torch.clamp(torch.floor((hi - f(origin) - f(0.5)) * inv), -1, n)
    first = torch.clamp(torch.nan_to_num(first, nan=0.0).long(), min=0)
    last = torch.clamp(torch.nan_to_num(last, nan=n - 1.0).long(), max=n - 1)
    return first, last, first <= last


def warp_mask(mx, my, o, a, b, c, x0: int, y0: int, ww: int = 16, margin: bool = True) -> torch.Tensor:
    """common.cuh's warp_mask<WW> on float32 tensors (one Gaussian per entry); ``margin=False``
    drops its widening (t by 1% + 0.02, radii by 0.01 px), to show what the widening is for."""
    f = lambda v: torch.tensor(v, dtype=F)  # noqa: E731
    cols, wh = TILE // ww, 32 // ww
    rows = WARPS // cols
    all_warps = (1 << WARPS) - 1
    det = a * c - b * b
    ok = (a > 0) & (c > 0) & (det > f(1e-3) * a * c) & (o <= f(1e30)) & (mx.abs() <= f(1e30)) & (my.abs() <= f(1e30))
    t = f(1.01) * torch.log(o / ALPHA_MIN) + f(0.02) if margin else torch.log(o / ALPHA_MIN)
    pad = f(0.01) if margin else f(0.0)
    rx = torch.sqrt(f(2.0) * t * c / det) + pad
    ry = torch.sqrt(f(2.0) * t * a / det) + pad
    ok &= (rx < f(1e30)) & (ry < f(1e30))
    c0, c1, cany = _block_span(mx - rx, mx + rx, x0, ww, cols)
    r0, r1, rany = _block_span(my - ry, my + ry, y0, wh, rows)
    colbits = ((2 << c1) - 1) & ~((1 << c0) - 1)
    mask = torch.zeros_like(colbits)
    for r in range(rows):
        mask |= torch.where((r >= r0) & (r <= r1), colbits << (r * cols), torch.zeros_like(colbits))
    mask = torch.where(cany & rany, mask, torch.zeros_like(mask))
    mask = torch.where(ok, mask, torch.full_like(mask, all_warps))
    return torch.where(o < ALPHA_MIN, torch.zeros_like(mask), mask)


def composited(mx, my, o, a, b, c, x0: int, y0: int, ww: int = 16, dtype=F) -> torch.Tensor:
    """[N, 256] bool: composite_step's test at each thread's pixel (thread_pixel), in ``dtype``."""
    tx, ty = thread_pixel(ww)
    px = (x0 + tx).to(dtype) + 0.5
    py = (y0 + ty).to(dtype) + 0.5
    mx, my, o, a, b, c = (v.to(dtype)[:, None] for v in (mx, my, o, a, b, c))
    dx, dy = mx - px, my - py
    sigma = 0.5 * (a * dx * dx + c * dy * dy) + b * dx * dy
    alpha = torch.clamp(o * torch.exp(-sigma), max=0.999)
    return (sigma >= 0) & (alpha >= ALPHA_MIN.to(dtype))


def _warp_hits(hit: torch.Tensor) -> torch.Tensor:
    """[N, 256] over threads -> [N] int: bit w set if some thread of warp w is hit."""
    per_warp = hit.view(-1, WARPS, 32).any(-1).long()
    return (per_warp << torch.arange(WARPS)).sum(-1)


def _kept_warps(mask: torch.Tensor) -> torch.Tensor:
    return sum(((mask >> w) & 1) for w in range(WARPS)).float()


def test_thread_pixel_layouts_cover_the_tile_once():
    for ww in LAYOUTS:
        x, y = thread_pixel(ww)
        assert sorted((y * TILE + x).tolist()) == list(range(TILE * TILE))
    x, y = thread_pixel(16)  # the row-major layout the SSIM code shares
    i = torch.arange(TILE * TILE)
    assert torch.equal(x, i % TILE) and torch.equal(y, i // TILE)


@pytest.mark.parametrize("ww", LAYOUTS)
def test_mask_keeps_every_warp_the_pixel_test_composites(ww):
    for seed in range(4):
        for x0, y0 in ((0, 0), (1904, 1072), (512, 96)):
            scene = culling_edge_scene(20000, x0, y0, seed=seed)
            mask = warp_mask(*scene, x0, y0, ww)
            for dtype in (torch.float32, torch.float64):  # float64: what an FMA-contracted sigma tends to
                need = _warp_hits(composited(*scene, x0, y0, ww, dtype))
                missing = need & ~mask
                assert int((missing != 0).sum()) == 0, f"culled a warp the pixel test composites ({dtype}, {ww})"
            # ...and it culls: most of these Gaussians are small against the tile
            assert WARPS - _kept_warps(mask).mean() > 2.0


@pytest.mark.parametrize("ww", LAYOUTS)
def test_margin_keeps_gaussians_that_graze_a_warps_last_pixel(ww):
    """Gaussians whose alpha = 1/255 ellipse ends exactly on a pixel centre in the last row of a
    warp, the mean in the next warp's rows: that pixel alone decides whether the upper warp sees the
    Gaussian, and float rounding decides both its alpha test and the unwidened box's edge. The
    widened mask keeps every such warp the pixel test composites; the unwidened one misses some
    (so the scene does graze, and the widening is what keeps culling exact)."""
    g = torch.Generator().manual_seed(5)
    n = 4000
    wh = 32 // ww
    o = (0.02 + 0.98 * torch.rand(n, generator=g, dtype=torch.float64)).to(F)
    sx = torch.exp(torch.log(torch.tensor(0.3)) + 3.0 * torch.rand(n, generator=g)).to(F)  # 0.3..6 px
    sy = torch.exp(torch.log(torch.tensor(0.3)) + 3.0 * torch.rand(n, generator=g)).to(F)
    a, c, b = 1.0 / sx.double() ** 2, 1.0 / sy.double() ** 2, torch.zeros(n, dtype=torch.float64)
    a, c = a.to(F), c.to(F)
    t = torch.log(o.double() * 255.0)
    ry = torch.sqrt(2.0 * t / c.double())  # the exact extent along y (b = 0)
    row = wh * torch.randint(0, WARPS // (TILE // ww) - 1, (n,), generator=g) + wh - 1  # a warp's last row
    col = torch.randint(0, TILE, (n,), generator=g)
    mx = (col.double() + 0.5).to(F)
    my = (row.double() + 0.5 + ry).to(F)  # that pixel centre on the ellipse's upper edge
    scene = (mx, my, o, a, b.to(F), c)
    need = _warp_hits(composited(*scene, 0, 0, ww))
    assert int((need & ~warp_mask(*scene, 0, 0, ww)).ne(0).sum()) == 0
    assert int((need & ~warp_mask(*scene, 0, 0, ww, margin=False)).ne(0).sum()) > 0


def test_compact_blocks_keep_fewer_warps_for_small_gaussians():
    """The reason for 8x4 blocks: a Gaussian of a few pixels in the middle of a tile reaches fewer
    of them than of 16x2 rows."""
    g = torch.Generator().manual_seed(3)
    n = 4000
    mx, my = 16 * torch.rand(n, generator=g), 16 * torch.rand(n, generator=g)
    one = torch.ones(n)
    scene = (mx, my, 0.5 * one, one, 0 * one, one)  # round, sigma 1 px: reaches about 3 px
    rows16 = _kept_warps(warp_mask(*scene, 0, 0, 16)).mean()
    blocks8 = _kept_warps(warp_mask(*scene, 0, 0, 8)).mean()
    assert blocks8 < 0.85 * rows16, (float(blocks8), float(rows16))


def test_mask_of_simple_gaussians():
    f = lambda *v: [torch.tensor([x], dtype=F) for x in v]  # noqa: E731
    # a round Gaussian of 1 px standard deviation, opaque, at pixel (5, 0): rows 0..3 -> warps 0, 1
    g = f(5.5, 0.5, 1.0, 1.0, 0.0, 1.0)
    assert int(warp_mask(*g, 0, 0)) == 0b11
    # 8x4 blocks: columns 1..9 (blocks 0 and 1), rows 0..3 (block row 0) -> warps 0, 1
    assert int(warp_mask(*g, 0, 0, 8)) == 0b11
    # at pixel (2, 6): columns 0..5 (block 0), rows 3..9 (block rows 0..2) -> warps 0, 2, 4
    assert int(warp_mask(*f(2.5, 6.5, 1.0, 1.0, 0.0, 1.0), 0, 0, 8)) == 0b1_0101
    # the same Gaussian one tile to the right: no column of the tile is reached
    assert int(warp_mask(*g, 16, 0)) == 0 and int(warp_mask(*g, 16, 0, 8)) == 0
    # ... and at the bottom rows of the tile above: its last warp(s)
    assert int(warp_mask(*f(5.5, 16.5, 1.0, 1.0, 0.0, 1.0), 0, 0)) == 0b1000_0000 | 0b0100_0000
    assert int(warp_mask(*f(5.5, 16.5, 1.0, 1.0, 0.0, 1.0), 0, 0, 8)) == 0b1100_0000
    # too faint to composite anywhere
    assert int(warp_mask(*f(5.5, 0.5, 0.003, 1.0, 0.0, 1.0), 0, 0)) == 0
    # degenerate, non-finite: every warp
    for ww in LAYOUTS:
        assert int(warp_mask(*f(5.5, 0.5, 1.0, 1.0, 1.0, 1.0), 0, 0, ww)) == 255
        assert int(warp_mask(*f(5.5, 0.5, float("nan"), 1.0, 0.0, 1.0), 0, 0, ww)) == 255
        assert int(warp_mask(*f(float("nan"), 0.5, 1.0, 1.0, 0.0, 1.0), 0, 0, ww)) == 255
