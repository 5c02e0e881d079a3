"""The SH kernel (``cuda/sh_views_*.cu``) with the coefficients as DC [N,3] and rest [N,K-1,3]
(``raster.sh.ShCoefficients``) against its pure-PyTorch twin, and the fused training path that uses
it for one camera against gsplat's SH on stacked coefficients (GPU only)."""

from __future__ import annotations

import pytest
import torch

from tests.helpers.sh_split_inputs import split_sh_inputs

pytestmark = pytest.mark.gpu


def _max_rel(a, b):
    return (a - b).abs().max().item() / max(b.abs().max().item(), 1e-30)


def _run(fn, means, dc, rest, viewmats, radii, degree):
    m, d, r = (t.clone().requires_grad_(True) for t in (means, dc, rest))
    colors = fn(m, d, r, viewmats, radii, degree)
    weights = torch.randn(colors.shape, generator=torch.Generator().manual_seed(1)).cuda()
    (colors * weights).sum().backward()
    # degree 0 does not depend on the direction: autograd leaves the twin's means without a gradient
    return colors.detach(), [t.grad if t.grad is not None else torch.zeros_like(t) for t in (m, d, r)]


def _kernel(m, d, r, viewmats, radii, degree):
    from bytesplat_ns.raster.sh import ShCoefficients
    from bytesplat_ns.raster.sh_views import multiview_sh_colors

    return multiview_sh_colors(m, ShCoefficients(d, r), viewmats, radii, degree)


@pytest.mark.parametrize("degree,K,C", [(3, 16, 1), (3, 16, 4), (2, 16, 1), (2, 9, 3), (1, 16, 1), (1, 4, 2),
                                        (0, 16, 1), (0, 1, 3)])
def test_split_kernel_equals_the_twin(degree, K, C):
    from bytesplat_ns.raster.sh_views import split_sh_colors_torch

    inputs = split_sh_inputs(3000, C, K, seed=degree * 10 + C, device="cuda")
    radii = inputs[4]
    col_t, (gm_t, gd_t, gr_t) = _run(split_sh_colors_torch, *inputs, degree)
    col_c, (gm_c, gd_c, gr_c) = _run(_kernel, *inputs, degree)
    assert all(torch.isfinite(t).all() for t in (col_c, gm_c, gd_c, gr_c))
    assert (col_c - col_t).abs().max().item() <= 1e-5
    assert (col_c[radii <= 0] == 0).all() and (col_c[:, : 3000 // 10] == 0).any()
    assert _max_rel(gd_c, gd_t) <= 1e-4
    n = (degree + 1) ** 2
    if K > 1:
        assert (gr_c[:, n - 1:] == 0).all()  # the rest past the degree in use
    if n > 1:
        assert _max_rel(gr_c, gr_t) <= 1e-4 and _max_rel(gm_c, gm_t) <= 1e-4
        # the last Gaussian sits at camera 0's center (a means gradient near 1e20 where it is seen):
        # the others on their own scale
        assert _max_rel(gm_c[:-1], gm_t[:-1]) <= 1e-4
    else:
        assert (gm_c == 0).all()
    assert (gd_c[(radii > 0).sum(0) == 0] == 0).all()  # culled in every view: no gradient


def test_split_kernel_reads_and_writes_row_strided_views():
    """dc and rest as views into one wider buffer (row stride 17*3, read in place) give what
    contiguous tensors do; the stacked form (``multiview_sh_colors`` on [N,K,3]: its two views read,
    its gradient written through them) gives the same."""
    from bytesplat_ns.raster.sh import ShCoefficients
    from bytesplat_ns.raster.sh_views import multiview_sh_colors

    means, dc, rest, viewmats, radii = split_sh_inputs(2000, 2, 16, seed=5, device="cuda")
    col_c, (gm_c, gd_c, gr_c) = _run(_kernel, means, dc, rest, viewmats, radii, 3)
    weights = torch.randn(col_c.shape, generator=torch.Generator().manual_seed(1)).cuda()

    buffer = torch.zeros(2000, 17, 3, device="cuda")
    buffer[:, 0], buffer[:, 2:] = dc, rest
    buffer.requires_grad_(True)
    assert not buffer[:, 2:].is_contiguous()
    col_s = multiview_sh_colors(means, ShCoefficients(buffer[:, 0], buffer[:, 2:]), viewmats, radii, 3)
    (col_s * weights).sum().backward()
    assert torch.equal(col_s, col_c)
    assert torch.equal(buffer.grad[:, 0], gd_c) and torch.equal(buffer.grad[:, 2:], gr_c)
    assert (buffer.grad[:, 1] == 0).all()

    stacked = torch.cat((dc[:, None], rest), 1).requires_grad_(True)
    m = means.clone().requires_grad_(True)
    col_k = multiview_sh_colors(m, stacked, viewmats, radii, 3)
    (col_k * weights).sum().backward()
    assert torch.equal(col_k, col_c)
    assert torch.equal(stacked.grad[:, 0], gd_c) and torch.equal(stacked.grad[:, 1:], gr_c)
    assert torch.equal(m.grad, gm_c)


def _scene(N=6000, seed=3):
    g = torch.Generator().manual_seed(seed)
    means = torch.randn(N, 3, generator=g) * 0.8
    means[:, 2] += 4.0
    quats = torch.randn(N, 4, generator=g) * torch.linspace(0.3, 3.0, N)[:, None]  # far from unit length
    scales = torch.rand(N, 3, generator=g) * 0.05 + 0.01
    opac = torch.rand(N, generator=g) * 0.8 + 0.1
    dc = torch.randn(N, 3, generator=g) * 0.4
    rest = torch.randn(N, 15, 3, generator=g) * 0.2
    f = 200.0
    Ks = torch.tensor([[[f, 0, 160.0], [0, f, 120.0], [0, 0, 1]]])
    gt = torch.rand(1, 240, 320, 3, generator=g)
    return [t.cuda() for t in (means, quats, scales, opac, dc, rest, torch.eye(4)[None], Ks, gt)]


@pytest.mark.parametrize("degree", [3, 1, 0])
def test_fused_step_with_split_coefficients_matches_gsplat_sh(degree):
    """One camera, the training step: ``fused_render_loss`` with ``ShCoefficients`` (our SH kernel,
    called once) against the same step with stacked coefficients (gsplat's ``spherical_harmonics``,
    the path before): same loss, same gradients for means, dc, rest, quats, scales, opacities."""
    pytest.importorskip("gsplat")
    from bytesplat_ns.raster import sh_views
    from bytesplat_ns.raster.fused import fused_render_loss
    from bytesplat_ns.raster.sh import ShCoefficients

    means, quats, scales, opac, dc, rest, viewmats, Ks, gt = _scene()
    calls, kernel = [], sh_views.multiview_sh_colors

    def spy(*a, **k):
        calls.append(type(a[1]).__name__)
        return kernel(*a, **k)

    out = {}
    for form in ("split", "stacked"):
        leaves = [t.clone().requires_grad_(True) for t in (means, quats, scales, opac, dc, rest)]
        m, q, s, o, d, r = leaves
        colors = ShCoefficients(d, r) if form == "split" else torch.cat((d[:, None], r), 1)
        sh_views.multiview_sh_colors = spy
        try:
            loss, _, _, info = fused_render_loss(m, q, s, o, colors, viewmats, Ks, 320, 240, gt, sh_degree=degree)
        finally:
            sh_views.multiview_sh_colors = kernel
        loss.backward()
        out[form] = (float(loss), [t.grad for t in leaves], info["radii"])
    assert calls == ["ShCoefficients"]  # the kernel for the split form only (stacked, one camera: gsplat)
    (loss_s, grads_s, radii), (loss_k, grads_k, _) = out["split"], out["stacked"]
    assert (radii > 0).sum() > 3000
    assert abs(loss_s - loss_k) <= 1e-5 * abs(loss_k)
    for name, a, b in zip(("means", "quats", "scales", "opacities", "dc", "rest"), grads_s, grads_k):
        if name == "rest" and degree == 0:
            assert (a == 0).all() and (b == 0).all()
            continue
        assert _max_rel(a, b) <= (1e-3 if name == "means" else 1e-4), (name, _max_rel(a, b))
    n = (degree + 1) ** 2
    assert (grads_s[5][:, n - 1:] == 0).all()


def test_gsplat_projection_normalises_quaternions_itself():
    """The fused path hands gsplat's projection the raw quaternions (splatfacto divides them by
    their norm first): the same 2D Gaussians, and the same gradient with respect to the raw ones."""
    pytest.importorskip("gsplat")
    from bytesplat_ns.raster.fused import project

    means, quats, scales, opac, dc, _, viewmats, Ks, _ = _scene()
    out = {}
    for form in ("raw", "normalised"):
        q = quats.clone().requires_grad_(True)
        q_in = q if form == "raw" else q / q.norm(dim=-1, keepdim=True)
        radii, _, _, conics, _, _ = project(means, q_in, scales, opac, dc, viewmats, Ks, 320, 240,
                                            sh_degree=None, near_plane=0.01, far_plane=1e10, eps2d=0.3,
                                            projection="gsplat")
        weights = torch.linspace(-1, 1, conics.numel(), device="cuda").view_as(conics)
        (conics * weights * (radii > 0)[..., None]).sum().backward()
        out[form] = (radii, conics.detach(), q.grad)
    (r_raw, c_raw, g_raw), (r_n, c_n, g_n) = out["raw"], out["normalised"]
    assert torch.equal(r_raw, r_n) and (r_raw > 0).sum() > 3000
    visible = r_raw > 0  # gsplat leaves the culled entries' conics unwritten
    assert _max_rel(c_raw[visible], c_n[visible]) <= 1e-5
    assert g_n.abs().sum() > 0 and _max_rel(g_raw, g_n) <= 1e-4


def _padded_rows(N, K, fill):
    """A [N, K+3, 3] buffer of ``fill`` and its views dc = [:, 1] and rest = [:, 3:K+2]: rows with
    a float3 of padding before the DC, between the DC and the rest, and after the rest."""
    buf = torch.full((N, K + 3, 3), fill, device="cuda")
    return buf, buf[:, 1], buf[:, 3:K + 2]


_SHAPES = [(3, 16, 1), (3, 16, 3), (2, 9, 1), (2, 16, 3), (1, 4, 1), (1, 16, 1), (0, 1, 1), (0, 16, 3)]
# N around the 64-Gaussian blocks of cuda/sh_views_*.cu, then a large odd N (many blocks, a partial last one)
_TILE_CASES = [(N, layout, *shape) for N in (1, 63, 64, 65, 130) for layout in ("contiguous", "padded")
               for shape in _SHAPES] + [(100_003, "padded", 3, 16, 1), (100_003, "contiguous", 2, 16, 3)]


@pytest.mark.parametrize("N,layout,degree,K,C", _TILE_CASES)
def test_kernel_tiles_at_block_edges_and_row_strides(N, layout, degree, K, C):
    """The kernels copy a block's rows (64 Gaussians) through shared memory: every N around a block
    edge, every K, several cameras, rows contiguous or padded with NaN on both sides (read from
    and written into in place) give the twin's colors and gradients, read no padding (the outputs
    stay finite), write every gradient float (outputs start as NaN) and no padding (it stays NaN)."""
    from bytesplat_ns.raster._wrapper import _ops
    from bytesplat_ns.raster.sh_views import split_sh_colors_torch

    means, dc, rest, viewmats, radii = split_sh_inputs(N, C, K, seed=N + 7 * K + C, device="cuda")
    means[N - 1] += 0.5  # off camera 0's center: every means gradient of ordinary size
    v_colors = torch.randn(C, N, 3, generator=torch.Generator().manual_seed(2)).cuda()
    m, d, r = (t.clone().requires_grad_(True) for t in (means, dc, rest))
    col_t = split_sh_colors_torch(m, d, r, viewmats, radii, degree)
    (col_t * v_colors).sum().backward()
    gm_t = m.grad if m.grad is not None else torch.zeros_like(means)  # degree 0: no direction in the graph

    nan = float("nan")
    if layout == "padded":
        buf, dc_k, rest_k = _padded_rows(N, K, nan)
        dc_k.copy_(dc), rest_k.copy_(rest)
        vbuf, v_dc, v_rest = _padded_rows(N, K, nan)
        assert dc_k.stride(0) == rest_k.stride(0) == (K + 3) * 3
    else:
        dc_k, rest_k = dc, rest
        v_dc, v_rest = torch.full_like(dc, nan), torch.full_like(rest, nan)
    ops = _ops()
    col_k = ops.sh_views_fwd(means, dc_k, rest_k, viewmats, radii, degree)
    gm_k = ops.sh_views_bwd(means, dc_k, rest_k, viewmats, radii, degree, v_colors, v_dc, v_rest)
    assert all(torch.isfinite(t).all() for t in (col_k, gm_k, v_dc, v_rest))
    assert (col_k - col_t.detach()).abs().max().item() <= 1e-5
    assert (col_k[radii <= 0] == 0).all()
    assert _max_rel(v_dc, d.grad) <= 1e-4
    n = (degree + 1) ** 2
    assert (v_rest[:, n - 1:] == 0).all()  # past the bases in use
    if n > 1:
        assert _max_rel(v_rest, r.grad) <= 1e-4 and _max_rel(gm_k, gm_t) <= 1e-4
        assert gm_k.abs().max() < 1e6  # no Gaussian at a camera center here: ordinary gradients only
    else:
        assert (gm_k == 0).all()
    if layout == "padded":  # the padding is neither read (above: finite) nor written
        assert torch.isnan(vbuf[:, 0]).all() and torch.isnan(vbuf[:, 2]).all() and torch.isnan(vbuf[:, K + 2]).all()


def test_kernel_on_the_stacked_views_of_one_tensor_equals_the_split_call():
    """A stacked [N,K,3] tensor passed as its two views (row stride K*3 for both, the DC and the
    rest interleaved row by row) in and out gives exactly the split contiguous call's results."""
    from bytesplat_ns.raster._wrapper import _ops

    N, C, K = 1000, 2, 16
    means, dc, rest, viewmats, radii = split_sh_inputs(N, C, K, seed=11, device="cuda")
    v_colors = torch.randn(C, N, 3, generator=torch.Generator().manual_seed(4)).cuda()
    ops = _ops()
    col = ops.sh_views_fwd(means, dc, rest, viewmats, radii, 3)
    v_dc, v_rest = torch.empty_like(dc), torch.empty_like(rest)
    gm = ops.sh_views_bwd(means, dc, rest, viewmats, radii, 3, v_colors, v_dc, v_rest)
    stacked = torch.cat((dc[:, None], rest), 1)
    v_stacked = torch.full_like(stacked, float("nan"))
    col_s = ops.sh_views_fwd(means, stacked[:, 0], stacked[:, 1:], viewmats, radii, 3)
    gm_s = ops.sh_views_bwd(means, stacked[:, 0], stacked[:, 1:], viewmats, radii, 3, v_colors,
                            v_stacked[:, 0], v_stacked[:, 1:])
    assert torch.equal(col_s, col) and torch.equal(gm_s, gm)
    assert torch.equal(v_stacked[:, 0], v_dc) and torch.equal(v_stacked[:, 1:], v_rest)
