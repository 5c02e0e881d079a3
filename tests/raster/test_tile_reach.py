"""Opacity-aware tile reach (``raster.tile_reach``): the box, and that binning into it changes no
render or gradient (on CPU, through the kernels' PyTorch twin; the CUDA binning of [C,N,2] radii is
held to the twin in tests/raster/test_binning_gpu.py)."""

from __future__ import annotations

import math

import pytest
import torch

from bytesplat_ns.errors import SettingError
from bytesplat_ns.raster import fused as F
from bytesplat_ns.raster._torch_impl import bin_tiles_torch
from bytesplat_ns.raster.options import FusedOptions, FusedRasterConfig
from bytesplat_ns.raster.tile_reach import ALPHA_MIN, opacity_aware_radii
from tests.raster.test_fused_cpu_logic import _args, _params, make_scene, rel_err, torch_ops  # noqa: F401


def _conic(sx: float, sy: float) -> torch.Tensor:
    """The conic (inverse covariance [a, b, c]) of an axis-aligned 2D Gaussian with these sigmas."""
    return torch.tensor([1.0 / sx**2, 0.0, 1.0 / sy**2])


def test_the_reach_is_the_opacity_ellipse_box_inside_the_square():
    conics = torch.stack([_conic(20.0, 2.0), _conic(20.0, 2.0), _conic(3.0, 3.0)])[None]
    opac = torch.tensor([[0.9, 0.02, 0.5]])
    radii = torch.tensor([[60, 60, 9]], dtype=torch.int32)
    reach = opacity_aware_radii(radii, conics, opac)
    assert reach.shape == (1, 3, 2) and reach.dtype == torch.int32
    for i, (sx, sy) in enumerate([(20.0, 2.0), (20.0, 2.0), (3.0, 3.0)]):
        t = 1.01 * math.log(opac[0, i].item() / ALPHA_MIN) + 0.02
        want = [min(math.ceil(math.sqrt(2 * t) * s + 0.01), radii[0, i].item()) for s in (sx, sy)]
        assert reach[0, i].tolist() == want
    # a faint Gaussian reaches less far than an opaque one of the same shape; opaque ones keep the square
    assert (reach[0, 1] < reach[0, 0]).all() and reach[0, 2].tolist() == [9, 9]


def test_faint_culled_degenerate_and_nan_gaussians():
    conics = torch.stack([_conic(5.0, 5.0), _conic(5.0, 5.0), torch.tensor([1.0, 1.0, 1.0]),
                          _conic(5.0, 5.0), torch.tensor([float("nan"), 0.0, 1.0])])[None]
    opac = torch.tensor([[0.5 * ALPHA_MIN, 0.5, 0.5, float("nan"), 0.5]])
    radii = torch.tensor([[15, 0, 7, 15, 11]], dtype=torch.int32)
    reach = opacity_aware_radii(radii, conics, opac)
    assert reach[0, 0].tolist() == [0, 0]  # never composited: alpha <= o < 1/255
    assert reach[0, 1].tolist() == [0, 0]  # culled by the projection
    assert reach[0, 2].tolist() == [7, 7]  # det = 0: the square, as the kernels' cull keeps every warp
    assert reach[0, 3].tolist() == [15, 15]  # NaN opacity: the kernels composite it, so the square
    assert reach[0, 4].tolist() == [11, 11]


def _scene_with_faint_and_long_gaussians(seed=3):
    scene = make_scene(N=200, W=64, H=48, seed=seed)
    g = torch.Generator().manual_seed(seed + 100)
    scene["scales"] = torch.exp(torch.randn(200, 3, generator=g) * 0.9 + math.log(0.12))
    scene["opacities"] = torch.sigmoid(torch.randn(200, generator=g) * 3.0 - 1.0)
    return scene


def _projected(scene):
    p = _params(scene)
    radii, means2d, depths, conics, _, opac = F.project(
        p["means"], p["quats"], p["scales"], p["opacities"], p["colors"], scene["viewmats"], scene["Ks"],
        scene["width"], scene["height"], sh_degree=scene["sh_degree"], near_plane=0.01, far_plane=1e10, eps2d=0.3,
        projection="torch")
    return radii, means2d.detach(), depths.detach(), conics.detach(), opac.detach()


def _pairs(offsets, ids):
    """{(tile, flattened Gaussian)} of a binning."""
    tiles = torch.repeat_interleave(torch.arange(offsets.numel() - 1), (offsets[1:] - offsets[:-1]).long())
    return set(zip(tiles.tolist(), ids.tolist()))


def _culling_edge_inputs():
    from tests.helpers.culling_scenes import culling_edge_scene_2d

    sc = culling_edge_scene_2d(C=2, W=77, H=53, n=300, seed=11)
    return sc["width"], sc["height"], sc["radii"], sc["means2d"], sc["depths"], sc["conics"], sc["opacities"]


def _projected_inputs():
    scene = _scene_with_faint_and_long_gaussians()
    return (scene["width"], scene["height"], *_projected(scene))


@pytest.mark.parametrize("inputs", [_projected_inputs, _culling_edge_inputs], ids=["projected", "culling_edge"])
def test_no_pair_left_out_is_composited_at_any_pixel_of_its_tile(inputs):
    """Projected 3D Gaussians, and 2D ones on the edges of the kernels' per-warp cull (sub-pixel to
    30 px, up to 1:300 anisotropy, opacities at the threshold: tests/helpers/culling_scenes.py)."""
    W, H, radii, means2d, depths, conics, opac = inputs()
    square = _pairs(*bin_tiles_torch(means2d, radii, depths, W, H))
    tight = _pairs(*bin_tiles_torch(means2d, opacity_aware_radii(radii, conics, opac), depths, W, H))
    assert tight <= square and len(tight) < 0.8 * len(square)
    tw, th = math.ceil(W / 16), math.ceil(H / 16)
    ys, xs = torch.meshgrid(torch.arange(16), torch.arange(16), indexing="ij")
    m, c, o = means2d.reshape(-1, 2), conics.reshape(-1, 3), opac.reshape(-1)
    for tile, gid in square - tight:
        px = (tile % tw) * 16 + xs + 0.5
        py = (tile // tw % th) * 16 + ys + 0.5
        inside = (px < W) & (py < H)
        dx, dy = m[gid, 0] - px, m[gid, 1] - py
        sigma = 0.5 * (c[gid, 0] * dx * dx + c[gid, 2] * dy * dy) + c[gid, 1] * dx * dy
        alpha = torch.clamp(o[gid] * torch.exp(-sigma), max=0.999)
        composited = (sigma >= 0) & (alpha >= ALPHA_MIN) & inside
        assert not composited.any(), (tile, gid)


@pytest.mark.parametrize("schedule", ["split", "two_launch"])
def test_training_loss_render_and_gradients_are_unchanged(torch_ops, schedule):  # noqa: F811
    scene = _scene_with_faint_and_long_gaussians(seed=4)
    H, W = scene["height"], scene["width"]
    g = torch.Generator().manual_seed(7)
    gt, bg = torch.rand(1, H, W, 3, generator=g), torch.rand(1, 3, generator=g)
    results = []
    for tight in (False, True):
        p = _params(scene)
        loss, rgb, alpha, info = F.fused_render_loss(*_args(p, scene), gt, bg, sh_degree=2, options=FusedOptions(
            schedule=schedule, opacity_aware_tiles=tight, trim_tile_lists=False))  # the lists as binned
        info["means2d"].retain_grad()
        loss.backward()
        results.append((loss, rgb, alpha, info, p))
    (loss0, rgb0, a0, info0, p0), (loss1, rgb1, a1, info1, p1) = results
    assert info1["flatten_ids"].numel() < info0["flatten_ids"].numel()
    assert torch.equal(info1["radii"], info0["radii"])  # the strategy still sees the projection's radii
    assert abs(loss1.item() - loss0.item()) <= 1e-7 * loss0.item()
    assert rel_err(rgb1, rgb0) <= 1e-6 and rel_err(a1, a0) <= 1e-6
    for k in p0:
        assert rel_err(p1[k].grad, p0[k].grad) <= 1e-5, k
    assert rel_err(info1["means2d"].grad, info0["means2d"].grad) <= 1e-5


def test_eval_render_is_unchanged(torch_ops):  # noqa: F811
    scene = _scene_with_faint_and_long_gaussians(seed=5)
    renders = []
    for tight in (False, True):
        with torch.no_grad():
            render, alpha, info = F.rasterize_fused(*_args(_params(scene), scene), sh_degree=2,
                                                    options=FusedOptions(opacity_aware_tiles=tight,
                                                                         trim_tile_lists=False))
        renders.append((render, alpha, info["flatten_ids"].numel()))
    assert rel_err(renders[1][0], renders[0][0]) <= 1e-6 and rel_err(renders[1][1], renders[0][1]) <= 1e-6
    assert renders[1][2] < renders[0][2]


def test_the_switch_is_a_config_field():
    assert FusedRasterConfig().options().opacity_aware_tiles is True  # the default since measured on the H200
    assert FusedOptions().opacity_aware_tiles is True
    assert FusedRasterConfig(opacity_aware_tiles=False).options().opacity_aware_tiles is False
    with pytest.raises(SettingError, match="opacity_aware_tiles"):
        FusedOptions(opacity_aware_tiles="yes")
    # how the reach is computed: the kernel unless its torch definition is asked for
    assert FusedRasterConfig().options().tile_reach == "cuda"
    assert FusedRasterConfig(tile_reach="torch").options().tile_reach == "torch"
    with pytest.raises(SettingError, match="tile_reach must be one of torch, cuda"):
        FusedOptions(tile_reach="triton")


def test_tile_radii_takes_the_torch_definition_on_cpu_tensors_whatever_the_switch():
    """``tile_reach="cuda"`` runs the kernel on CUDA tensors only; CPU tensors (the reference path,
    the CPU tests, pruning's counts on the host) get the definition, without building anything."""
    W, H, radii, means2d, depths, conics, opac = _culling_edge_inputs()
    want = opacity_aware_radii(radii, conics, opac)
    for reach in ("torch", "cuda"):
        got = F.tile_radii(radii, conics, opac, FusedOptions(tile_reach=reach))
        assert torch.equal(got, want), reach
    assert F.tile_radii(radii, conics, opac, FusedOptions(opacity_aware_tiles=False, tile_reach="cuda")) is radii


def test_sharded_step_bins_with_the_reach_the_senders_counted(torch_ops, monkeypatch):  # noqa: F811
    """The sharded step: each sender counts its records' tiles with the reach, the renderer bins the
    records it receives with the same reach (bin_tiles_torch asserts the told total), and the result
    is still the reference compositor's."""
    from tests.raster.test_fused_cpu_logic import _sharded_step_both_compositors

    _, told_square = _sharded_step_both_compositors(monkeypatch, "sparse-grad", options=FusedOptions(
        schedule="split", opacity_aware_tiles=False))
    _, told_tight = _sharded_step_both_compositors(monkeypatch, "sparse-grad", options=FusedOptions(
        schedule="split", opacity_aware_tiles=True))
    assert len(told_tight) == 1 and 0 < told_tight[0] < told_square[0]
