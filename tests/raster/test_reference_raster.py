"""The pure-PyTorch ``reference`` rasterizer (float32) against the float64 dense oracle.

Every test builds fresh random scenes from fixed seeds, renders them with
``bytesplat_ns.raster.reference.rasterize_reference`` in float32 and with ``tests.helpers.dense_oracle``
in float64 (from the same float32-rounded inputs), and compares images (abs err <= 1e-5) and
gradients of a random linear functional of the outputs (norm-wise relative err <= 1e-4).
"""

from __future__ import annotations

import time

import pytest
import torch

from bytesplat_ns.raster import rasterize
from bytesplat_ns.raster.reference import rasterize_reference
from tests.helpers.dense_oracle import oracle_composite, oracle_render
from tests.helpers.raster_scenes import make_scene

IMG_TOL = 1e-5
GRAD_TOL = 1e-4
PARAMS = ("means", "quats", "scales", "opacities", "colors")


# ----------------------------------------------------------------------------- scene helpers
def _round32(scene):
    """Round every float input to float32 (the oracle then works on exactly the same values)."""
    out = dict(scene)
    for k in ("means", "quats", "scales", "opacities", "colors", "viewmats", "Ks"):
        out[k] = scene[k].float().double()
    return out


def _probe(scene, C, D, seed=1234):
    g = torch.Generator().manual_seed(seed)
    H, W = scene["H"], scene["W"]
    v = torch.randn(C, H, W, D, generator=g, dtype=torch.float64)
    va = torch.randn(C, H, W, 1, generator=g, dtype=torch.float64)
    return v, va


def _render(fn, scene, dtype, grad_keys=PARAMS, **kw):
    """Render with ``fn`` (reference or oracle) in ``dtype``; return outputs, grads, info."""
    inputs = {k: scene[k].to(dtype).clone().requires_grad_(k in grad_keys)
              for k in ("means", "quats", "scales", "opacities", "colors", "viewmats", "Ks")}
    kw = dict(kw)
    if kw.get("backgrounds") is not None:
        kw["backgrounds"] = kw["backgrounds"].to(dtype)
    render, alpha, info = fn(inputs["means"], inputs["quats"], inputs["scales"],
                             inputs["opacities"], inputs["colors"], inputs["viewmats"],
                             inputs["Ks"], scene["W"], scene["H"], sh_degree=scene["sh_degree"],
                             **kw)
    return render, alpha, info, inputs


def _grads(render, alpha, inputs, v, va, keys, extra=()):
    loss = (render * v.to(render.dtype)).sum() + (alpha * va.to(alpha.dtype)).sum()
    ts = [inputs[k] for k in keys] + list(extra)
    gs = torch.autograd.grad(loss, ts, allow_unused=True, retain_graph=True)
    return [torch.zeros_like(t) if gr is None else gr for t, gr in zip(ts, gs)]


def _rel(a, b):
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def compare(scene, grad_keys=PARAMS, check_means2d=True, depth_channel=False, min_grad=1e-6,
            **kw):
    """Reference (float32) vs oracle (float64): image, alpha, radii, gradients. Returns details."""
    scene = _round32(scene)
    r_img, r_alp, r_info, r_in = _render(rasterize_reference, scene, torch.float32, grad_keys,
                                         **kw)
    o_img, o_alp, o_meta, o_in = _render(oracle_render, scene, torch.float64, grad_keys, **kw)
    C, H, W, D = o_img.shape
    assert r_img.shape == (C, H, W, D) and r_alp.shape == (C, H, W, 1)
    assert r_img.dtype == torch.float32

    # radii are integers: they must agree exactly
    o_radii = torch.stack([p["radii"] for p in o_meta["projections"]])
    assert torch.equal(r_info["radii"].long(), o_radii), "radii differ"
    assert r_info["radii"].dtype == torch.int32

    # image
    if depth_channel:
        err_rgb = (r_img[..., :-1].double() - o_img[..., :-1]).abs().max().item()
        scale = o_img[..., -1:].abs().clamp_min(1.0)
        err_d = ((r_img[..., -1:].double() - o_img[..., -1:]).abs() / scale).max().item()
        assert err_d <= IMG_TOL, f"depth channel rel err {err_d}"
    else:
        err_rgb = (r_img.double() - o_img).abs().max().item()
    err_a = (r_alp.double() - o_alp).abs().max().item()
    assert err_rgb <= IMG_TOL, f"image abs err {err_rgb}"
    assert err_a <= IMG_TOL, f"alpha abs err {err_a}"

    # gradients of a random linear functional
    v, va = _probe(scene, C, D)
    if depth_channel:
        v[..., -1] *= 0.1
    names = list(grad_keys)
    r_g = _grads(r_img, r_alp, r_in, v, va, grad_keys)
    o_g = _grads(o_img, o_alp, o_in, v, va, grad_keys)
    if check_means2d:
        # d/d(means2d): reference through info["means2d"], oracle through detached 2D-mean leaves
        o_img2, o_alp2, o_meta2, o_in2 = _render(oracle_render, scene, torch.float64, (),
                                                 means2d_leaf=True, **kw)
        names.append("means2d")
        r_g += _grads(r_img, r_alp, r_in, v, va, [], [r_info["means2d"]])
        o_g.append(torch.stack(_grads(o_img2, o_alp2, o_in2, v, va, [], o_meta2["means2d"])))
    rels = {}
    for name, a, b in zip(names, r_g, o_g):
        assert a.shape == b.shape, name
        assert torch.isfinite(a).all(), f"non-finite grad for {name}"
        assert b.norm() > min_grad, f"oracle grad of {name} is ~0: weak test"
        rels[name] = _rel(a, b)
    bad = {k: r for k, r in rels.items() if r > GRAD_TOL}
    assert not bad, f"gradient rel err too large: {bad} (all: {rels})"
    return dict(err_img=err_rgb, err_alpha=err_a, rels=rels, r_info=r_info, o_meta=o_meta,
                r_img=r_img, o_img=o_img, r_alpha=r_alp, o_alpha=o_alp)


# ------------------------------------------------------------------------------------- tests
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_matches_oracle_rgb(seed):
    """Plain RGB colors, one view, 37x23 (not a multiple of 16), camera grads included."""
    scene = make_scene(seed, N=90)
    out = compare(scene, grad_keys=PARAMS + ("viewmats",))
    assert (out["r_info"]["radii"] > 0).sum() > 20  # the scene is really on screen
    assert out["o_alpha"].max() > 0.5


@pytest.mark.parametrize("size", [(37, 23), (16, 16), (33, 17), (50, 1)])
def test_image_sizes(size):
    W, H = size
    scene = make_scene(10 + W, N=70, W=W, H=H)
    compare(scene)


@pytest.mark.parametrize("degree", [0, 1, 2, 3])
def test_sh_degrees(degree):
    scene = make_scene(20 + degree, N=70, W=40, H=30, sh_degree=degree, n_sh=16)
    out = compare(scene)
    # coefficients above the degree in use get exactly zero gradient
    if degree < 3:
        sc = _round32(scene)
        r_img, r_alp, _, r_in = _render(rasterize_reference, sc, torch.float32)
        v, va = _probe(sc, 1, 3)
        (g,) = _grads(r_img, r_alp, r_in, v, va, ["colors"])
        n = (degree + 1) ** 2
        assert g[:, n:].abs().max() == 0
        assert g[:, :n].abs().max() > 0
    assert out["rels"]["colors"] <= GRAD_TOL


def test_multi_view_backgrounds_and_depth():
    """Three views at once, per-view backgrounds, RGB+ED (expected depth as a 4th channel)."""
    scene = make_scene(30, N=80, W=35, H=27, C=3)
    bgs = torch.tensor([[0.2, 0.5, 0.9], [1.0, 0.0, 0.3], [0.0, 0.0, 0.0]], dtype=torch.float64)
    out = compare(scene, backgrounds=bgs, render_mode="RGB+ED", depth_channel=True,
                  grad_keys=PARAMS + ("viewmats",))
    r_img = out["r_img"]
    assert r_img.shape == (3, 27, 35, 4)
    # background shows where alpha is 0, and the depth channel is sum(w d)/alpha
    empty = out["o_alpha"][..., 0] == 0
    if empty.any():
        got = r_img[..., :3][empty].double()
        want = bgs[:, None, None, :].expand(3, 27, 35, 3)[empty]
        assert torch.allclose(got, want.float().double(), atol=1e-6)
    # each view differs (the views are really different)
    assert (out["o_img"][0] - out["o_img"][1]).abs().max() > 0.1


def test_colors_per_view():
    """Post-activation colors given per view ([C,N,D], D != 3)."""
    scene = make_scene(35, N=60, W=30, H=20, C=2)
    g = torch.Generator().manual_seed(7)
    scene["colors"] = torch.rand(2, 60, 5, generator=g, dtype=torch.float64)
    compare(scene)


def test_blank_and_empty_tiles():
    """All Gaussians squeezed into one corner tile: most tiles empty, and a blank scene."""
    scene = make_scene(40, N=30, W=70, H=50, scale_range=(0.01, 0.03))
    # put every Gaussian right in front of the camera, on the ray through pixel (5, 5)
    vm, K = scene["viewmats"][0], scene["Ks"][0]
    c2w = torch.linalg.inv(vm)
    ray = torch.linalg.solve(K, torch.tensor([5.0, 5.0, 1.0], dtype=torch.float64))
    depth = 3.0 + 0.5 * torch.rand(30, generator=scene["gen"], dtype=torch.float64)
    pc = ray[None, :] * depth[:, None] + 0.02 * torch.randn(30, 3, generator=scene["gen"],
                                                             dtype=torch.float64)
    scene["means"] = pc @ c2w[:3, :3].T + c2w[:3, 3]
    out = compare(scene)
    a = out["r_alpha"][0, :, :, 0]
    assert a[:16, :16].max() > 0.1 and a[32:, 32:].abs().max() == 0

    # blank: everything behind the camera -> background only, zero alpha, zero gradients
    blank = make_scene(41, N=25, W=37, H=23)
    vm = blank["viewmats"][0]
    c2w = torch.linalg.inv(vm)
    pc = torch.randn(25, 3, generator=blank["gen"], dtype=torch.float64) * 0.2
    pc[:, 2] -= 2.0
    blank["means"] = pc @ c2w[:3, :3].T + c2w[:3, 3]
    bg = torch.tensor([[0.25, 0.5, 0.75]], dtype=torch.float64)
    sc = _round32(blank)
    img, alp, info, inp = _render(rasterize_reference, sc, torch.float32, backgrounds=bg)
    assert (info["radii"] == 0).all()
    assert alp.abs().max() == 0
    assert torch.allclose(img, bg.float()[:, None, None, :].expand_as(img))
    v, va = _probe(sc, 1, 3)
    gs = _grads(img, alp, inp, v, va, PARAMS)
    assert all(float(g.abs().max()) == 0 for g in gs)
    # no Gaussians at all
    z = torch.zeros(0, 3)
    img, alp, info = rasterize_reference(z, torch.zeros(0, 4), z, torch.zeros(0), z,
                                         sc["viewmats"].float(), sc["Ks"].float(), 37, 23)
    assert img.shape == (1, 23, 37, 3) and img.abs().max() == 0 and alp.abs().max() == 0


def test_culling():
    """Behind the camera, beyond the far plane, off screen: radius 0, no effect on the image."""
    scene = make_scene(50, N=60, W=40, H=30, scale_range=(0.05, 0.3))
    vm = scene["viewmats"][0]
    c2w = torch.linalg.inv(vm)
    g = scene["gen"]

    def cam_to_world(pc):
        return pc @ c2w[:3, :3].T + c2w[:3, 3]

    extra_cam = torch.tensor([
        [0.0, 0.0, -1.0],   # behind
        [0.1, 0.1, -0.2],   # behind, close
        [0.0, 0.0, 0.005],  # in front of the near plane (0.01)
        [0.0, 0.0, 30.0],   # beyond far plane (set to 20 below)
        [40.0, 0.0, 4.0],   # far off to the right
        [0.0, -40.0, 4.0],  # far above
    ], dtype=torch.float64)
    n_extra = extra_cam.shape[0]
    full = dict(scene)
    full["means"] = torch.cat([scene["means"], cam_to_world(extra_cam)])
    full["quats"] = torch.cat([scene["quats"], torch.randn(n_extra, 4, generator=g,
                                                           dtype=torch.float64)])
    full["scales"] = torch.cat([scene["scales"], torch.full((n_extra, 3), 0.1,
                                                            dtype=torch.float64)])
    full["opacities"] = torch.cat([scene["opacities"], torch.full((n_extra,), 0.9,
                                                                  dtype=torch.float64)])
    full["colors"] = torch.cat([scene["colors"], torch.rand(n_extra, 3, generator=g,
                                                            dtype=torch.float64)])
    out = compare(full, far_plane=20.0)
    radii = out["r_info"]["radii"][0]
    assert (radii[-n_extra:] == 0).all()
    assert (radii[:-n_extra] > 0).sum() > 20
    # culled Gaussians change nothing and get no gradient
    sc_full, sc_base = _round32(full), _round32(scene)
    img_f, alp_f, _, in_f = _render(rasterize_reference, sc_full, torch.float32,
                                    far_plane=20.0)
    img_b, alp_b, _, _ = _render(rasterize_reference, sc_base, torch.float32, far_plane=20.0)
    assert torch.equal(img_f, img_b) and torch.equal(alp_f, alp_b)
    v, va = _probe(sc_full, 1, 3)
    for gr in _grads(img_f, alp_f, in_f, v, va, PARAMS):
        assert gr[-n_extra:].abs().max() == 0
    # info of culled entries is zeroed like gsplat's
    info = out["r_info"]
    assert info["means2d"][0, -n_extra:].abs().max() == 0
    assert info["conics"][0, -n_extra:].abs().max() == 0


def test_frustum_clamp_and_large_gaussians():
    """Big Gaussians whose centers lie outside the widened frustum still reach the image; the
    Jacobian uses the clamped x/z, y/z (gradients included)."""
    W, H = 36, 28
    scene = make_scene(60, N=40, W=W, H=H, scale_range=(0.05, 0.2))
    vm, K = scene["viewmats"][0], scene["Ks"][0]
    c2w = torch.linalg.inv(vm)
    fx, fy, cx, cy = float(K[0, 0]), float(K[1, 1]), float(K[0, 2]), float(K[1, 2])
    lim_xp = (W - cx) / fx + 0.3 * 0.5 * W / fx
    lim_xn = cx / fx + 0.3 * 0.5 * W / fx
    lim_yp = (H - cy) / fy + 0.3 * 0.5 * H / fy
    # distinct depths: equal depths would make the compositing order a coin toss of rounding
    zs = [3.0, 3.3, 3.6]
    ratios = [(1.3 * lim_xp, 0.05), (-1.3 * lim_xn, -0.05), (0.1, 1.3 * lim_yp)]
    pc = torch.tensor([[u * z, v * z, z] for (u, v), z in zip(ratios, zs)], dtype=torch.float64)
    g = scene["gen"]
    scene["means"] = torch.cat([scene["means"], pc @ c2w[:3, :3].T + c2w[:3, 3]])
    scene["quats"] = torch.cat([scene["quats"], torch.randn(3, 4, generator=g,
                                                            dtype=torch.float64)])
    scene["scales"] = torch.cat([scene["scales"], torch.full((3, 3), 0.8, dtype=torch.float64)])
    scene["opacities"] = torch.cat([scene["opacities"], torch.full((3,), 0.9,
                                                                   dtype=torch.float64)])
    scene["colors"] = torch.cat([scene["colors"], torch.rand(3, 3, generator=g,
                                                             dtype=torch.float64)])
    out = compare(scene, grad_keys=PARAMS + ("viewmats",))
    radii = out["r_info"]["radii"][0]
    assert (radii[-3:] > 0).all(), "the big off-axis Gaussians should be visible"
    m2 = out["r_info"]["means2d"][0, -3:]
    assert m2[0, 0] > W and m2[1, 0] < 0 and m2[2, 1] > H
    # the clamp matters: without it (huge limits) the oracle image is different
    assert out["o_alpha"][0, :, :, 0].max() > 0.3


def test_saturation_stop_rule():
    """Stacks of near-opaque Gaussians: pixels stop before the Gaussian that takes T <= 1e-4."""
    g = torch.Generator().manual_seed(70)
    scene = make_scene(70, N=20, W=32, H=24, opacity_range=(0.9, 0.99), scale_range=(0.3, 0.6))
    vm = scene["viewmats"][0]
    c2w = torch.linalg.inv(vm)
    pc = torch.cat([0.15 * torch.randn(30, 2, generator=g, dtype=torch.float64),
                    3.0 + 2.0 * torch.rand(30, 1, generator=g, dtype=torch.float64)], dim=1)
    scene["means"] = torch.cat([scene["means"], pc @ c2w[:3, :3].T + c2w[:3, 3]])
    scene["quats"] = torch.cat([scene["quats"], torch.randn(30, 4, generator=g,
                                                            dtype=torch.float64)])
    scene["scales"] = torch.cat([scene["scales"], 0.3 + 0.3 * torch.rand(30, 3, generator=g,
                                                                         dtype=torch.float64)])
    scene["opacities"] = torch.cat([scene["opacities"], 0.99 + 0.0099 * torch.rand(
        30, generator=g, dtype=torch.float64)])
    scene["colors"] = torch.cat([scene["colors"], torch.rand(30, 3, generator=g,
                                                             dtype=torch.float64)])
    bg = torch.tensor([[0.3, 0.6, 0.9]], dtype=torch.float64)
    out = compare(scene, backgrounds=bg)
    n_stopped = out["o_meta"]["n_stopped"][0]
    assert n_stopped > 50, f"only {n_stopped} pixels saturated: the case is not exercised"
    # without the stop rule the image is measurably different, so the test can tell
    sc = _round32(scene)
    o_img_nostop, _, _, _ = _render(oracle_render, sc, torch.float64, stop_T=None,
                                    backgrounds=bg)
    assert (o_img_nostop - out["r_img"].double()).abs().max() > 10 * IMG_TOL


def test_oracle_detects_rule_changes():
    """The comparison is sensitive: a different eps2d shows far above the tolerance."""
    scene = _round32(make_scene(80, N=60, W=40, H=30, opacity_range=(0.8, 0.99)))
    r_img, _, _, _ = _render(rasterize_reference, scene, torch.float32)
    o_eps, _, _, _ = _render(oracle_render, scene, torch.float64, eps2d=0.25)
    assert (r_img.double() - o_eps).abs().max() > 100 * IMG_TOL
    o_ok, _, _, _ = _render(oracle_render, scene, torch.float64)
    assert (r_img.double() - o_ok).abs().max() <= IMG_TOL


def test_2d_stage_reach_rule_and_alpha_cap():
    """The 2D stage alone (rasterize_to_pixels_reference vs oracle_composite), on hand-built
    Gaussians: (1) gsplat's reach rule: an opaque isotropic Gaussian whose radius box ends just
    before a tile border does not reach the next tile although its alpha there is still above
    1/255; (2) the 0.999 alpha cap: a Gaussian centered on a pixel center with opacity 0.9999.
    Image and gradients (2D means, conics, colors, opacities) are compared."""
    from bytesplat_ns.raster.reference import rasterize_to_pixels_reference

    var = 2.95**2  # pixel variance of the (blurred) 2D covariance: radius = ceil(3 * 2.95) = 9
    means2d = torch.tensor([[32.0 - 9.0 - 0.1, 20.3], [40.2, 16.0 + 9.0 + 0.2],
                            [10.5, 9.7], [44.5, 6.5]], dtype=torch.float64)
    conics = torch.tensor([[1 / var, 0.0, 1 / var]] * 2 + [[0.8, 0.3, 0.5], [1.0, 0.0, 1.0]],
                          dtype=torch.float64)
    radii = torch.tensor([9, 9, 4, 4])
    opac = torch.tensor([0.99, 0.99, 0.7, 0.9999], dtype=torch.float64)
    colors = torch.tensor([[1.0, 0.5, 0.2], [0.1, 0.9, 0.4], [0.3, 0.3, 0.9], [0.9, 0.1, 0.6]],
                          dtype=torch.float64)
    depths = torch.tensor([2.0, 3.0, 4.0, 1.0], dtype=torch.float64)
    bg = torch.tensor([0.2, 0.4, 0.1], dtype=torch.float64)
    W, H = 50, 40
    g = torch.Generator().manual_seed(3)
    v = torch.randn(H, W, 3, generator=g, dtype=torch.float64)
    va = torch.randn(H, W, 1, generator=g, dtype=torch.float64)

    r_in = [t.float().requires_grad_() for t in (means2d, conics, colors, opac)]
    img, alp = rasterize_to_pixels_reference(
        r_in[0][None], r_in[1][None], r_in[2][None], r_in[3][None], radii[None].int(),
        depths[None].float(), W, H, 16, backgrounds=bg[None].float())
    o_in = [t.clone().requires_grad_() for t in (means2d, conics, colors, opac)]
    o_img, o_alp, _ = oracle_composite(o_in[0], o_in[1], o_in[2], o_in[3], radii, depths, W, H,
                                       background=bg)
    assert (img[0].double() - o_img).abs().max() <= IMG_TOL
    assert (alp[0].double() - o_alp).abs().max() <= IMG_TOL
    r_g = torch.autograd.grad((img[0] * v.float()).sum() + (alp[0] * va.float()).sum(), r_in)
    o_g = torch.autograd.grad((o_img * v).sum() + (o_alp * va).sum(), o_in)
    for name, a, b in zip(("means2d", "conics", "colors", "opacities"), r_g, o_g):
        assert b.norm() > 1e-3, name
        assert _rel(a, b) <= GRAD_TOL, (name, _rel(a, b))

    with torch.no_grad():
        o_all, _, _ = oracle_composite(means2d, conics, colors, opac, radii, depths, W, H,
                                       background=bg, reach_rule=False)
        o_nocap, _, _ = oracle_composite(means2d, conics, colors, opac, radii, depths, W, H,
                                         background=bg, alpha_max=1.0)
    diff = (o_all - o_img).abs().amax(-1)
    # the rule matters exactly beyond the box borders: column 32 (first of tile x=2) for the
    # first Gaussian, row 15 (last of tile y=0) for the second
    assert diff[:, 32].max() > 1e-3 and diff[15, :].max() > 1e-3
    # the cap matters at the pixel under the fourth Gaussian's center
    assert (o_nocap - o_img)[6, 44].abs().max() > 1e-4


def test_float64_reference_is_tight():
    """In float64 the reference and the oracle agree to rounding (same rules, same math)."""
    scene = _round32(make_scene(90, N=70, W=37, H=23, sh_degree=3))
    r_img, r_alp, r_info, r_in = _render(rasterize_reference, scene, torch.float64)
    o_img, o_alp, _, o_in = _render(oracle_render, scene, torch.float64)
    assert r_img.dtype == torch.float64 and r_info["means2d"].dtype == torch.float64
    assert (r_img - o_img).abs().max() <= 1e-12
    assert (r_alp - o_alp).abs().max() <= 1e-12
    v, va = _probe(scene, 1, 3)
    for name, a, b in zip(PARAMS, _grads(r_img, r_alp, r_in, v, va, PARAMS),
                          _grads(o_img, o_alp, o_in, v, va, PARAMS)):
        assert _rel(a, b) <= 1e-10, name


def test_absgrad_is_sum_of_per_pixel_abs_grads():
    """info["means2d"].absgrad == sum over pixels of |d(pixel's term)/d(means2d)| (explicit)."""
    scene = _round32(make_scene(100, N=6, W=20, H=14, scale_range=(0.15, 0.4),
                                opacity_range=(0.5, 0.95)))
    bg = torch.tensor([[0.1, 0.2, 0.3]], dtype=torch.float64)
    r_img, r_alp, r_info, r_in = _render(rasterize_reference, scene, torch.float32,
                                         absgrad=True, backgrounds=bg)
    r_info["means2d"].retain_grad()
    v, va = _probe(scene, 1, 3)
    loss = (r_img * v.float()).sum() + (r_alp * va.float()).sum()
    loss.backward()
    absgrad = r_info["means2d"].absgrad
    grad = r_info["means2d"].grad
    assert absgrad.shape == (1, 6, 2)

    o_img, o_alp, o_meta, _ = _render(oracle_render, scene, torch.float64, means2d_leaf=True,
                                      backgrounds=bg)
    leaf = o_meta["means2d"][0]
    explicit = torch.zeros(6, 2, dtype=torch.float64)
    for y in range(14):
        for x in range(20):
            term = (o_img[0, y, x] * v[0, y, x]).sum() + o_alp[0, y, x, 0] * va[0, y, x, 0]
            (gp,) = torch.autograd.grad(term, leaf, retain_graph=True, allow_unused=True)
            if gp is not None:
                explicit += gp.abs()
    vis = r_info["radii"][0] > 0
    assert vis.sum() >= 4
    assert _rel(absgrad[0][vis], explicit[vis]) <= GRAD_TOL
    # it is not just |grad|: per-pixel terms of both signs cancel in grad but not in absgrad
    assert (absgrad[0] >= grad[0].abs() - 1e-6).all()
    assert (absgrad[0] - grad[0].abs()).max() > 1e-3

    # and it is recomputed (not accumulated) on a second forward/backward
    r_img, r_alp, r_info2, _ = _render(rasterize_reference, scene, torch.float32, absgrad=True,
                                       backgrounds=bg)
    ((r_img * v.float()).sum() + (r_alp * va.float()).sum()).backward()
    assert torch.allclose(r_info2["means2d"].absgrad, absgrad, rtol=1e-6, atol=0)


def test_absgrad_hook_frees_the_step():
    """The absgrad hook must not keep means2d alive: a strong reference from the hook (stored in
    means2d's own autograd node) is a cycle the garbage collector cannot see, and every training
    step's means2d, its gradient, absgrad and graph nodes leaked (GBs over the CPU quick start)."""
    import gc
    import weakref

    scene = _round32(make_scene(100, N=6, W=20, H=14, scale_range=(0.15, 0.4), opacity_range=(0.5, 0.95)))
    r_img, r_alp, r_info, _ = _render(rasterize_reference, scene, torch.float32, absgrad=True)
    r_info["means2d"].retain_grad()
    (r_img.sum() + r_alp.sum()).backward()
    assert r_info["means2d"].absgrad.abs().sum() > 0
    dead = weakref.ref(r_info["means2d"])
    del r_img, r_alp, r_info
    gc.collect()
    assert dead() is None


def test_front_end_dispatch():
    scene = _round32(make_scene(110, N=30, W=24, H=20))
    a, _, _, _ = _render(rasterize_reference, scene, torch.float32)
    b, _, info, _ = _render(lambda *args, **kw: rasterize(*args, backend="reference", **kw),
                            scene, torch.float32)
    assert torch.equal(a, b)
    for key in ("means2d", "radii", "depths", "conics", "width", "height", "n_cameras",
                "tile_size", "gaussian_ids", "camera_ids"):
        assert key in info, key
    assert info["gaussian_ids"] is None and info["camera_ids"] is None
    assert info["n_cameras"] == 1 and info["width"] == 24 and info["height"] == 20
    assert info["means2d"].shape == (1, 30, 2) and not info["means2d"].is_leaf


@pytest.mark.parametrize("absgrad", [False, True])
def test_default_strategy_hooks(absgrad):
    """gsplat's DefaultStrategy reads info["means2d"].grad / .absgrad, radii, width, height."""
    from gsplat.strategy import DefaultStrategy

    scene = _round32(make_scene(120, N=50, W=40, H=30, sh_degree=1, n_sh=4))
    N = 50
    params = torch.nn.ParameterDict({
        "means": torch.nn.Parameter(scene["means"].float()),
        "scales": torch.nn.Parameter(torch.log(scene["scales"].float())),
        "quats": torch.nn.Parameter(scene["quats"].float()),
        "opacities": torch.nn.Parameter(torch.logit(scene["opacities"].float())),
        "features_dc": torch.nn.Parameter(scene["colors"][:, 0].float()),
        "features_rest": torch.nn.Parameter(scene["colors"][:, 1:].float()),
    })
    optimizers = {k: torch.optim.Adam([{"params": [p], "lr": 1e-3, "name": k}], eps=1e-15)
                  for k, p in params.items()}
    strategy = DefaultStrategy(refine_start_iter=1, refine_every=2, reset_every=1000,
                               grow_grad2d=1e-9, absgrad=absgrad, verbose=False)
    strategy.check_sanity(params, optimizers)
    state = strategy.initialize_state(scene_scale=1.0)

    def step(it):
        colors = torch.cat([params["features_dc"][:, None], params["features_rest"]], dim=1)
        render, alpha, info = rasterize_reference(
            params["means"], params["quats"], torch.exp(params["scales"]),
            torch.sigmoid(params["opacities"]), colors, scene["viewmats"].float(),
            scene["Ks"].float(), 40, 30, sh_degree=1, absgrad=absgrad)
        strategy.step_pre_backward(params, optimizers, state, it, info)
        loss = (render - 0.5).abs().mean() + alpha.mean()
        loss.backward()
        strategy.step_post_backward(params, optimizers, state, it, info, packed=False)
        for opt in optimizers.values():
            opt.step()
            opt.zero_grad(set_to_none=True)
        return info

    info = step(1)
    vis = info["radii"][0] > 0
    assert vis.sum() > 10
    assert torch.equal(state["count"], vis.float())
    key = "absgrad" if absgrad else "grad"
    g = getattr(info["means2d"], key).clone()
    g[..., 0] *= 40 / 2.0
    g[..., 1] *= 30 / 2.0
    assert torch.allclose(state["grad2d"], g[0].norm(dim=-1) * vis, rtol=1e-5, atol=1e-12)
    assert (state["grad2d"][vis] > 0).float().mean() > 0.8 and (state["grad2d"][~vis] == 0).all()
    # a refine step (grow + prune) runs on our info and keeps params and optimizers in sync
    step(2)
    assert params["means"].shape[0] > N
    for k, p in params.items():
        assert optimizers[k].param_groups[0]["params"][0] is p
    step(3)  # renders with the grown set


def test_dtype_device_contract():
    """Outputs follow the inputs' dtype/device; works without any grad (viewer path)."""
    scene = _round32(make_scene(130, N=40, W=30, H=22, sh_degree=2))
    with torch.no_grad():
        img, alp, info = _render(rasterize_reference, scene, torch.float32, grad_keys=())[:3]
    assert img.dtype == alp.dtype == torch.float32 and img.device.type == "cpu"
    assert info["depths"].shape == (1, 40) and info["conics"].shape == (1, 40, 3)


def test_cpu_timing_report(capsys):
    """Not a timed test: prints one forward+backward of 3000 Gaussians at 128x96 (SH degree 3)."""
    scene = make_scene(140, N=3000, W=128, H=96, sh_degree=3, scale_range=(0.01, 0.06))
    sc = _round32(scene)
    best_f = best_b = float("inf")
    for _ in range(4):
        t0 = time.perf_counter()
        img, alp, info, inp = _render(rasterize_reference, sc, torch.float32)
        t1 = time.perf_counter()
        ((img * 0.5).sum() + alp.sum()).backward()
        t2 = time.perf_counter()
        best_f, best_b = min(best_f, t1 - t0), min(best_b, t2 - t1)
    vis = int((info["radii"] > 0).sum())
    with capsys.disabled():
        print(f"\n[reference CPU] 3000 Gaussians ({vis} visible) 128x96 SH3, "
              f"{torch.get_num_threads()} threads: fwd {best_f * 1e3:.1f} ms, "
              f"bwd {best_b * 1e3:.1f} ms, fwd+bwd {(best_f + best_b) * 1e3:.1f} ms (best of 4)")
    assert float(alp.mean()) > 0.2


def test_conventions_match_gsplat_torch_impl():
    """Cross-check against gsplat 1.4.0's own pure-PyTorch implementations (run on CPU):
    projection (radii, 2D means, depths, conics), SH colors for degrees 0..3 and the per-tile
    Gaussian lists in depth order."""
    _ti = pytest.importorskip("gsplat.cuda._torch_impl")
    from bytesplat_ns.raster.projection import camera_centers, project_gaussians
    from bytesplat_ns.raster.sh import eval_sh
    from bytesplat_ns.raster.tiles import bin_rects, tile_grid, tile_rects

    scene = make_scene(150, N=60, W=45, H=33, C=2, sh_degree=3)
    m, q, s = scene["means"], scene["quats"], scene["scales"]
    vm, K, W, H = scene["viewmats"], scene["Ks"], scene["W"], scene["H"]
    covars, _ = _ti._quat_scale_to_covar_preci(q, s, compute_preci=False)
    g_radii, g_m2d, g_depth, g_conic, _ = _ti._fully_fused_projection(m, covars, vm, K, W, H)
    p = project_gaussians(m, q, s, vm, K, W, H)
    assert torch.equal(p.radii, g_radii)
    vis = p.radii > 0
    assert vis.sum() > 30
    assert torch.allclose(p.means2d[vis], g_m2d[vis], rtol=0, atol=1e-9)
    assert torch.allclose(p.depths[vis], g_depth[vis], rtol=0, atol=1e-12)
    assert torch.allclose(p.conics[vis], g_conic[vis], rtol=1e-9, atol=1e-12)

    dirs = m[None] - camera_centers(vm)[:, None]
    for degree in range(4):
        mine = eval_sh(degree, dirs, scene["colors"].expand(2, -1, -1, -1))
        theirs = _ti._spherical_harmonics(degree, dirs, scene["colors"].expand(2, -1, -1, -1))
        assert torch.allclose(mine, theirs, rtol=0, atol=1e-12), degree

    # tile lists (float32, as the kernels see them)
    m2d32, r, d32 = p.means2d.float(), p.radii, p.depths.float()
    tw, th = tile_grid(W, H, 16)
    tiles_per_gauss, isect_ids, flatten_ids = _ti._isect_tiles(m2d32, r, d32, 16, tw, th)
    bins = bin_rects(tile_rects(m2d32, r, 16, tw, th), d32, tw, th)
    rect = tile_rects(m2d32, r, 16, tw, th)
    mine_tpg = (rect[..., 1] - rect[..., 0]) * (rect[..., 3] - rect[..., 2])
    assert torch.equal(mine_tpg.int(), tiles_per_gauss)
    assert torch.equal(bins.flatten_ids, flatten_ids.long())
