"""CUDA tile binning (``cuda/binning.cu``) against its pure-PyTorch twin ``bin_tiles_torch`` (GPU only).

The result must be identical (torch.equal on offsets and flatten_ids): several cameras, sizes not
divisible by the tile, Gaussians partly/fully off-screen, culled entries (radii <= 0) with NaN
means, huge radii, tile-boundary means, equal and negative depths (ties, bit order), empty
scenes. ``-s`` prints a torch vs CUDA timing at 1M Gaussians, 1920x1080 (not asserted).
"""

from __future__ import annotations

import time

import pytest
import torch

pytestmark = pytest.mark.gpu


def _scene(C, N, W, H, seed, *, margin=0.5, max_r=40, culled=0.2, huge=0.0, depth_levels=None,
           negative_depths=False, grid=False):
    g = torch.Generator().manual_seed(seed)
    lo = torch.tensor([-margin * W, -margin * H])
    span = torch.tensor([(1 + 2 * margin) * W, (1 + 2 * margin) * H])
    means2d = lo + torch.rand(C, N, 2, generator=g) * span
    radii = torch.randint(1, max_r + 1, (C, N), generator=g, dtype=torch.int32)
    if grid:  # means and radii on tile boundaries: floor/ceil exactly at integers
        means2d = torch.round(means2d / 8) * 8
        radii = (torch.round(radii.float() / 8) * 8).clamp_min(8).to(torch.int32)
    if huge > 0:
        big = torch.rand(C, N, generator=g) < huge
        radii[big] = torch.randint(2000, 100000, (int(big.sum()),), generator=g, dtype=torch.int32)
    dead = torch.rand(C, N, generator=g) < culled
    radii[dead] = torch.where(torch.rand(int(dead.sum()), generator=g) < 0.5, 0, -1).to(torch.int32)
    # gsplat leaves culled means uninitialised: NaN / garbage must not matter
    nan = dead & (torch.rand(C, N, generator=g) < 0.5)
    means2d[nan] = float("nan")
    means2d[dead & ~nan] = 1e30
    if depth_levels is not None:  # few distinct depths: many ties within a tile
        depths = torch.randint(0, depth_levels, (C, N), generator=g).float() * 0.5 + 1.0
    else:
        depths = 0.1 + 10 * torch.rand(C, N, generator=g)
    if negative_depths:
        neg = torch.rand(C, N, generator=g) < 0.3
        depths[neg] = -depths[neg]
        depths[:, ::17] = -0.0
        depths[:, ::19] = 0.0
    depths[dead] = float("nan")
    return means2d.cuda(), radii.cuda(), depths.cuda()


def _check(means2d, radii, depths, W, H, tile_size=16):
    from bytesplat_ns.raster._wrapper import _ops
    from bytesplat_ns.raster.fused import bin_tiles, bin_tiles_torch

    ref_off, ref_ids = bin_tiles_torch(means2d, radii, depths, W, H, tile_size)
    off, ids, total = _ops().bin_tiles(means2d.contiguous(), radii.contiguous(), depths.contiguous(), W, H, tile_size)
    assert total.tolist() == [ref_ids.numel()]
    torch.cuda.synchronize()
    assert off.dtype == torch.int32 and ids.dtype == torch.int32
    assert off.shape == ref_off.shape and ids.shape == ref_ids.shape
    assert torch.equal(off, ref_off)
    assert torch.equal(ids, ref_ids)
    pub_off, pub_ids = bin_tiles(means2d, radii, depths, W, H, tile_size)  # the public entry
    assert torch.equal(pub_off, ref_off) and torch.equal(pub_ids, ref_ids)
    return ids.numel()


@pytest.mark.parametrize(
    "C,N,W,H,kw",
    [
        (1, 2000, 64, 48, {}),
        (3, 5000, 203, 117, {}),
        (4, 3000, 250, 131, {"margin": 2.0}),  # mostly off-screen
        (2, 4000, 173, 99, {"huge": 0.01}),  # some cover the whole image
        (3, 4000, 160, 96, {"grid": True}),  # means/radii on tile boundaries
        (2, 6000, 97, 211, {"depth_levels": 3}),  # many equal depths
        (3, 3000, 123, 77, {"depth_levels": 2, "negative_depths": True}),
        (5, 1500, 33, 17, {"max_r": 3, "culled": 0.6}),
    ],
)
def test_matches_torch(C, N, W, H, kw):
    m, r, d = _scene(C, N, W, H, seed=C * 1000 + N, **kw)
    assert _check(m, r, d, W, H) > 0


def _per_axis(r, seed):
    """[C,N,2] radii from [C,N] ones: y independent of x, a share of one-axis zeros (culled)."""
    g = torch.Generator().manual_seed(seed)
    ry = (r.cpu().float() * torch.rand(r.shape, generator=g)).round().to(torch.int32)
    ry[torch.rand(r.shape, generator=g) < 0.05] = 0
    return torch.stack([r.cpu(), ry], -1).cuda().contiguous()


@pytest.mark.parametrize(
    "C,N,W,H,kw",
    [
        (3, 5000, 203, 117, {}),
        (2, 4000, 173, 99, {"huge": 0.01}),
        (3, 4000, 160, 96, {"grid": True}),
        (2, 6000, 97, 211, {"depth_levels": 3}),
    ],
)
def test_per_axis_radii_match_torch(C, N, W, H, kw):
    """[C,N,2] radii (the opacity-aware reach, raster/tile_reach.py): x and y boxes differ."""
    from bytesplat_ns.raster.fused import bin_tiles_torch, tile_intersections

    m, r, d = _scene(C, N, W, H, seed=C * 77 + N, **kw)
    r2 = _per_axis(r, seed=N)
    assert _check(m, r2, d, W, H) > 0
    ref_off, _ = bin_tiles_torch(m, r2, d, W, H)
    tiles = (W + 15) // 16 * ((H + 15) // 16)
    assert tile_intersections(m, r2, W, H).tolist() == [
        int(ref_off[(c + 1) * tiles] - ref_off[c * tiles]) for c in range(C)]


@pytest.mark.parametrize("tile_size", [8, 12, 32])
def test_other_tile_sizes(tile_size):
    m, r, d = _scene(2, 3000, 201, 139, seed=tile_size, huge=0.005)
    assert _check(m, r, d, 201, 139, tile_size) > 0


def test_large_scene_multi_block():
    m, r, d = _scene(2, 300_000, 1000, 700, seed=7, max_r=60, depth_levels=50)
    assert _check(m, r, d, 1000, 700) > 100_000


def test_empty_scenes():
    W, H = 100, 70
    m, r, d = _scene(2, 500, W, H, seed=1)
    # nothing visible: all culled
    assert _check(m, torch.zeros_like(r), d, W, H) == 0
    # visible but entirely off-screen
    far = torch.full_like(m, -5000.0)
    assert _check(far, r.abs() + 1, d, W, H) == 0
    # no Gaussians at all, and no cameras
    z = torch.zeros(2, 0, 2, device="cuda")
    assert _check(z, torch.zeros(2, 0, dtype=torch.int32, device="cuda"), torch.zeros(2, 0, device="cuda"), W, H) == 0
    z = torch.zeros(0, 5, 2, device="cuda")
    assert _check(z, torch.zeros(0, 5, dtype=torch.int32, device="cuda"), torch.zeros(0, 5, device="cuda"), W, H) == 0


def test_single_gaussian_and_single_tile():
    m = torch.tensor([[[5.0, 5.0], [7.0, 9.0]]], device="cuda")
    r = torch.tensor([[3, 2]], dtype=torch.int32, device="cuda")
    d = torch.tensor([[2.0, 1.0]], device="cuda")
    assert _check(m, r, d, 10, 10) == 2  # one tile, both inside, sorted by depth


def test_public_entry_dtypes_and_the_torch_switch():
    from bytesplat_ns.raster.fused import bin_tiles, bin_tiles_torch

    m, r, d = _scene(2, 2000, 150, 90, seed=3)
    ref = bin_tiles_torch(m, r, d, 150, 90)
    out = bin_tiles(m.double().requires_grad_(), r.long(), d, 150, 90)  # converted inputs
    assert torch.equal(out[0], ref[0]) and torch.equal(out[1], ref[1])
    out = bin_tiles(m, r, d, 150, 90, binning="torch")  # FusedOptions.binning
    assert torch.equal(out[0], ref[0]) and torch.equal(out[1], ref[1])


def test_known_total_reads_nothing_and_lists_the_same():
    """Given the total (``tile_intersections``' sum, what the sharded step gathers), the kernel
    reads nothing back (sync debug mode "error" would raise) and lists the same pairs. A wrong
    total stays in bounds: a larger one pads with sentinels behind every tile (same lists), a
    smaller one truncates (never writes past its pairs); the true count comes back on the device."""
    from bytesplat_ns.raster._wrapper import _ops
    from bytesplat_ns.raster.fused import bin_tiles_in_room, bin_tiles_torch, tile_intersections

    W, H = 203, 117
    m, r, d = _scene(3, 5000, W, H, seed=11, huge=0.005)
    ref_off, ref_ids = bin_tiles_torch(m, r, d, W, H)
    per_cam = tile_intersections(m, r, W, H)
    M = int(per_cam.sum())
    assert M == ref_ids.numel() > 0
    tiles = (W + 15) // 16 * ((H + 15) // 16)
    assert per_cam.tolist() == [int(ref_off[(c + 1) * tiles] - ref_off[c * tiles]) for c in range(3)]
    ops = _ops()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        off, ids, total = ops.bin_tiles(m, r, d, W, H, 16, M)
        room_off, room_ids, room_total = bin_tiles_in_room(m, r, d, W, H, room=M + 1000)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert torch.equal(off, ref_off) and torch.equal(ids, ref_ids) and total.tolist() == [M]
    # a room larger than the count (the training step's, pair_capacity.py): the same lists, the true count
    assert torch.equal(room_off, ref_off) and torch.equal(room_ids[:M], ref_ids) and room_ids.numel() == M + 1000
    assert room_total.tolist() == [M]
    off, ids, total = ops.bin_tiles(m, r, d, W, H, 16, M - 1000)
    torch.cuda.synchronize()
    assert ids.numel() == M - 1000 and int(off[-1]) <= M - 1000 and total.tolist() == [M]
    assert bool((off[1:] >= off[:-1]).all()) and int(ids.min()) >= 0 and int(ids.max()) < 3 * 5000


def _time_ms(fn, reps=20):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) * 1000 / reps


def test_timing_1m_1080p():
    from bytesplat_ns.raster._wrapper import _ops
    from bytesplat_ns.raster.fused import bin_tiles_torch

    W, H, N = 1920, 1080, 1_000_000
    g = torch.Generator().manual_seed(0)
    m = (torch.rand(1, N, 2, generator=g) * torch.tensor([W * 1.2, H * 1.2]) - torch.tensor([W * 0.1, H * 0.1]))
    # mostly small splats, a long tail of large ones (like a trained scene)
    r = torch.exp(torch.randn(1, N, generator=g) * 0.8 + 1.5).clamp(1, 300).to(torch.int32)
    r[torch.rand(1, N, generator=g) < 0.3] = 0
    d = 0.5 + 20 * torch.rand(1, N, generator=g)
    m, r, d = m.cuda(), r.cuda(), d.cuda()
    ops = _ops()
    ref = bin_tiles_torch(m, r, d, W, H)
    out = ops.bin_tiles(m, r, d, W, H, 16)
    assert torch.equal(out[0], ref[0]) and torch.equal(out[1], ref[1])
    t_torch = _time_ms(lambda: bin_tiles_torch(m, r, d, W, H))
    t_cuda = _time_ms(lambda: ops.bin_tiles(m, r, d, W, H, 16))
    print(f"\nbin_tiles 1M Gaussians 1920x1080, {ref[1].numel()} intersections: "
          f"torch {t_torch:.3f} ms, CUDA {t_cuda:.3f} ms ({t_torch / max(t_cuda, 1e-9):.1f}x)")
