"""The per-warp culling mask of the CUDA kernels (``warp_mask`` in cuda/common.cuh), through its twin
(bytesplat_ns/raster/warp_masks.py, op for op in float32), for both warp layouts (``thread_pixel``: 16x2
pixel rows, the fused one-launch kernel's; 8x4 blocks, the plain render kernels'), with the box test and
with the rows test: it must keep every warp that has a pixel where the compositing test passes (``composite_step``: sigma >= 0 and min(0.999, o exp(-sigma)) >= 1/255), or
culling would change the image; and it must actually cull, or it buys nothing. The GPU tests hold
the kernels themselves with culling against the kernels without it (tests/raster/test_fused_gpu.py)."""

import math

import pytest
import torch

from bytesplat_ns.raster import warp_masks as twin
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


def warp_mask(mx, my, o, a, b, c, x0: int, y0: int, ww: int = 16, margin: bool = True,
              rows: bool = False) -> torch.Tensor:
    """The twin of common.cuh's warp_mask<WW> (bytesplat_ns/raster/warp_masks.py): the box test unless ``rows``."""
    return twin.warp_mask(mx, my, o, a, b, c, x0, y0, ww=ww, rows=rows, margin=margin)


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


@pytest.mark.parametrize("rows", [False, True], ids=["box", "rows"])
@pytest.mark.parametrize("ww", LAYOUTS)
def test_mask_keeps_every_warp_the_pixel_test_composites(ww, rows):
    for seed in range(4):
        for x0, y0 in ((0, 0), (1904, 1072), (512, 96)):
            scene = culling_edge_scene(20000, x0, y0, seed=seed)
            mask = warp_mask(*scene, x0, y0, ww, rows=rows)
            for dtype in (torch.float32, torch.float64):  # float64: what an FMA-contracted sigma tends to
                need = _warp_hits(composited(*scene, x0, y0, ww, dtype))
                missing = need & ~mask
                assert int((missing != 0).sum()) == 0, f"culled a warp the pixel test composites ({dtype}, {ww})"
            # ...and it culls: most of these Gaussians are small against the tile
            assert WARPS - _kept_warps(mask).mean() > 2.0


@pytest.mark.parametrize("rows", [False, True], ids=["box", "rows"])
@pytest.mark.parametrize("ww", LAYOUTS)
def test_margin_keeps_gaussians_that_graze_a_warps_last_pixel(ww, rows):
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
    assert int((need & ~warp_mask(*scene, 0, 0, ww, rows=rows)).ne(0).sum()) == 0
    assert int((need & ~warp_mask(*scene, 0, 0, ww, margin=False, rows=rows)).ne(0).sum()) > 0


def _tilted(n: int, g: torch.Generator, length=(2.0, 40.0), width=(0.2, 3.0)):
    """(o, a, b, c) of n Gaussians at random angles, standard deviations in ``length`` along their axis
    and ``width`` across it (px): the stretched, tilted footprints of a trained scene."""
    u = lambda: torch.rand(n, generator=g, dtype=torch.float64)  # noqa: E731
    s1 = length[0] * (length[1] / length[0]) ** u()
    s2 = width[0] * (width[1] / width[0]) ** u()
    theta = math.pi * u()
    cs, sn = torch.cos(theta), torch.sin(theta)
    xx, yy = cs * cs * s1**2 + sn * sn * s2**2, sn * sn * s1**2 + cs * cs * s2**2
    xy = cs * sn * (s1**2 - s2**2)
    det = xx * yy - xy * xy
    o = 0.05 + 0.95 * u()
    return tuple(v.to(F) for v in (o, yy / det, -xy / det, xx / det))


@pytest.mark.parametrize("ww", LAYOUTS)
def test_rows_keep_every_warp_of_tilted_gaussians_and_cull_more_than_the_box(ww):
    """Long thin Gaussians at every angle across the tile: the rows test keeps every warp the pixel
    test composites, a subset of the box's warps, and for the 8x4 blocks drops a large share of them
    (what an exact test wins on a trained scene, whose Gaussians are such needles and disks)."""
    g = torch.Generator().manual_seed(9)
    n = 20000
    o, a, b, c = _tilted(n, g)
    mx, my = (-8.0 + 32.0 * torch.rand(n, generator=g)), (-8.0 + 32.0 * torch.rand(n, generator=g))
    scene = (mx, my, o, a, b, c)
    box, rows = warp_mask(*scene, 0, 0, ww), warp_mask(*scene, 0, 0, ww, rows=True)
    for dtype in (torch.float32, torch.float64):
        need = _warp_hits(composited(*scene, 0, 0, ww, dtype))
        assert int((need & ~rows).ne(0).sum()) == 0, f"culled a warp the pixel test composites ({dtype})"
    assert int((rows & ~box).ne(0).sum()) == 0  # never a warp the box culls
    kept_box, kept_rows = float(_kept_warps(box).sum()), float(_kept_warps(rows).sum())
    kept_need = float(_kept_warps(need).sum())
    if ww == 8:
        assert kept_rows < 0.8 * kept_box, (kept_rows, kept_box)
    assert kept_rows <= 1.1 * kept_need + 1, (kept_rows, kept_need)  # close to what the pixels need


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
    # a needle along the tile's diagonal (10 px by 0.5 px standard deviations, opaque): the box keeps every
    # 8x4 block, the rows only those it crosses (0: top left, then one block row of two per step down)
    cs = math.cos(math.pi / 4)
    xx = yy = cs * cs * (100.0 + 0.25)
    xy = cs * cs * (100.0 - 0.25)
    det = xx * yy - xy * xy
    needle = f(8.0, 8.0, 1.0, yy / det, -xy / det, xx / det)
    assert int(warp_mask(*needle, 0, 0, 8)) == 0b1111_1111
    assert int(warp_mask(*needle, 0, 0, 8, rows=True)) == 0b1011_1101
    assert int(warp_mask(*needle, 0, 0, 16, rows=True)) == 0b1111_1111  # 16x2 rows: it crosses each
    # too faint to composite anywhere
    assert int(warp_mask(*f(5.5, 0.5, 0.003, 1.0, 0.0, 1.0), 0, 0)) == 0
    # degenerate, non-finite: every warp
    for ww in LAYOUTS:
        for rows in (False, True):
            assert int(warp_mask(*f(5.5, 0.5, 1.0, 1.0, 1.0, 1.0), 0, 0, ww, rows=rows)) == 255
            assert int(warp_mask(*f(5.5, 0.5, float("nan"), 1.0, 0.0, 1.0), 0, 0, ww, rows=rows)) == 255
            assert int(warp_mask(*f(float("nan"), 0.5, 1.0, 1.0, 0.0, 1.0), 0, 0, ww, rows=rows)) == 255


@pytest.mark.parametrize("rows", [False, True], ids=["box", "rows"])
def test_masks_of_binned_tile_lists_keep_every_composited_warp(rows):
    """warp_masks_torch (the twin of cuda/warp_masks.cu) through real tile lists of two views: each entry's
    mask, computed for the entry's own tile, keeps every warp with a pixel that composites its Gaussian; the
    rows test keeps fewer warps than the box."""
    from bytesplat_ns.raster._torch_impl import bin_tiles_torch
    from bytesplat_ns.raster.warp_masks import warp_masks_torch
    from tests.helpers.culling_scenes import culling_edge_scene_2d, warp_hits_of_entries

    sc = culling_edge_scene_2d(C=2, W=77, H=53, n=600, seed=13)
    W, H = sc["width"], sc["height"]
    offsets, fids = bin_tiles_torch(sc["means2d"], sc["radii"], sc["depths"], W, H, TILE)
    m, c, o = sc["means2d"].reshape(-1, 2), sc["conics"].reshape(-1, 3), sc["opacities"].reshape(-1)
    masks = warp_masks_torch(m, c, o, offsets, fids, 2, W, H, rows)
    assert masks.dtype == torch.uint8 and masks.shape == fids.shape
    need = warp_hits_of_entries(m, c, o, offsets, fids, W, H)
    assert int((need & ~masks.long()).ne(0).sum()) == 0
    if rows:
        box = warp_masks_torch(m, c, o, offsets, fids, 2, W, H, False)
        assert int((masks.long() & ~box.long()).ne(0).sum()) == 0
        assert _kept_warps(masks.long()).sum() < 0.9 * _kept_warps(box.long()).sum()


def test_trimmed_tile_lists_keep_every_composited_entry_in_order_and_the_image():
    """trim_tile_lists_torch (the twin of cuda/warp_masks.cu trim_tile_lists) on the opacity-aware tile lists
    of two views of culling-edge Gaussians: every entry with a pixel that composites its Gaussian stays, each
    tile's list stays in its order, the lists get shorter, and the reference compositing of the trimmed lists
    gives the same image bit for bit. Through ``fused.tile_lists`` (the switch the kernels' callers read)."""
    from bytesplat_ns.raster._torch_impl import render_2d_torch
    from bytesplat_ns.raster.fused import tile_lists
    from bytesplat_ns.raster.options import FusedOptions
    from tests.helpers.culling_scenes import culling_edge_scene_2d, warp_hits_of_entries

    sc = culling_edge_scene_2d(C=2, W=77, H=53, n=400, seed=21)
    W, H = sc["width"], sc["height"]
    args = (sc["means2d"], sc["radii"], sc["depths"], sc["conics"], sc["opacities"], W, H, TILE)
    offsets, fids = tile_lists(*args, FusedOptions(trim_tile_lists=False))
    t_offsets, t_fids = tile_lists(*args, FusedOptions(trim_tile_lists=True))
    assert t_fids.numel() == int(t_offsets[-1]) < 0.95 * fids.numel()
    m, c, o = sc["means2d"].reshape(-1, 2), sc["conics"].reshape(-1, 3), sc["opacities"].reshape(-1)
    need = warp_hits_of_entries(m, c, o, offsets, fids, W, H) != 0
    ntiles = offsets.numel() - 1
    for t in range(ntiles):
        full = fids[offsets[t]:offsets[t + 1]].tolist()
        kept = t_fids[t_offsets[t]:t_offsets[t + 1]].tolist()
        it = iter(full)
        assert all(g in it for g in kept), f"tile {t}: the trimmed list is not a subsequence of the list"
        needed = fids[offsets[t]:offsets[t + 1]][need[offsets[t]:offsets[t + 1]]].tolist()
        assert set(needed) <= set(kept), f"tile {t}: a composited entry was dropped"
    bg = torch.rand(2, 3, generator=torch.Generator().manual_seed(3))
    render = [render_2d_torch(sc["means2d"], sc["conics"], sc["colors"], sc["opacities"], bg, off, ids, W, H)
              for off, ids in ((offsets, fids), (t_offsets, t_fids))]
    for full, trimmed in zip(*render):
        assert torch.equal(full, trimmed)


def test_trimmed_tile_lists_ignore_what_follows_the_lists():
    """A caller that knows its binning's total gets lists followed by unused entries (bin_tiles' known_total,
    the sharded step): trimming reads the lists only, so the same lists with a tail trim the same."""
    from bytesplat_ns.raster._torch_impl import bin_tiles_torch
    from bytesplat_ns.raster.warp_masks import trim_tile_lists_torch
    from tests.helpers.culling_scenes import culling_edge_scene_2d

    sc = culling_edge_scene_2d(C=1, W=40, H=33, n=120, seed=22)
    W, H = sc["width"], sc["height"]
    offsets, fids = bin_tiles_torch(sc["means2d"], sc["radii"], sc["depths"], W, H, TILE)
    m, c, o = sc["means2d"].reshape(-1, 2), sc["conics"].reshape(-1, 3), sc["opacities"].reshape(-1)
    plain = trim_tile_lists_torch(m, c, o, offsets, fids, 1, W, H)
    tailed = trim_tile_lists_torch(m, c, o, offsets, torch.cat([fids, torch.full((7,), 10**6, dtype=fids.dtype)]),
                                   1, W, H)
    for x, y in zip(plain, tailed):
        assert torch.equal(x, y)
