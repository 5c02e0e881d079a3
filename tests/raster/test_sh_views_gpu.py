"""Multi-camera SH colors (``cuda/sh_views_*.cu``) against the pure-PyTorch twin and against gsplat's
per-camera path inside ``fused.project`` (GPU only)."""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.gpu


def _cameras(C, g):
    from tests.helpers.distributed_worker import look_at

    eyes = torch.randn(C, 3, generator=g) * 2.0 + torch.tensor([0.0, 0.0, -4.0])
    return torch.stack([look_at(tuple(e.tolist())) for e in eyes])


def _inputs(N, C, K, seed, culled=0.2):
    g = torch.Generator().manual_seed(seed)
    means = torch.randn(N, 3, generator=g)
    coeffs = torch.randn(N, K, 3, generator=g) * 0.4
    coeffs[: N // 10, 0] = -3.0  # raw color < -0.5: clamped to 0, no gradient there
    viewmats = _cameras(C, g)
    radii = torch.randint(1, 9, (C, N), generator=g, dtype=torch.int32)
    radii[torch.rand(C, N, generator=g) < culled] = 0
    # a Gaussian exactly at camera 0's center: a zero direction stays finite
    means[N - 1] = -(viewmats[0, :3, :3].T @ viewmats[0, :3, 3])
    return means.cuda(), coeffs.cuda(), viewmats.cuda(), radii.cuda()


@pytest.mark.parametrize("degree,K,C", [(3, 16, 5), (2, 16, 3), (1, 9, 2), (0, 1, 4), (3, 16, 1)])
def test_kernel_equals_the_torch_twin(degree, K, C):
    from bytesplat_ns.raster.sh_views import multiview_sh_colors, multiview_sh_colors_torch

    means, coeffs, viewmats, radii = _inputs(3000, C, K, seed=degree * 10 + C)
    out = {}
    for name, fn in (("torch", multiview_sh_colors_torch), ("cuda", multiview_sh_colors)):
        m, c = means.clone().requires_grad_(True), coeffs.clone().requires_grad_(True)
        colors = fn(m, c, viewmats, radii, degree)
        v = torch.randn(colors.shape, generator=torch.Generator().manual_seed(1)).cuda()
        (colors * v).sum().backward()
        # degree 0 does not depend on the direction: autograd leaves the twin's means without a gradient
        out[name] = (colors.detach(), m.grad if m.grad is not None else torch.zeros_like(m), c.grad)
    (col_t, gm_t, gc_t), (col_c, gm_c, gc_c) = out["torch"], out["cuda"]
    assert torch.isfinite(col_c).all() and torch.isfinite(gm_c).all() and torch.isfinite(gc_c).all()
    assert (col_c - col_t).abs().max().item() <= 1e-5
    assert (col_c[radii == 0] == 0).all() and (col_c[:, : 3000 // 10] == 0).any()
    assert (gc_c - gc_t).abs().max().item() <= 1e-4 * gc_t.abs().max().item()
    assert (gm_c - gm_t).abs().max().item() <= 1e-4 * gm_t.abs().max().item()
    n = (degree + 1) ** 2
    assert (gc_c[:, n:] == 0).all()  # coefficients past the degree in use


def test_project_takes_the_kernel_for_several_cameras_and_matches_gsplat_per_camera():
    """``fused.project`` with gsplat's projection and C > 1 views of shared SH coefficients uses
    the kernel; with optimised cameras (viewmats requiring grad) it keeps gsplat's call per
    camera. Both give the same colors where visible and the same Gaussian gradients."""
    pytest.importorskip("gsplat")
    from bytesplat_ns.raster import sh_views
    from bytesplat_ns.raster.fused import project

    g = torch.Generator().manual_seed(3)
    N, C = 4000, 4
    means = (torch.randn(N, 3, generator=g) * 0.8).cuda()
    quats = torch.randn(N, 4, generator=g).cuda()
    scales = (torch.rand(N, 3, generator=g) * 0.05 + 0.01).cuda()
    opac = torch.rand(N, generator=g).cuda()
    coeffs = (torch.randn(N, 16, 3, generator=g) * 0.3).cuda()
    viewmats = _cameras(C, g).cuda()
    f = 200.0
    Ks = torch.tensor([[f, 0, 160.0], [0, f, 120.0], [0, 0, 1]]).expand(C, 3, 3).contiguous().cuda()
    calls = []
    kernel = sh_views.multiview_sh_colors

    def spy(*a, **k):
        calls.append(1)
        return kernel(*a, **k)

    out = {}
    for name in ("kernel", "per_camera"):
        m, c = means.clone().requires_grad_(True), coeffs.clone().requires_grad_(True)
        vm = viewmats.clone().requires_grad_(name == "per_camera")
        sh_views.multiview_sh_colors = spy
        try:
            radii, _, _, _, rgb, _ = project(m, quats, scales, opac, c, vm, Ks, 320, 240, sh_degree=3,
                                             near_plane=0.01, far_plane=1e10, eps2d=0.3, projection="gsplat")
        finally:
            sh_views.multiview_sh_colors = kernel
        seen = (radii > 0)[..., None]
        rgb = torch.where(seen, rgb, 0.0)
        (rgb * torch.linspace(-1, 1, rgb.numel(), device="cuda").view_as(rgb)).sum().backward()
        out[name] = (rgb.detach(), m.grad, c.grad, radii)
    assert len(calls) == 1  # the kernel for fixed cameras only
    (rk, gmk, gck, rad), (rp, gmp, gcp, _) = out["kernel"], out["per_camera"]
    assert (rad > 0).sum() > 1000
    assert (rk - rp).abs().max().item() <= 1e-5
    assert (gck - gcp).abs().max().item() <= 1e-4 * gcp.abs().max().item()
    assert (gmk - gmp).abs().max().item() <= 1e-3 * gmp.abs().max().item()
