"""The tile reach kernel (cuda/tile_reach.cu) against its definition (raster/tile_reach.py) on the
GPU: the same radii bit for bit, hence the same tile lists, render and gradients; and one launch is
faster than the definition's elementwise chain."""

from __future__ import annotations

import pytest
import torch

from bytesplat_ns.bench.timing import time_ms
from bytesplat_ns.raster import fused as F
from bytesplat_ns.raster.options import FusedOptions
from bytesplat_ns.raster.tile_reach import ALPHA_MIN, opacity_aware_radii

pytestmark = pytest.mark.gpu


def _ops():
    from bytesplat_ns.raster._wrapper import _ops

    return _ops()


def _random_inputs(C, N, seed):
    """Projection-like inputs with every edge the definition has: faint, at the threshold, NaN and
    infinite opacities; degenerate, negative, NaN and huge conics; culled and huge radii."""
    g = torch.Generator().manual_seed(seed)
    sx = torch.exp(torch.randn(C, N, generator=g) * 1.5)  # from sub-pixel to hundreds of pixels
    sy = sx * torch.exp(torch.randn(C, N, generator=g) * 1.2)
    theta = torch.rand(C, N, generator=g) * 6.283
    cos, sin = torch.cos(theta), torch.sin(theta)
    ia, ib = 1 / sx**2, 1 / sy**2
    conics = torch.stack([ia * cos**2 + ib * sin**2, (ia - ib) * cos * sin, ia * sin**2 + ib * cos**2], -1)
    opac = torch.sigmoid(torch.randn(C, N, generator=g) * 3.0)
    radii = torch.ceil(3 * torch.maximum(sx, sy)).clamp(0, 1e6).to(torch.int32)
    pick = torch.randint(0, 12, (C, N), generator=g)
    opac[pick == 0] = ALPHA_MIN * torch.rand(int((pick == 0).sum()), generator=g)  # faint
    opac[pick == 1] = ALPHA_MIN  # exactly at the threshold
    opac[pick == 2] = float("nan")
    opac[pick == 3] = float("inf")
    conics[pick == 4] = torch.tensor([1.0, 1.0, 1.0])  # det = 0
    conics[pick == 5] = torch.tensor([-1.0, 0.0, 1.0])  # not positive definite
    conics[pick == 6] = float("nan")
    conics[pick == 7] = torch.tensor([1e-30, 0.0, 1e-30])  # a half-extent past 1e9
    radii[pick == 8] = 0  # culled by the projection
    radii[pick == 9] = torch.randint(2000, 100000, (int((pick == 9).sum()),), generator=g, dtype=torch.int32)
    return radii.cuda(), conics.contiguous().cuda(), opac.cuda()


@pytest.mark.parametrize("C,N,seed", [(1, 1, 0), (2, 5000, 1), (3, 200_003, 2)])
def test_the_kernel_gives_the_definitions_radii_bit_for_bit(C, N, seed):
    radii, conics, opac = _random_inputs(C, N, seed)
    want = opacity_aware_radii(radii, conics, opac)
    got = _ops().opacity_aware_radii(radii, conics, opac)
    assert got.shape == (C, N, 2) and got.dtype == torch.int32
    assert torch.equal(got, want), (got != want).nonzero()[:5].tolist()
    if N > 1:  # the edges are all present, and the tight boxes do tighten (a single Gaussian is one edge at most)
        assert bool((want == 0).all(-1).any()) and bool((want < radii[..., None]).any())


def test_the_kernel_gives_the_definitions_radii_on_projected_and_culling_edge_gaussians():
    from tests.raster.test_tile_reach import _culling_edge_inputs, _projected_inputs

    for inputs in (_projected_inputs, _culling_edge_inputs):
        _, _, radii, _, _, conics, opac = inputs()
        radii, conics, opac = radii.to(torch.int32).cuda(), conics.float().contiguous().cuda(), opac.float().cuda()
        assert torch.equal(_ops().opacity_aware_radii(radii, conics, opac), opacity_aware_radii(radii, conics, opac))


def test_empty_and_bad_inputs():
    ops = _ops()
    empty = ops.opacity_aware_radii(torch.zeros(2, 0, dtype=torch.int32, device="cuda"),
                                    torch.zeros(2, 0, 3, device="cuda"), torch.zeros(2, 0, device="cuda"))
    assert empty.shape == (2, 0, 2)
    radii, conics, opac = _random_inputs(1, 10, 3)
    with pytest.raises(RuntimeError, match="conics must be contiguous"):
        ops.opacity_aware_radii(radii, conics[..., :2].contiguous(), opac)
    with pytest.raises(RuntimeError, match="radii must be contiguous"):
        ops.opacity_aware_radii(radii.long(), conics, opac)


@pytest.mark.parametrize("schedule", ["split", "one_launch"])
def test_training_step_is_the_same_with_the_kernel(schedule):
    """fused_render_loss with the reach from the kernel: the same tile lists, loss, render and
    gradients as with the definition (the lists are identical, so the image bit for bit; the
    gradients up to the atomics' fp32 summation order)."""
    from tests.raster.test_fused_cpu_logic import _args, _params, rel_err
    from tests.raster.test_tile_reach import _scene_with_faint_and_long_gaussians

    scene = _scene_with_faint_and_long_gaussians(seed=6)
    scene = {k: v.cuda() if torch.is_tensor(v) else v for k, v in scene.items()}
    H, W = scene["height"], scene["width"]
    g = torch.Generator().manual_seed(8)
    gt, bg = torch.rand(1, H, W, 3, generator=g).cuda(), torch.rand(1, 3, generator=g).cuda()
    out = []
    for reach in ("torch", "cuda"):
        p = _params(scene)
        loss, rgb, alpha, info = F.fused_render_loss(*_args(p, scene), gt, bg, sh_degree=2, options=FusedOptions(
            schedule=schedule, tile_reach=reach))
        loss.backward()
        out.append((loss, rgb, alpha, info, p))
    (l0, rgb0, a0, i0, p0), (l1, rgb1, a1, i1, p1) = out
    # the lists are each array's first offsets[-1] entries (the trimmed lists' arrays keep the binned length)
    assert torch.equal(i1["isect_offsets"], i0["isect_offsets"])
    n = int(i0["isect_offsets"].reshape(-1)[-1])
    assert torch.equal(i1["flatten_ids"][:n], i0["flatten_ids"][:n])
    assert torch.equal(rgb1, rgb0) and torch.equal(a1, a0) and abs(l1.item() - l0.item()) <= 1e-7 * l0.item()
    for k in p0:
        assert rel_err(p1[k].grad, p0[k].grad) <= 1e-5, k


def test_one_launch_is_faster_than_the_elementwise_chain():
    radii, conics, opac = _random_inputs(1, 1_000_000, 4)
    ops = _ops()
    t_torch = time_ms(lambda: opacity_aware_radii(radii, conics, opac), 3, 50)["median_ms"]
    t_cuda = time_ms(lambda: ops.opacity_aware_radii(radii, conics, opac), 3, 50)["median_ms"]
    print(f"\ntile reach, 1M Gaussians: torch {t_torch:.3f} ms, CUDA {t_cuda:.3f} ms ({t_torch / max(t_cuda, 1e-9):.1f}x)")
    assert t_cuda < t_torch
