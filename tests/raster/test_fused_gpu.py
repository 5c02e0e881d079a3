"""The fused CUDA backend against the pure-PyTorch reference (GPU only).

Tolerances (fp32 both sides): images max|a-b|/max|b| <= 1e-5, every gradient <= 1e-4.
Covers: rasterize_fused (forward + our backward kernel) and fused_render_loss (render + loss +
backward in one launch), each with expf and with the falloff as 2^q (``fast_exp``: the same
tolerances, its error is of the size of sigma's own rounding) and the plain backward with one and
with two pixels per thread (``bwd_pixels_per_thread``), with empty tiles, over-capacity tiles (streaming path), sizes not
divisible by 16, backgrounds, several views per launch, absgrad and the two-launch fallback;
every loss case also under the split schedule (render_fwd -> loss_grad -> render_bwd); the
pruning score gathered by the backward kernels (``contribution=True``) against
``pruning.contribution_scores_2d`` in every schedule.
"""

from __future__ import annotations

import math
import os
import zlib

import pytest
import torch

from bytesplat_ns.raster.options import CULL_ROWS, FusedOptions

pytestmark = pytest.mark.gpu

IMG_TOL = 1e-5
GRAD_TOL = 1e-4

PROJECTIONS = ["torch"] + (["gsplat"] if os.environ.get("BYTESPLAT_TEST_GSPLAT_PROJECTION") == "1" else [])


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.detach().double(), b.detach().double()
    scale = b.abs().max().item()
    return (a - b).abs().max().item() / max(scale, 1e-12)


def _rotation(axis_angle: torch.Tensor) -> torch.Tensor:
    th = axis_angle.norm()
    k = axis_angle / th
    K = torch.tensor([[0, -k[2], k[1]], [k[2], 0, -k[0]], [-k[1], k[0], 0]])
    return torch.eye(3) + math.sin(th) * K + (1 - math.cos(th)) * K @ K


def make_scene(N, C, W, H, seed, sh_degree=3, cluster=None, opacity=None, scale=0.12, device="cuda"):
    """Random Gaussians in front of C cameras near the origin looking down +z.

    ``cluster=(u, v, spread)``: put the means near the ray of pixel (u, v) of camera 0 (tiles far
    from it stay empty). ``opacity``: fixed opacity for all Gaussians."""
    g = torch.Generator().manual_seed(seed)
    f = 0.9 * W
    if cluster is None:
        z = 3.0 + 2.0 * torch.rand(N, generator=g)
        x = (torch.rand(N, generator=g) * 2 - 1) * 0.6 * z * W / (2 * f) * 1.2
        y = (torch.rand(N, generator=g) * 2 - 1) * 0.6 * z * H / (2 * f) * 1.2
    else:
        u, v, spread = cluster
        z = 4.0 + 0.5 * torch.rand(N, generator=g)
        x = ((u - W / 2) / f + spread * torch.randn(N, generator=g)) * z
        y = ((v - H / 2) / f + spread * torch.randn(N, generator=g)) * z
    means = torch.stack([x, y, z], -1)
    quats = torch.randn(N, 4, generator=g)
    scales = torch.exp(torch.randn(N, 3, generator=g) * 0.4 + math.log(scale))
    if opacity is None:
        opacities = torch.sigmoid(torch.randn(N, generator=g) * 1.5)
    else:
        opacities = torch.full((N,), float(opacity))
    if sh_degree is None:
        colors = torch.rand(N, 3, generator=g)
    else:
        colors = torch.randn(N, (sh_degree + 1) ** 2, 3, generator=g) * 0.25
        colors[:, 0, :] += 0.3
    viewmats = []
    for c in range(C):
        R = _rotation(torch.randn(3, generator=g) * 0.03 + 1e-4) if c > 0 else torch.eye(3)
        t = torch.randn(3, generator=g) * 0.05 if c > 0 else torch.zeros(3)
        M = torch.eye(4)
        M[:3, :3] = R
        M[:3, 3] = t
        viewmats.append(M)
    viewmats = torch.stack(viewmats)
    K = torch.tensor([[f, 0, W / 2], [0, f, H / 2], [0, 0, 1.0]])
    Ks = K.expand(C, 3, 3).clone()
    dev = device
    return dict(
        means=means.to(dev), quats=quats.to(dev), scales=scales.to(dev), opacities=opacities.to(dev),
        colors=colors.to(dev), viewmats=viewmats.to(dev), Ks=Ks.to(dev), width=W, height=H,
        sh_degree=sh_degree,
    )


def _params(scene):
    return {k: scene[k].clone().requires_grad_(True) for k in ("means", "quats", "scales", "opacities", "colors")}


def _args(p, scene):
    return (p["means"], p["quats"], p["scales"], p["opacities"], p["colors"], scene["viewmats"], scene["Ks"],
            scene["width"], scene["height"])


def _compare_grads(pf, pr, extra=()):
    for k in pf:
        assert pf[k].grad is not None and pr[k].grad is not None, k
        e = rel_err(pf[k].grad, pr[k].grad)
        assert e <= GRAD_TOL, f"grad {k}: rel err {e:.3g}"
    for name, a, b in extra:
        e = rel_err(a, b)
        assert e <= GRAD_TOL, f"{name}: rel err {e:.3g}"


def _max_tile_count(info):
    off = info["isect_offsets"].long()
    return int((off[1:] - off[:-1]).max().item())


# ---------------------------------------------------------------------------------------------
# rasterize_fused
# ---------------------------------------------------------------------------------------------

RASTER_CASES = [
    # name, N, C, W, H, background, sh_degree, absgrad, cluster
    ("basic", 300, 1, 64, 48, False, 3, False, None),
    ("odd_sizes_bg_multiview_absgrad", 400, 3, 77, 45, True, 3, True, None),
    ("rgb_colors_tall", 300, 2, 50, 130, True, None, True, None),
    ("empty_tiles_cluster", 200, 2, 96, 64, True, 2, True, (20.0, 15.0, 0.02)),
    ("many_per_tile", 1500, 1, 48, 40, False, 1, True, (24.0, 20.0, 0.01)),
]


@pytest.mark.parametrize("bwd_pixels", [1, 2], ids=["bwd1px", "bwd2px"])
@pytest.mark.parametrize("fast_exp", [False, True], ids=["expf", "fast_exp"])
@pytest.mark.parametrize("projection", PROJECTIONS)
@pytest.mark.parametrize("case", RASTER_CASES, ids=[c[0] for c in RASTER_CASES])
def test_rasterize_fused_matches_reference(case, projection, fast_exp, bwd_pixels):
    from bytesplat_ns.raster.fused import rasterize_fused
    from bytesplat_ns.raster.reference import rasterize_reference

    name, N, C, W, H, use_bg, sh, absgrad, cluster = case
    scene = make_scene(N, C, W, H, seed=zlib.crc32(name.encode()) % 1000, sh_degree=sh, cluster=cluster,
                       opacity=0.05 if name == "many_per_tile" else None)
    bg = torch.rand(C, 3, device="cuda") if use_bg else None
    g = torch.Generator(device="cuda").manual_seed(7)
    wr = torch.randn(C, H, W, 3, device="cuda", generator=g)
    wa = torch.randn(C, H, W, 1, device="cuda", generator=g)

    outs = {}
    for backend in ("fused", "reference"):
        p = _params(scene)
        kw = dict(sh_degree=sh, backgrounds=bg, absgrad=absgrad)
        if backend == "fused":
            options = FusedOptions(projection=projection, fast_exp=fast_exp, bwd_pixels_per_thread=bwd_pixels)
            render, alpha, info = rasterize_fused(*_args(p, scene), options=options, **kw)
        else:
            render, alpha, info = rasterize_reference(*_args(p, scene), **kw)
        info["means2d"].retain_grad()
        ((render * wr).sum() + (alpha * wa).sum()).backward()
        outs[backend] = (render, alpha, info, p)

    rf, af, inf, pf = outs["fused"]
    rr, ar, inr, pr = outs["reference"]
    assert rf.shape == rr.shape == (C, H, W, 3) and af.shape == ar.shape == (C, H, W, 1)
    assert rel_err(rf, rr) <= IMG_TOL, f"render rel err {rel_err(rf, rr):.3g}"
    assert rel_err(af, ar) <= IMG_TOL, f"alpha rel err {rel_err(af, ar):.3g}"
    if projection == "torch":
        assert torch.equal(inf["radii"].cpu(), inr["radii"].cpu().to(inf["radii"].dtype))
    assert inf["n_cameras"] == C and inf["width"] == W and inf["height"] == H and inf["gaussian_ids"] is None
    extra = [("means2d.grad", inf["means2d"].grad, inr["means2d"].grad)]
    if absgrad:
        extra.append(("means2d.absgrad", inf["means2d"].absgrad, inr["means2d"].absgrad))
    _compare_grads(pf, pr, extra)
    if name == "many_per_tile":
        assert _max_tile_count(inf) > 256  # several shared-memory batches per tile
    if name == "empty_tiles_cluster":
        off = inf["isect_offsets"].long()
        assert int(((off[1:] - off[:-1]) == 0).sum()) > 0


def test_rasterize_fused_nothing_visible():
    from bytesplat_ns.raster.fused import rasterize_fused

    scene = make_scene(50, 2, 40, 30, seed=3)
    scene["means"][:, 2] = -5.0  # behind every camera
    p = _params(scene)
    bg = torch.rand(2, 3, device="cuda")
    render, alpha, info = rasterize_fused(*_args(p, scene), sh_degree=3, backgrounds=bg, absgrad=True)
    assert torch.allclose(render, bg[:, None, None, :].expand_as(render))
    assert float(alpha.abs().max()) == 0.0
    render.sum().backward()
    assert float(p["means"].grad.abs().max()) == 0.0


def _twin_inputs(seed):
    """2D inputs (means2d, conics, colors, opacities) of a small 2-view scene, 40x36, and its tile lists."""
    from bytesplat_ns.raster.fused import bin_tiles, project

    scene = make_scene(40, 2, 40, 36, seed=seed, sh_degree=None)
    with torch.no_grad():
        radii, m2, depths, con, col, op = project(
            scene["means"], scene["quats"], scene["scales"], scene["opacities"], scene["colors"],
            scene["viewmats"], scene["Ks"], 40, 36, sh_degree=None, near_plane=0.01, far_plane=1e10,
            eps2d=0.3, projection="torch")
    offsets, fids = bin_tiles(m2, radii, depths, 40, 36)
    return [m2, con.clone(memory_format=torch.contiguous_format), col, op], offsets, fids


def test_render_kernel_matches_torch_twin():
    """The kernel pair against its pure-PyTorch twin on identical 2D inputs and tile lists."""
    from bytesplat_ns.raster.fused import _RasterizeFused, render_2d_torch

    (m2, con, col, op), offsets, fids = _twin_inputs(11)
    bg = torch.rand(2, 3, device="cuda")
    ins = [t.detach().clone().contiguous().requires_grad_(True) for t in (m2, con, col, op)]
    ins2 = [t.detach().clone().requires_grad_(True) for t in ins]
    r1, a1 = _RasterizeFused.apply(*ins, bg, offsets, fids, 40, 36, False)
    r2, a2 = render_2d_torch(*ins2, bg, offsets, fids, 40, 36)
    assert rel_err(r1, r2) <= IMG_TOL and rel_err(a1, a2) <= IMG_TOL
    w = torch.randn_like(r1)
    ((r1 * w).sum() + a1.sum()).backward()
    ((r2 * w).sum() + a2.sum()).backward()
    for x, y, n in zip(ins, ins2, ("means2d", "conics", "colors", "opacities")):
        assert rel_err(x.grad, y.grad) <= GRAD_TOL, n


@pytest.mark.parametrize("fast_exp", [False, True], ids=["expf", "fast_exp"])
def test_nan_exponent_is_skipped_as_in_the_twin(fast_exp):
    """A Gaussian whose exponent is NaN (a NaN conic entry) is composited at no pixel, by the forward
    and the backward alike, as in the twin: fminf alone would give it alpha 0.999 in the forward while
    the backward skipped it, so every Gaussian in front of it got wrong gradients. The twin's own
    gradients are NaN wherever the Gaussian is listed (autograd multiplies the unused branch's zero by
    its NaN alpha), so the gradients are held against the twin on the scene with that Gaussian made
    invisible (opacity 0, its conic finite)."""
    from bytesplat_ns.raster.fused import _RasterizeFused, render_2d_torch

    (m2, con, col, op), offsets, fids = _twin_inputs(12)
    bad = int(fids[fids.numel() // 2])  # a Gaussian in some tile's list (index into the flattened views)
    invisible = op.detach().clone().contiguous()
    invisible.view(-1)[bad] = 0.0
    ins2 = [t.detach().clone().contiguous().requires_grad_(True) for t in (m2, con, col, invisible)]
    con.view(-1, 3)[bad, 0] = float("nan")
    bg = torch.rand(2, 3, device="cuda")
    ins = [t.detach().clone().contiguous().requires_grad_(True) for t in (m2, con, col, op)]
    r1, a1 = _RasterizeFused.apply(*ins, bg, offsets, fids, 40, 36, False, True, True, fast_exp)
    r2, a2 = render_2d_torch(*ins2, bg, offsets, fids, 40, 36)
    with torch.no_grad():  # the twin on the NaN scene renders the same image
        r3, a3 = render_2d_torch(*[t.detach() for t in ins], bg, offsets, fids, 40, 36)
    assert bool(torch.isfinite(r3).all())
    for r, a in ((r2, a2), (r3, a3)):
        assert rel_err(r1, r) <= IMG_TOL and rel_err(a1, a) <= IMG_TOL
    w = torch.randn_like(r1)
    ((r1 * w).sum() + a1.sum()).backward()
    ((r2 * w).sum() + a2.sum()).backward()
    rows = torch.arange(m2.shape[0] * m2.shape[1], device="cuda") != bad
    for x, y, n in zip(ins, ins2, ("means2d", "conics", "colors", "opacities")):
        gx, gy = x.grad.reshape(rows.numel(), -1), y.grad.reshape(rows.numel(), -1)
        assert bool(torch.isfinite(gx).all()), n
        assert float(gx[~rows].abs().max()) == 0.0, n
        assert rel_err(gx[rows], gy[rows]) <= GRAD_TOL, n


_EDGE_INPUTS = ("means2d", "conics", "colors", "opacities")


def _edge_scene_run(sc, offsets, fids, schedule, warp_cull, seed, tile_order=None):
    """The culling-edge scene ``sc`` through the kernels on the tile lists (offsets, fids): the plain
    render pair (``schedule`` None, against random output weights) or the fused loss in that schedule
    (one launch with a small capacity, so that tiles stream), the plain kernels' blocks taking their
    tiles in ``tile_order`` (None: row by row). Returns (outputs, input gradients)."""
    from bytesplat_ns.raster.fused import _FusedLoss, _RasterizeFused

    W, H = sc["width"], sc["height"]
    g = torch.Generator(device="cuda").manual_seed(seed)
    bg = torch.rand(2, 3, device="cuda", generator=g)
    gt = torch.rand(2, H, W, 3, device="cuda", generator=g)
    w = torch.randn(2, H, W, 3, device="cuda", generator=g)
    ins = [sc[k].clone().contiguous().requires_grad_(True) for k in _EDGE_INPUTS]
    if schedule is None:
        r, a = _RasterizeFused.apply(*ins, bg, offsets, fids, W, H, False, warp_cull, True, False, 1, tile_order)
        ((r * w).sum() + a.sum()).backward()
        out = (r, a)
    else:
        loss, r, a, _, _ = _FusedLoss.apply(*ins, bg, gt, offsets, fids, W, H, 0.2, False,
                                            64 if schedule == "one_launch" else None, 2, schedule, True, warp_cull,
                                            False, False, 1, tile_order)
        loss.backward()
        out = (loss, r, a)
        assert _FusedLoss.last_kernel_info["warp_cull"] is bool(warp_cull)
    return [t.detach() for t in out], [x.grad for x in ins]


def _assert_same_run(run1, run0):
    """The same outputs bit for bit, the same gradients up to the order of the float atomics."""
    (out1, grads1), (out0, grads0) = run1, run0
    for x, y in zip(out1, out0):
        assert torch.equal(x, y)
    for x, y, n in zip(grads1, grads0, _EDGE_INPUTS):
        assert rel_err(x, y) <= 1e-6, (n, rel_err(x, y))


@pytest.mark.parametrize("cull", [True, CULL_ROWS], ids=["box", "rows"])
@pytest.mark.parametrize("schedule", [None, "split", "one_launch"])
def test_warp_culling_changes_nothing(schedule, cull):
    """The kernels skip, per warp, the Gaussians that cannot reach alpha 1/255 at any of its pixels
    (``warp_mask``, cuda/common.cuh). On Gaussians made to sit on that edge
    (tests/helpers/culling_scenes.py: sub-pixel to 30 px, up to 1:300 anisotropy, opacities at the threshold)
    the kernels with culling (the default: the box test; ``rows``: the plain backward's masks with the rows
    test, cuda/warp_masks.cu) and without (``warp_cull=False``) must give the same image bit for bit (a
    pixel makes the same additions in the same order) and the same gradients up to the order of the float
    atomics. ``None``: the plain render pair; otherwise the fused loss in that schedule."""
    from bytesplat_ns.raster.fused import bin_tiles
    from tests.helpers.culling_scenes import culling_edge_scene_2d

    sc = culling_edge_scene_2d(C=2, W=77, H=53, n=300, seed=7, device="cuda")  # ~1/3 of pixels saturate
    offsets, fids = bin_tiles(sc["means2d"], sc["radii"], sc["depths"], sc["width"], sc["height"])
    assert int((offsets[1:] - offsets[:-1]).max()) > 64  # long tiles: several batches stream
    _assert_same_run(*(_edge_scene_run(sc, offsets, fids, schedule, mode, seed=8) for mode in (cull, False)))


@pytest.mark.parametrize("warp_cull", [True, False])
@pytest.mark.parametrize("schedule", [None, "split", "one_launch"])
def test_opacity_aware_tiles_change_nothing(schedule, warp_cull):
    """Binning into each Gaussian's opacity-aware reach (``raster/tile_reach.py``, per axis) instead of
    its square radius leaves out only (tile, Gaussian) pairs no pixel would composite: on the
    culling-edge scene the lists get shorter and the kernels give the same image bit for bit and the
    same gradients up to the order of the float atomics, with the per-warp cull and without it."""
    from bytesplat_ns.raster.fused import bin_tiles
    from bytesplat_ns.raster.tile_reach import opacity_aware_radii
    from tests.helpers.culling_scenes import culling_edge_scene_2d

    sc = culling_edge_scene_2d(C=2, W=77, H=53, n=300, seed=9, device="cuda")
    reach = opacity_aware_radii(sc["radii"], sc["conics"], sc["opacities"])
    square, tight = (bin_tiles(sc["means2d"], r, sc["depths"], sc["width"], sc["height"]) for r in (sc["radii"], reach))
    assert tight[1].numel() < square[1].numel()
    _assert_same_run(_edge_scene_run(sc, *tight, schedule, warp_cull, seed=10),
                     _edge_scene_run(sc, *square, schedule, warp_cull, seed=10))


@pytest.mark.parametrize("rows", [False, True], ids=["box", "rows"])
def test_warp_masks_match_the_twin_and_keep_every_composited_warp(rows):
    """cuda/warp_masks.cu against its twin (raster/warp_masks.py) on the culling-edge scene's tile lists, and
    against the pixels: every warp of an entry's tile with a pixel that composites the entry's Gaussian has
    its bit set (the kernel's float rounding may differ from the twin's; the widening covers it)."""
    from bytesplat_ns.raster._wrapper import _ops
    from bytesplat_ns.raster.fused import bin_tiles
    from bytesplat_ns.raster.warp_masks import warp_masks_torch
    from tests.helpers.culling_scenes import culling_edge_scene_2d, warp_hits_of_entries

    sc = culling_edge_scene_2d(C=2, W=77, H=53, n=600, seed=13, device="cuda")
    W, H = sc["width"], sc["height"]
    offsets, fids = bin_tiles(sc["means2d"], sc["radii"], sc["depths"], W, H)
    m, c, o = (sc[k].reshape(-1, d).contiguous().float() for k, d in (("means2d", 2), ("conics", 3), ("opacities", 1)))
    o = o.reshape(-1)
    cuda = _ops().warp_masks(m, c, o, offsets, fids, 2, W, H, rows).cpu()
    twin = warp_masks_torch(m.cpu(), c.cpu(), o.cpu(), offsets.cpu(), fids.cpu(), 2, W, H, rows)
    assert cuda.dtype == torch.uint8 and cuda.shape == fids.shape
    assert (cuda != twin).float().mean() <= 1e-3
    need = warp_hits_of_entries(m.cpu(), c.cpu(), o.cpu(), offsets.cpu(), fids.cpu(), W, H)
    assert int((need & ~cuda.long()).ne(0).sum()) == 0


@pytest.mark.parametrize("schedule", [None, "split", "one_launch"])
def test_trimmed_tile_lists_change_nothing(schedule):
    """Dropping the tile-list entries whose Gaussian reaches no 8x4 block of their tile
    (``FusedOptions.trim_tile_lists``, cuda/warp_masks.cu trim_tile_lists) leaves out only entries no
    pixel composites: on the culling-edge scene's opacity-aware lists the lists get shorter and the kernels
    give the same image bit for bit and the same gradients up to the order of the float atomics."""
    from bytesplat_ns.raster.fused import bin_tiles, trim_tile_lists
    from bytesplat_ns.raster.tile_reach import opacity_aware_radii
    from tests.helpers.culling_scenes import culling_edge_scene_2d

    sc = culling_edge_scene_2d(C=2, W=77, H=53, n=300, seed=15, device="cuda")
    W, H = sc["width"], sc["height"]
    offsets, fids = bin_tiles(sc["means2d"], opacity_aware_radii(sc["radii"], sc["conics"], sc["opacities"]),
                              sc["depths"], W, H)
    t_offsets, t_fids = trim_tile_lists(sc["means2d"], sc["conics"], sc["opacities"], offsets, fids, W, H)
    assert t_fids.numel() == fids.numel() and int(t_offsets[-1]) < 0.95 * fids.numel()
    _assert_same_run(_edge_scene_run(sc, t_offsets, t_fids, schedule, True, seed=16),
                     _edge_scene_run(sc, offsets, fids, schedule, True, seed=16))


def test_trim_tile_lists_keeps_the_entries_its_masks_keep_in_order():
    """cuda/warp_masks.cu trim_tile_lists against the twin's compaction (``compact_tile_lists``) of the kernel's
    own rows masks (the masks are held against the twin and the pixels above): the same offsets, the kept
    entries in their order and their masks, bit for bit; every entry with a composited pixel kept; lists
    followed by unused entries (bin_tiles' known_total) trimmed the same."""
    from bytesplat_ns.raster._wrapper import _ops
    from bytesplat_ns.raster.fused import bin_tiles
    from bytesplat_ns.raster.warp_masks import compact_tile_lists
    from tests.helpers.culling_scenes import culling_edge_scene_2d, warp_hits_of_entries

    sc = culling_edge_scene_2d(C=2, W=77, H=53, n=600, seed=13, device="cuda")
    W, H = sc["width"], sc["height"]
    offsets, fids = bin_tiles(sc["means2d"], sc["radii"], sc["depths"], W, H)
    m, c, o = (sc[k].reshape(-1, d).contiguous().float() for k, d in (("means2d", 2), ("conics", 3), ("opacities", 1)))
    o = o.reshape(-1)
    masks = _ops().warp_masks(m, c, o, offsets, fids, 2, W, H, True)
    expected_offsets, expected_fids, expected_masks = compact_tile_lists(offsets, fids, masks)
    tailed = torch.cat([fids, torch.full((5,), 2**30, dtype=fids.dtype, device="cuda")])
    for ids in (fids, tailed):
        t_offsets, t_fids, t_masks = _ops().trim_tile_lists(m, c, o, offsets, ids, 2, W, H)
        total = int(t_offsets[-1])
        assert torch.equal(t_offsets, expected_offsets) and total < fids.numel()
        assert torch.equal(t_fids[:total], expected_fids) and torch.equal(t_masks[:total], expected_masks)
    need = warp_hits_of_entries(m.cpu(), c.cpu(), o.cpu(), offsets.cpu(), fids.cpu(), W, H)
    assert bool((masks != 0).cpu()[need != 0].all())


@pytest.mark.parametrize("schedule", [None, "split"])
def test_tile_order_changes_nothing(schedule):
    """With the blocks taking the longest tile lists first (``raster/tiles.py tile_order``, cuda/common.cuh
    ``block_tile``) every tile is still rendered once by one block: on the culling-edge scene (two views,
    tiles of very different lengths) the image is the same bit for bit and the gradients the same up to
    the order of the float atomics, in the plain render pair and in the split schedule."""
    from bytesplat_ns.raster.fused import bin_tiles
    from bytesplat_ns.raster.tiles import tile_order, unpack_tile_order
    from tests.helpers.culling_scenes import culling_edge_scene_2d

    sc = culling_edge_scene_2d(C=2, W=77, H=53, n=300, seed=11, device="cuda")
    offsets, fids = bin_tiles(sc["means2d"], sc["radii"], sc["depths"], sc["width"], sc["height"])
    order = tile_order(offsets, "longest_first", sc["width"], sc["height"])
    assert not torch.equal(unpack_tile_order(order, sc["width"], sc["height"]).cpu(), torch.arange(order.numel()))
    _assert_same_run(_edge_scene_run(sc, offsets, fids, schedule, True, seed=12, tile_order=order),
                     _edge_scene_run(sc, offsets, fids, schedule, True, seed=12))


# ---------------------------------------------------------------------------------------------
# fused_render_loss
# ---------------------------------------------------------------------------------------------

LOSS_CASES = [
    # name, N, C, W, H, background, sh, absgrad, kwargs, cluster, opacity
    ("basic", 300, 1, 64, 48, False, 3, False, {}, None, None),
    ("multiview_odd_bg_absgrad", 400, 3, 77, 45, True, 3, True, {}, None, None),
    ("streaming_small_capacity", 500, 2, 70, 50, True, 3, True, {"capacity": 64}, None, None),
    ("two_phase_fallback", 400, 2, 77, 45, True, 3, True, {"schedule": "two_launch"}, None, None),
    ("empty_tiles", 200, 2, 96, 64, True, 2, False, {}, (20.0, 15.0, 0.02), None),
    ("over_capacity_auto", 4000, 1, 48, 40, True, 1, True, {}, (24.0, 20.0, 0.004), 0.01),
    ("rgb_colors_ssim_lambda", 300, 2, 33, 20, True, None, False, {"ssim_lambda": 0.6}, None, None),
    ("tall_row_major_claims", 300, 2, 40, 90, True, 3, True, {"schedule": "one_launch"}, None, None),
    ("two_launch_mode", 300, 1, 64, 48, False, 3, False, {"schedule": "two_launch"}, None, None),
]


@pytest.mark.parametrize("fast_exp", [False, True], ids=["expf", "fast_exp"])
@pytest.mark.parametrize("schedule,bwd_pixels", [("case", 1), ("split", 1), ("split", 2)],
                         ids=["case", "split", "split_bwd2px"])
@pytest.mark.parametrize("projection", PROJECTIONS)
@pytest.mark.parametrize("case", LOSS_CASES, ids=[c[0] for c in LOSS_CASES])
def test_fused_render_loss_matches_reference(case, projection, schedule, bwd_pixels, fast_exp):
    """``schedule="case"``: the case's own mode (one launch unless it says otherwise);
    ``"split"``: the same scene through render_fwd -> loss_grad -> render_bwd (the case's capacity /
    two-phase knobs do not apply to it)."""
    from bytesplat_ns.raster.fused import RENDER_BATCH, fused_render_loss, splatfacto_loss_torch
    from bytesplat_ns.raster.reference import rasterize_reference

    name, N, C, W, H, use_bg, sh, absgrad, kw, cluster, opacity = case
    kw = {"schedule": "one_launch", **kw}  # the single-kernel schedule unless the case says otherwise
    if schedule == "split":
        kw = {k: v for k, v in kw.items() if k != "capacity"}
        kw["schedule"] = "split"
    lam = kw.get("ssim_lambda", 0.2)
    scene = make_scene(N, C, W, H, seed=zlib.crc32(name.encode()) % 1000 + 1, sh_degree=sh, cluster=cluster, opacity=opacity)
    g = torch.Generator(device="cuda").manual_seed(5)
    gt = torch.rand(C, H, W, 3, device="cuda", generator=g)
    gt = torch.nn.functional.avg_pool2d(gt.permute(0, 3, 1, 2), 3, 1, 1).permute(0, 2, 3, 1).contiguous()
    bg = torch.rand(C, 3, device="cuda", generator=g) if use_bg else None
    scale = 2.5  # split: render_bwd scales dL/d render by grad_output; the fused schedules their stashed gradients

    pf = _params(scene)
    loss_f, rgb_f, alpha_f, inf = fused_render_loss(
        *_args(pf, scene), gt, bg, sh_degree=sh, absgrad=absgrad,
        options=FusedOptions(schedule=kw.pop("schedule"), projection=projection, fast_exp=fast_exp,
                             bwd_pixels_per_thread=bwd_pixels), **kw)
    inf["means2d"].retain_grad()
    (scale * loss_f).backward()

    pr = _params(scene)
    render_r, alpha_r, inr = rasterize_reference(*_args(pr, scene), sh_degree=sh, backgrounds=bg, absgrad=absgrad)
    inr["means2d"].retain_grad()
    loss_r = splatfacto_loss_torch(render_r, alpha_r, gt, bg, ssim_lambda=lam)
    (scale * loss_r).backward()

    assert abs(loss_f.item() - loss_r.item()) <= IMG_TOL * abs(loss_r.item()), (loss_f.item(), loss_r.item())
    assert rel_err(rgb_f, render_r.clamp(0, 1)) <= IMG_TOL, f"rgb rel err {rel_err(rgb_f, render_r.clamp(0, 1)):.3g}"
    assert rel_err(alpha_f, alpha_r) <= IMG_TOL
    assert not rgb_f.requires_grad
    extra = [("means2d.grad", inf["means2d"].grad, inr["means2d"].grad)]
    if absgrad:
        extra.append(("means2d.absgrad", inf["means2d"].absgrad, inr["means2d"].absgrad))
    _compare_grads(pf, pr, extra)

    k = inf["kernel"]
    assert k["fast_exp"] is fast_exp and k["bwd_pixels_per_thread"] == bwd_pixels
    if schedule == "split":
        assert k["schedule"] == "split" and not k["two_phase"] and k["capacity"] == RENDER_BATCH, k
        if name == "over_capacity_auto":
            assert _max_tile_count(inf) > RENDER_BATCH  # render_bwd walks several batches per tile
    elif name in ("two_phase_fallback", "two_launch_mode"):
        assert k["two_phase"]
    else:
        assert not k["two_phase"], k
    if schedule == "case" and name in ("streaming_small_capacity", "over_capacity_auto"):
        assert _max_tile_count(inf) > k["capacity"], (_max_tile_count(inf), k)
    if name == "empty_tiles":
        off = inf["isect_offsets"].long()
        assert int(((off[1:] - off[:-1]) == 0).sum()) > 0


@pytest.mark.parametrize("C,W,H", [(1, 64, 48), (2, 77, 45), (1, 11, 11), (1, 130, 97)])
def test_loss_grad_kernel_matches_autograd(C, W, H):
    """cuda/loss_grad.cu on its own: dL/d render (through torch.clamp, with values exactly 0 and 1
    and outside [0, 1]), the clamped rgb and the partials' loss, against pytorch_msssim autograd.
    The sizes cut its 32x32 regions every way: partial in x, in y, both, a single region smaller
    than the window's halo, and regions with neighbours on every side (130x97)."""
    from bytesplat_ns.raster._build import load_extension
    from bytesplat_ns.raster._wrapper import _torch_clamp_inclusive, ssim_window
    from bytesplat_ns.raster.loss import SSIM_WIN_SIZE, splatfacto_loss_torch

    g = torch.Generator(device="cuda").manual_seed(C * 1000 + W)
    render = torch.rand(C, H, W, 3, device="cuda", generator=g) * 1.4 - 0.2
    flat = render.view(-1)
    flat[::17] = 0.0
    flat[5::19] = 1.0
    gt = torch.rand(C, H, W, 3, device="cuda", generator=g)
    lam = 0.2
    v, rgb, partials = load_extension().loss_grad(render, gt, lam, ssim_window(), _torch_clamp_inclusive())
    x = render.clone().requires_grad_(True)
    loss = splatfacto_loss_torch(x, None, gt, None, lam)
    (ref,) = torch.autograd.grad(loss, x)
    assert torch.equal(rgb, render.clamp(0, 1))
    assert rel_err(v, ref) <= GRAD_TOL, f"dL/drender rel err {rel_err(v, ref):.3g}"
    at_edges = (render == 0) | (render == 1)
    assert torch.equal(v[at_edges] == 0, ref[at_edges] == 0)  # torch.clamp's rule at the edges
    p = partials.double().sum(0)
    l1 = p[0] / (C * H * W * 3)
    ssim = p[1] / (C * 3 * (H - SSIM_WIN_SIZE + 1) * (W - SSIM_WIN_SIZE + 1))
    val = (1 - lam) * l1 + lam * (1 - ssim)
    assert abs(val.item() - loss.item()) <= IMG_TOL * abs(loss.item())


def test_fused_loss_capacity_from_device():
    from bytesplat_ns.raster._build import load_extension

    ext = load_extension()
    cap2 = ext.fused_capacity(2)
    cap1 = ext.fused_capacity(1)
    props = torch.cuda.get_device_properties(0)
    assert 32 <= cap2 < cap1
    assert cap1 * 40 < getattr(props, "shared_memory_per_block_optin", 1 << 30)


# ---------------------------------------------------------------------------------------------
# Backward warp reduction: butterfly (default) vs the original per-component shuffles
# ---------------------------------------------------------------------------------------------

REDUCE_AB_TOL = 5e-5  # same sums in another fp32 order (and the block atomics are unordered anyway); a
# lane/component mix-up shows as O(1e-2..1)


@pytest.mark.parametrize("absgrad", [True, False])
def test_bwd_reduce_butterfly_matches_shuffle(absgrad):
    """FusedOptions.bwd_reduce butterfly|shuffle: both backward kernels (render_bwd behind
    rasterize_fused, and fused_loss one-launch with a small capacity so tiles stream) give the same
    2D and parameter gradients up to summation order, on a scene with > kChunk Gaussians per tile
    (several chunks) and partially valid warps. The butterfly run is also held against the
    reference (the shuffle path is covered by the existing tests' history)."""
    from bytesplat_ns.raster.fused import fused_render_loss, rasterize_fused
    from bytesplat_ns.raster.reference import rasterize_reference

    C, W, H, sh = 2, 70, 50, 2
    scene = make_scene(900, C, W, H, seed=321, sh_degree=sh, cluster=(35.0, 25.0, 0.03), opacity=0.03)
    g = torch.Generator(device="cuda").manual_seed(13)
    bg = torch.rand(C, 3, device="cuda", generator=g)
    wr = torch.randn(C, H, W, 3, device="cuda", generator=g)
    wa = torch.randn(C, H, W, 1, device="cuda", generator=g)
    gt = torch.rand(C, H, W, 3, device="cuda", generator=g)

    def raster(reduce="butterfly", fn=None):
        p = _params(scene)
        kw = dict(sh_degree=sh, backgrounds=bg, absgrad=absgrad)
        if fn is None:
            options = FusedOptions(projection="torch", bwd_reduce=reduce)
            render, alpha, info = rasterize_fused(*_args(p, scene), options=options, **kw)
        else:
            render, alpha, info = fn(*_args(p, scene), **kw)
        info["means2d"].retain_grad()
        ((render * wr).sum() + (alpha * wa).sum()).backward()
        return p, info

    def loss(reduce):
        p = _params(scene)
        options = FusedOptions(schedule="one_launch", projection="torch", bwd_reduce=reduce)
        l, _, _, info = fused_render_loss(*_args(p, scene), gt, bg, sh_degree=sh, absgrad=absgrad,
                                          capacity=64, options=options)
        info["means2d"].retain_grad()
        l.backward()
        return p, info

    for fn in (raster, loss):
        pb, ib = fn("butterfly")
        ps, is_ = fn("shuffle")
        if fn is loss:
            assert ib["kernel"]["bwd_reduce"] == "butterfly" and is_["kernel"]["bwd_reduce"] == "shuffle"
            assert _max_tile_count(ib) > ib["kernel"]["capacity"]
        assert _max_tile_count(ib) > 32  # several kChunk chunks per tile
        pairs = [("means2d.grad", ib["means2d"].grad, is_["means2d"].grad)]
        if absgrad:
            pairs.append(("means2d.absgrad", ib["means2d"].absgrad, is_["means2d"].absgrad))
        pairs += [(k, pb[k].grad, ps[k].grad) for k in pb]
        for name, a, b in pairs:
            assert b.abs().max() > 0, name
            e = rel_err(a, b)
            assert e <= REDUCE_AB_TOL, f"{fn.__name__} {name}: butterfly vs shuffle rel err {e:.3g}"
    pb, ib = raster()
    pr, ir = raster(fn=rasterize_reference)
    extra = [("means2d.grad", ib["means2d"].grad, ir["means2d"].grad)]
    if absgrad:
        extra.append(("means2d.absgrad", ib["means2d"].absgrad, ir["means2d"].absgrad))
    _compare_grads(pb, pr, extra)


# ---------------------------------------------------------------------------------------------
# The pruning score gathered in the backward kernels (docs/pruning.md, "Contribution score")
# ---------------------------------------------------------------------------------------------

# fp32 on both sides: the kernel recovers T by division on the way back (relative error grows with
# the number of composited Gaussians behind, ~1e-5 for hundreds), the torch definition multiplies
# forward; scores are in [0, 0.999]
CONTRIB_ATOL = 1e-5
CONTRIB_RTOL = 1e-4
CONTRIB_SCHEDULES = ("one_launch", "two_launch", "split")


def _score_errors(got, info):
    """|kernel - contribution_scores_2d| and its tolerance, [C,N], from the same projected inputs."""
    from bytesplat_ns.pruning import contribution_scores_2d

    want = contribution_scores_2d(info["means2d"], info["conics"], info["opacities"], info["radii"], info["depths"],
                                  int(info["width"]), int(info["height"]))
    assert got.shape == want.shape and got.dtype == torch.float32 and got.device == want.device
    return (got - want).abs(), CONTRIB_ATOL + CONTRIB_RTOL * want.abs(), want


@pytest.mark.parametrize("schedule", CONTRIB_SCHEDULES)
@pytest.mark.parametrize("case", LOSS_CASES, ids=[c[0] for c in LOSS_CASES])
def test_contribution_matches_torch_definition(case, schedule):
    """fused_render_loss(contribution=True) in every schedule on the loss cases (several views,
    empty tiles, a small capacity and over-capacity tiles: the streaming path of the fused kernel,
    several render batches per tile for split): info["contribution"] equals
    pruning.contribution_scores_2d on the same projected Gaussians, and the loss and gradients
    are those of the same step without it."""
    from bytesplat_ns.raster.fused import fused_render_loss

    name, N, C, W, H, use_bg, sh, absgrad, kw, cluster, opacity = case
    kw = {k: v for k, v in kw.items() if k != "schedule"}
    if schedule == "split":
        kw.pop("capacity", None)
    scene = make_scene(N, C, W, H, seed=zlib.crc32(name.encode()) % 1000 + 1, sh_degree=sh, cluster=cluster,
                       opacity=opacity)
    g = torch.Generator(device="cuda").manual_seed(5)
    gt = torch.rand(C, H, W, 3, device="cuda", generator=g)
    bg = torch.rand(C, 3, device="cuda", generator=g) if use_bg else None
    runs = {}
    for contribution in (False, True):
        p = _params(scene)
        loss, _, _, info = fused_render_loss(*_args(p, scene), gt, bg, sh_degree=sh, absgrad=absgrad,
                                             options=FusedOptions(schedule=schedule, projection="torch"),
                                             contribution=contribution, **kw)
        info["means2d"].retain_grad()
        loss.backward()
        runs[contribution] = (loss, p, info)
    (loss0, p0, info0), (loss1, p1, info1) = runs[False], runs[True]
    assert "contribution" not in info0 and info1["kernel"]["contribution"]
    assert info1["kernel"]["schedule"] == schedule
    if schedule != "split" and name in ("streaming_small_capacity", "over_capacity_auto"):
        assert _max_tile_count(info1) > info1["kernel"]["capacity"]  # the streaming path ran
    # the score does not touch the step (gradient atomics are unordered: compare up to fp32 order)
    assert abs(loss1.item() - loss0.item()) <= IMG_TOL * abs(loss0.item())
    _compare_grads(p1, p0, [("means2d.grad", info1["means2d"].grad, info0["means2d"].grad)])
    got = info1["contribution"]
    err, tol, want = _score_errors(got, info1)
    assert bool((err <= tol).all()), f"max err {err.max().item():.3g} at score {want.flatten()[err.argmax()].item():.3g}"
    assert int((want > 0).sum()) >= 10  # something was scored
    assert bool((got[info1["radii"] == 0] == 0).all())  # culled: never in a tile list


@pytest.mark.parametrize("schedule,capacity", [("one_launch", None), ("one_launch", 32), ("two_launch", 32),
                                               ("split", None)])
def test_contribution_counts_the_stopping_gaussian(schedule, capacity):
    """The stop rule, in every schedule and through the streaming path (capacity 32 with up to
    ~430 Gaussians per tile): tests/helpers/contribution_scenes.py puts small opaque Gaussians behind
    walls that leave T ~ 3e-4, so each one stops the pixels at its center, and its score is the
    weight it would have had there (about 2.7e-4; composited at its rim it gets at most ~9e-5).
    Two views, 2D inputs straight into _FusedLoss with the fused binning."""
    from bytesplat_ns.raster.fused import _FusedLoss, bin_tiles
    from tests.helpers.contribution_scenes import stop_scene_2d

    sc = stop_scene_2d(C=2, crowd=400, device="cuda")
    C, N = sc["radii"].shape
    W, H = sc["width"], sc["height"]
    offsets, fids = bin_tiles(sc["means2d"], sc["radii"], sc["depths"], W, H)
    gt = torch.rand(C, H, W, 3, device="cuda", generator=torch.Generator(device="cuda").manual_seed(3))
    bg = torch.rand(C, 3, device="cuda", generator=torch.Generator(device="cuda").manual_seed(4))
    ins = [sc[k].clone().requires_grad_(True) for k in ("means2d", "conics", "colors", "opacities")]
    loss, _, _, _, got = _FusedLoss.apply(*ins, bg, gt, offsets, fids, W, H, 0.2, True, capacity, 2, schedule, True,
                                          True, True)
    loss.backward()
    assert torch.isfinite(loss) and got.shape == (C, N)
    assert _FusedLoss.last_kernel_info["schedule"] == schedule and _FusedLoss.last_kernel_info["contribution"]
    if capacity is not None:
        assert int((offsets[1:] - offsets[:-1]).max()) > 4 * capacity  # several batches re-streamed
    info = dict(means2d=sc["means2d"], conics=sc["conics"], opacities=sc["opacities"], radii=sc["radii"],
                depths=sc["depths"], width=W, height=H)
    err, tol, want = _score_errors(got, info)
    assert bool((err <= tol).all()), f"max err {err.max().item():.3g}"
    back = got.gather(1, sc["back"].long())
    assert bool((back > 2.0e-4).all()) and bool((back < 3.0e-4).all()), back  # the stopped pixels' weight
    assert int(((want == 0) & (sc["radii"] > 0)).sum()) > 0  # and Gaussians wholly behind stopped pixels


@pytest.mark.parametrize("mode", CONTRIB_SCHEDULES)
def test_contribution_trained_regime(mode):
    """The trained-scene regime (100k Gaussians at 256x192, most opacities near 1 so ~60% of the
    pixels stop, thousands per tile: over capacity) with the default capacity. Both sides decide
    alpha >= 1/255 and T <= 1e-4 in fp32 from differently rounded sigma / T, so a pixel at a
    threshold could flip: allowed for at most 1e-4 of the visible entries, each off by at most one
    8-bit level (what a flip can move a score by)."""
    from bytesplat_ns.raster.fused import fused_render_loss

    scene = trained_regime_scene()
    W, H = scene["width"], scene["height"]
    gt = torch.rand(1, H, W, 3, device="cuda", generator=torch.Generator(device="cuda").manual_seed(9))
    p = _params(scene)
    loss, _, alpha, info = fused_render_loss(*_args(p, scene), gt, sh_degree=3, absgrad=True,
                                             options=FusedOptions(schedule=mode, projection="torch"), contribution=True)
    loss.backward()
    assert float(alpha.gt(0.999).float().mean()) > 0.3, "regime: saturated pixels"
    assert _max_tile_count(info) > info["kernel"]["capacity"], "regime: over-capacity tiles (batches for split)"
    err, tol, want = _score_errors(info["contribution"], info)
    visible = int((info["radii"] > 0).sum())
    assert int((err > tol).sum()) <= max(1, visible // 10000), f"{int((err > tol).sum())} of {visible}"
    assert float(err.max()) <= 1.0 / 255.0
    # most entries are hidden behind stopped pixels (score 0; ~83k of 96k visible), a few hundred score > 0.5
    assert int((want > 0.5).sum()) > 100 and int(((want == 0) & (info["radii"] > 0)).sum()) > 10000


# ---------------------------------------------------------------------------------------------
# RGB+ED (eval / viewer path) and the trained-scene regime
# ---------------------------------------------------------------------------------------------


def norm_err(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.detach().double(), b.detach().double()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def _gsplat_available() -> bool:
    try:
        import gsplat.cuda._backend as backend  # JIT-builds on first use

        return backend._C is not None
    except Exception:  # noqa: BLE001
        return False


needs_gsplat = pytest.mark.skipif(not torch.cuda.is_available() or not _gsplat_available(),
                                  reason="needs a CUDA GPU and gsplat's CUDA extension")


@pytest.mark.parametrize("use_bg", [False, True])
def test_rasterize_fused_rgb_ed_matches_reference(use_bg):
    """RGB+ED: rgb, alpha and expected depth (and gradients through all four channels) equal the
    reference's one 4-channel pass. absgrad: the RGB pass only (documented), so not compared."""
    from bytesplat_ns.raster.fused import rasterize_fused
    from bytesplat_ns.raster.reference import rasterize_reference

    C, W, H = 2, 77, 45
    scene = make_scene(400, C, W, H, seed=21, sh_degree=3)
    bg = torch.rand(C, 3, device="cuda") if use_bg else None
    g = torch.Generator(device="cuda").manual_seed(8)
    wr = torch.randn(C, H, W, 4, device="cuda", generator=g)
    wa = torch.randn(C, H, W, 1, device="cuda", generator=g)
    with torch.no_grad():
        _, a0, _ = rasterize_reference(*_args(scene, scene), sh_degree=3)
    # depth = sum(w z) / alpha: keep its weight off nearly empty pixels (1/alpha^2 amplification)
    wr[..., 3] *= (a0[..., 0] > 0.05).float()
    outs = {}
    for backend in ("fused", "reference"):
        p = _params(scene)
        kw = dict(sh_degree=3, backgrounds=bg, render_mode="RGB+ED", absgrad=True)
        fn = rasterize_fused if backend == "fused" else rasterize_reference
        render, alpha, info = fn(*_args(p, scene), **kw, **({"options": FusedOptions(projection="torch")} if backend == "fused" else {}))
        info["means2d"].retain_grad()
        ((render * wr).sum() + (alpha * wa).sum()).backward()
        outs[backend] = (render, alpha, info, p)
    rf, af, inf, pf = outs["fused"]
    rr, ar, inr, pr = outs["reference"]
    assert rf.shape == rr.shape == (C, H, W, 4)
    assert rel_err(rf[..., :3], rr[..., :3]) <= IMG_TOL, "rgb"
    assert rel_err(af, ar) <= IMG_TOL, "alpha"
    covered = ar[..., 0] > 0.05
    assert rel_err(rf[..., 3][covered], rr[..., 3][covered]) <= 1e-4, "depth"
    # the RGB part does not depend on whether depth was requested
    with torch.no_grad():
        r3, a3, _ = rasterize_fused(*_args(scene, scene), sh_degree=3, backgrounds=bg,
                                    options=FusedOptions(projection="torch"))
    assert torch.equal(r3, rf[..., :3].detach()) and torch.equal(a3, af.detach())
    _compare_grads(pf, pr, [("means2d.grad", inf["means2d"].grad, inr["means2d"].grad)])


@needs_gsplat
def test_rasterize_fused_rgb_ed_matches_gsplat_eval():
    """What eval/ns-eval/the viewer run: no grad, no backgrounds, RGB+ED, gsplat's projection,
    against gsplat's own rasterization (fast-math alpha cut-off flips tolerated)."""
    from gsplat.rendering import rasterization

    from bytesplat_ns.raster.fused import rasterize_fused

    scene = make_scene(3000, 1, 256, 192, seed=22, sh_degree=3, scale=0.05)
    with torch.no_grad():
        rf, af, inf = rasterize_fused(*_args(scene, scene), sh_degree=2, render_mode="RGB+ED",
                                      options=FusedOptions(projection="gsplat"))
        rg, ag, ing = rasterization(*_args(scene, scene), sh_degree=2, render_mode="RGB+ED", packed=False)
    assert torch.equal(inf["radii"], ing["radii"])
    diff = (rf[..., :3] - rg[..., :3]).abs()
    assert float((diff > 1e-5).float().mean()) <= 5e-3 and float(diff.max()) <= 4e-3
    assert float((af - ag).abs().max()) <= 4e-3
    covered = ag[..., 0] > 1e-2
    assert norm_err(rf[..., 3][covered], rg[..., 3][covered]) <= 1e-3


def trained_regime_scene(N=100000, W=256, H=192, seed=31):
    """What a trained scene looks like to the rasterizer, unlike the random test scenes: most
    opacities near 1 (alpha clamped at 0.999, pixels saturating at T <= 1e-4), small Gaussians,
    thousands per tile (over the on-chip capacity), some behind the camera or off screen (gsplat's
    projection leaves their 2D entries uninitialised)."""
    scene = make_scene(N, 1, W, H, seed=seed, sh_degree=3, scale=0.05)
    g = torch.Generator().manual_seed(seed + 1)
    u = torch.rand(N, generator=g)
    op = torch.where(u < 0.6, 0.995 + 0.0049 * torch.rand(N, generator=g), torch.sigmoid(torch.randn(N, generator=g) * 2))
    scene["opacities"] = op.cuda()
    means = scene["means"].clone()
    means[: N // 50, 2] = -3.0  # behind the camera
    means[N // 50: N // 25, 0] += 50.0  # off screen
    scene["means"] = means
    return scene


def trained_regime_case():
    """The trained-regime scene with a smooth random ground truth and a background (seed 9)."""
    scene = trained_regime_scene()
    W, H = scene["width"], scene["height"]
    g = torch.Generator(device="cuda").manual_seed(9)
    gt = torch.rand(1, H, W, 3, device="cuda", generator=g)
    gt = torch.nn.functional.avg_pool2d(gt.permute(0, 3, 1, 2), 5, 1, 2).permute(0, 2, 3, 1).contiguous()
    return scene, gt, torch.rand(1, 3, device="cuda", generator=g)


@needs_gsplat
@pytest.mark.parametrize("fast_exp", [False, True], ids=["expf", "fast_exp"])
@pytest.mark.parametrize("mode,bwd_pixels", [("two_launch", 1), ("one_launch", 1), ("split", 1), ("split", 2)],
                         ids=["two_launch", "one_launch", "split", "split_bwd2px"])
def test_fused_loss_trained_regime_matches_gsplat(mode, bwd_pixels, fast_exp):
    """fused_render_loss (gsplat projection, as training uses it) against the unfused training
    path: gsplat's rasterization + clamp(render + (1-alpha) bg) + L1 + pytorch_msssim, in the regime
    of a trained scene. Loss, 2D gradients (grad and absgrad: DefaultStrategy's input), radii and
    parameter gradients."""
    from gsplat.rendering import rasterization

    from bytesplat_ns.raster.fused import fused_render_loss, splatfacto_loss_torch

    scene, gt, bg = trained_regime_case()
    W, H = scene["width"], scene["height"]

    pf = _params(scene)
    loss_f, rgb_f, alpha_f, inf = fused_render_loss(*_args(pf, scene), gt, bg, sh_degree=3, absgrad=True,
                                                    options=FusedOptions(schedule=mode, projection="gsplat",
                                                                         fast_exp=fast_exp,
                                                                         bwd_pixels_per_thread=bwd_pixels))
    inf["means2d"].retain_grad()
    loss_f.backward()

    pg = _params(scene)
    render, alpha, ing = rasterization(*_args(pg, scene), sh_degree=3, packed=False, absgrad=True)
    ing["means2d"].retain_grad()
    loss_g = splatfacto_loss_torch(render, alpha, gt, bg, render_has_bg=False)
    loss_g.backward()

    assert torch.equal(inf["radii"], ing["radii"])
    assert int((inf["radii"] == 0).sum()) >= scene["means"].shape[0] // 25  # culled entries present
    alpha_g = alpha.detach()
    # pixels that stopped early (T would have dropped to 1e-4; about 60% of this scene)
    assert float(alpha_g.gt(0.999).float().mean()) > 0.3, "regime: saturated pixels"
    assert _max_tile_count(inf) > inf["kernel"]["capacity"], "regime: over-capacity tiles"
    assert abs(loss_f.item() - loss_g.item()) <= 1e-4 * loss_g.item()
    rgb_g = torch.clamp(render + (1 - alpha) * bg[:, None, None, :], 0, 1).detach()
    # gsplat's fast-math exp flips a few Gaussians across the 1/255 cut-off (and a few pixels across
    # the T <= 1e-4 stop): bounded per pixel, rare overall
    assert float((rgb_f - rgb_g).abs().max()) <= 1e-2 and float((rgb_f - rgb_g).abs().mean()) <= 1e-5
    assert float((alpha_f - alpha_g).abs().max()) <= 1e-2
    vis = ing["radii"] > 0
    for name, a, b in (("means2d.grad", inf["means2d"].grad, ing["means2d"].grad),
                       ("means2d.absgrad", inf["means2d"].absgrad, ing["means2d"].absgrad)):
        assert norm_err(a[vis], b[vis]) <= 5e-3, f"{name}: {norm_err(a[vis], b[vis]):.3g}"
    # DefaultStrategy's statistic: per-Gaussian |absgrad| in normalised screen units
    s = torch.tensor([W / 2.0, H / 2.0], device="cuda")
    nf, ng = (inf["means2d"].absgrad * s).norm(dim=-1), (ing["means2d"].absgrad * s).norm(dim=-1)
    assert norm_err(nf[vis], ng[vis]) <= 5e-3
    for k in pf:
        assert norm_err(pf[k].grad, pg[k].grad) <= 5e-3, f"grad {k}: {norm_err(pf[k].grad, pg[k].grad):.3g}"


def near_camera_case(floaters=48, seed=41):
    """The trained-regime scene plus ``floaters`` Gaussians close to the camera (depth 0.02-0.6: some
    straddle the near plane, some sit off screen with their footprint inside), large (scales
    0.03-0.5), of any opacity and with strong view-dependent colour: the kind that spoils a held-out
    view late in training. Returns the case and the floaters' rows."""
    scene, gt, bg = trained_regime_case()
    W, H = scene["width"], scene["height"]
    g = torch.Generator().manual_seed(seed)
    n = floaters
    z = 0.02 + 0.58 * torch.rand(n, generator=g)
    f = float(scene["Ks"][0, 0, 0])
    x = (torch.rand(n, generator=g) * 2.6 - 1.3) * z * W / (2 * f)  # some centres off screen
    y = (torch.rand(n, generator=g) * 2.6 - 1.3) * z * H / (2 * f)
    extra = dict(
        means=torch.stack([x, y, z], -1),
        quats=torch.randn(n, 4, generator=g),
        scales=torch.exp(torch.rand(n, 3, generator=g) * math.log(0.5 / 0.03) + math.log(0.03)),
        opacities=0.02 + 0.96 * torch.rand(n, generator=g),
        colors=torch.randn(n, 16, 3, generator=g) * 0.6,
    )
    rows = torch.arange(scene["means"].shape[0], scene["means"].shape[0] + n, device="cuda")
    for key, value in extra.items():
        scene[key] = torch.cat([scene[key], value.to(scene[key].device, scene[key].dtype)])
    return scene, gt, bg, rows


@needs_gsplat
@pytest.mark.parametrize("bwd_pixels", [1, 2], ids=["bwd1px", "bwd2px"])
@pytest.mark.parametrize("fast_exp", [False, True], ids=["expf", "fast_exp"])
def test_fused_training_step_near_the_camera_matches_gsplat_row_by_row(fast_exp, bwd_pixels):
    """The training step's defaults (FusedRasterConfig: split schedule, opacity-aware tiles, warp
    culling, gsplat's projection), and the same with the falloff as 2^q and with two pixels per thread
    in the backward, against gsplat's rasterization + splatfacto's loss, judged per
    Gaussian for those near the camera: each such row's gradients within 2% of gsplat's (the
    aggregate checks above would hide a few wrong rows among 100k)."""
    from gsplat.rendering import rasterization

    from bytesplat_ns.raster.fused import fused_render_loss, splatfacto_loss_torch
    from bytesplat_ns.raster.options import FusedRasterConfig

    scene, gt, bg, rows = near_camera_case()
    pf = _params(scene)
    loss_f, rgb_f, _, inf = fused_render_loss(*_args(pf, scene), gt, bg, sh_degree=3, absgrad=True,
                                              options=FusedRasterConfig(fast_exp=fast_exp,
                                                                        bwd_pixels_per_thread=bwd_pixels).options())
    loss_f.backward()
    pg = _params(scene)
    render, alpha, ing = rasterization(*_args(pg, scene), sh_degree=3, packed=False, absgrad=True)
    loss_g = splatfacto_loss_torch(render, alpha, gt, bg, render_has_bg=False)
    loss_g.backward()

    assert torch.equal(inf["radii"], ing["radii"])
    shown = rows[(ing["radii"][0, rows] > 0).all(dim=-1) if ing["radii"].dim() == 3 else ing["radii"][0, rows] > 0]
    assert shown.numel() >= len(rows) // 3, "regime: floaters on screen"
    assert abs(loss_f.item() - loss_g.item()) <= 1e-4 * loss_g.item()
    rgb_g = torch.clamp(render + (1 - alpha) * bg[:, None, None, :], 0, 1).detach()
    assert float((rgb_f - rgb_g).abs().max()) <= 1e-2 and float((rgb_f - rgb_g).abs().mean()) <= 1e-4
    for key in pf:
        # opacities are [N]: one column per row
        a = pf[key].grad[shown].reshape(len(shown), -1).double()
        b = pg[key].grad[shown].reshape(len(shown), -1).double()
        # rows with a gradient under 0.1% of the largest are held to that absolute floor (float noise)
        scale = b.norm(dim=1).clamp_min(1e-3 * float(b.norm(dim=1).max()) + 1e-30)
        worst = float(((a - b).norm(dim=1) / scale).max())
        assert worst <= 2e-2, f"grad {key}: a near-camera Gaussian's row differs from gsplat's by {worst:.3g}"


# ---------------------------------------------------------------------------------------------
# ByteSplatModel: the fused training step against the gsplat one (same state, same batch)
# ---------------------------------------------------------------------------------------------


SPLIT_VS_TWO_LAUNCH_TOL = 1e-5


def test_split_matches_two_launch_trained_regime():
    """The split schedule against two launches of the fused kernel on the trained-regime scene
    (saturating pixels, thousands of Gaussians per tile): the same compositing, the same
    loss_grad_tile, the same backward formulas; only the backward's batching (256 vs the on-chip
    capacity) and the unordered gradient atomics differ. Loss, rgb, alpha: rel <= 1e-5; 2D and
    parameter gradients, absgrad: norm-wise rel <= 1e-5."""
    from bytesplat_ns.raster.fused import fused_render_loss

    scene, gt, bg = trained_regime_case()
    projection = "gsplat" if _gsplat_available() else "torch"
    runs = {}
    for mode in ("two_launch", "split"):
        p = _params(scene)
        loss, rgb, alpha, info = fused_render_loss(*_args(p, scene), gt, bg, sh_degree=3, absgrad=True,
                                                   options=FusedOptions(schedule=mode, projection=projection))
        info["means2d"].retain_grad()
        loss.backward()
        runs[mode] = (loss, rgb, alpha, info, p)
    lt, rt, at, it, pt = runs["two_launch"]
    ls, rs, as_, is_, ps = runs["split"]
    assert is_["kernel"]["schedule"] == "split" and it["kernel"]["two_phase"]
    assert _max_tile_count(it) > it["kernel"]["capacity"], "regime: over-capacity tiles"
    assert abs(ls.item() - lt.item()) <= SPLIT_VS_TWO_LAUNCH_TOL * abs(lt.item()), (ls.item(), lt.item())
    assert rel_err(rs, rt) <= SPLIT_VS_TWO_LAUNCH_TOL and rel_err(as_, at) <= SPLIT_VS_TWO_LAUNCH_TOL
    vis = it["radii"] > 0
    pairs = [("means2d.grad", is_["means2d"].grad[vis], it["means2d"].grad[vis]),
             ("means2d.absgrad", is_["means2d"].absgrad[vis], it["means2d"].absgrad[vis])]
    pairs += [(f"grad {k}", ps[k].grad, pt[k].grad) for k in pt]
    for name, a, b in pairs:
        e = norm_err(a, b)
        assert e <= SPLIT_VS_TWO_LAUNCH_TOL, f"{name}: split vs two_launch {e:.3g}"


def _compare_model_steps(a, b, tol=5e-3):
    assert abs(a["loss"] - b["loss"]) <= 1e-4 * abs(b["loss"]), (a["loss"], b["loss"])
    assert float((a["rgb"] - b["rgb"]).abs().max()) <= 4e-3
    for n in b["grads"]:
        assert norm_err(a["grads"][n], b["grads"][n]) <= tol, f"grad {n}: {norm_err(a['grads'][n], b['grads'][n]):.3g}"
        big = b["grads"][n].abs() > 1e-2 * b["grads"][n].abs().max()
        agree = torch.isclose(a["update"][n][big], b["update"][n][big], rtol=1e-2, atol=1e-7).float().mean()
        assert float(agree) >= 0.999, f"Adam update {n}: {float(agree):.4f} agree"
    for k in ("grad2d", "count", "radii"):
        assert norm_err(a["state"][k], b["state"][k]) <= tol, f"strategy {k}: {norm_err(a['state'][k], b['state'][k]):.3g}"
    assert torch.equal(a["state"]["count"], b["state"]["count"])


@needs_gsplat
@pytest.mark.parametrize("absgrad", [True, False])
def test_model_fused_training_step_matches_gsplat(absgrad):
    """One nerfstudio iteration through ByteSplatModel: fused path (get_outputs -> fused_pending ->
    get_metrics_dict -> _FusedLoss -> DefaultStrategy) vs the gsplat path, from the same Gaussians:
    same loss, parameter gradients, Adam update and strategy statistics (grad2d, count, radii)."""
    from tests.helpers.model_steps import anisotropic, make_camera, make_model, model_train_step, seed_cloud, target_image

    seed_points = seed_cloud(2000)
    image, bg = target_image(device="cuda"), torch.tensor([0.3, 0.6, 0.2], device="cuda")
    runs, params = {}, None
    for backend in ("fused", "gsplat"):
        model = make_model(backend, seed_points, device="cuda", use_absgrad=absgrad)
        if params is None:
            params = anisotropic(model)
        for n, p in model.gauss_params.items():
            p.data.copy_(params[n].cuda())
        runs[backend] = model_train_step(model, make_camera(device="cuda"), image, step=5, background=bg)
    _compare_model_steps(runs["fused"], runs["gsplat"])


@needs_gsplat
def test_model_fused_step_matches_gsplat_after_densification():
    """The same from a state reached by training with gsplat (densified, running statistics)."""
    from tests.helpers.model_steps import step_at_trained_state

    runs = step_at_trained_state("cuda", "gsplat", ["fused", "gsplat"])
    _compare_model_steps(runs["fused"], runs["gsplat"])


@needs_gsplat
def test_model_fused_eval_outputs_match_gsplat():
    """Eval: get_outputs (RGB+ED through rasterize_fused) vs the gsplat backend."""
    from tests.helpers.model_steps import anisotropic, make_camera, make_model, seed_cloud

    seed_points = seed_cloud(2000)
    outs, params = {}, None
    for backend in ("fused", "gsplat"):
        model = make_model(backend, seed_points, device="cuda")
        if params is None:
            params = anisotropic(model)
        for n, p in model.gauss_params.items():
            p.data.copy_(params[n].cuda())
        model.eval()
        model.step = 2999
        outs[backend] = model.get_outputs_for_camera(make_camera(256, 192, device="cuda"))
    f, g = outs["fused"], outs["gsplat"]
    assert float((f["rgb"] - g["rgb"]).abs().max()) <= 4e-3
    assert float((f["accumulation"] - g["accumulation"]).abs().max()) <= 4e-3
    covered = g["accumulation"][..., 0] > 1e-2
    assert norm_err(f["depth"][..., 0][covered], g["depth"][..., 0][covered]) <= 1e-3


# ---------------------------------------------------------------------------------------------
# A real (short) training run on the built-in scene, cross-checked step by step
# ---------------------------------------------------------------------------------------------


@needs_gsplat
def test_fused_training_run_cross_checked(tmp_path):
    """ns-train's loop on the built-in medium scene (256x192, as in docs/benchmarks.md) with the fused
    backend, fused.check_every comparing every 100th step with the unfused path on the same
    inputs through warm-up and densification (hw-prune off: rasterizers only). Then the trained
    model is evaluated with the fused and with the gsplat renderer: same PSNR (eval path)."""

    from bytesplat_ns.bench.train import method_config
    from bytesplat_ns.data.scene import SceneSpec, ensure_scene

    data = ensure_scene(SceneSpec(size="medium"))
    config = method_config("bytesplat", "fused")
    config.pipeline.datamanager.data = data
    config.pipeline.datamanager.dataparser.data = data
    config.pipeline.model.num_downscales = 0
    config.pipeline.model.hw_prune = "off"
    config.pipeline.model.fused.check_every = 100
    config.output_dir = tmp_path
    config.experiment_name = "fused-check"
    config.timestamp = "t"
    config.max_num_iterations = 901
    config.vis = "tensorboard"
    for k in ("steps_per_eval_image", "steps_per_eval_batch", "steps_per_eval_all_images", "steps_per_save"):
        setattr(config, k, 10**9)
    config.machine.device_type = "cuda"
    torch.manual_seed(0)
    trainer = config.setup(local_rank=0, world_size=1)
    trainer.setup()
    trainer.train()
    model = trainer.pipeline.model
    log = model.fused_check_log
    assert len(log) >= 9, len(log)
    # step 0: the seeded Gaussians are isotropic, so their quaternion gradient is rounding noise
    bad = [e for e in log if not (e["radii_equal"] == 1.0 and e["loss"] <= 1e-4 and e["means2d_grad"] <= 1e-2
                                  and e.get("means2d_absgrad", 0.0) <= 1e-2 and e.get("grad2d_stat", 0.0) <= 1e-2
                                  and max(v for k, v in e.items() if k.startswith("grad_")
                                          and not (k == "grad_quats" and e["step"] == 0)) <= 1e-2)]
    assert not bad, "fused step disagrees with the unfused path:\n" + "\n".join(map(str, bad))

    pipeline = trainer.pipeline
    pipeline.eval()
    psnr = {}
    for backend in ("fused", "gsplat"):
        model._backend = backend
        psnr[backend] = float(pipeline.get_average_eval_image_metrics(step=config.max_num_iterations)["psnr"])
    assert abs(psnr["fused"] - psnr["gsplat"]) <= 0.05, psnr
