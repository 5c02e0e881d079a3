"""SH coefficients kept as two tensors, DC [N,3] and rest [N,K-1,3] (``raster.sh.ShCoefficients``),
on CPU: the split twin (``split_sh_colors_torch``, the oracle of ``cuda/sh_views_*.cu``) against the
stacked path it replaces (``torch.cat`` + ``multiview_sh_colors_torch``), when ``fused.project``
hands them to the kernel, and the model passing its parameters through unstacked while training as
before. The kernel against the twin: tests/raster/test_sh_split_gpu.py."""

from __future__ import annotations

import pytest
import torch

from bytesplat_ns.raster import _wrapper
from bytesplat_ns.raster import fused as F
from bytesplat_ns.raster.sh import ShCoefficients, stacked_coefficients
from bytesplat_ns.raster.sh_views import (
    multiview_sh_colors_torch,
    split_sh_colors_torch,
)
from tests.helpers.model_steps import (
    make_camera,
    make_model,
    model_train_step,
    seed_cloud,
    target_image,
)
from tests.helpers.sh_split_inputs import split_sh_inputs


def _colors_and_grads(fn, means, dc, rest, viewmats, radii, degree):
    m, d, r = (t.clone().requires_grad_(True) for t in (means, dc, rest))
    colors = fn(m, d, r, viewmats, radii, degree)
    weights = torch.randn(colors.shape, generator=torch.Generator().manual_seed(7))
    (colors * weights).sum().backward()
    # degree 0 does not depend on the direction: autograd leaves the means without a gradient
    grads = [t.grad if t.grad is not None else torch.zeros_like(t) for t in (m, d, r)]
    return colors.detach(), grads


def _stacked_path(m, d, r, viewmats, radii, degree):
    return multiview_sh_colors_torch(m, torch.cat((d[:, None], r), 1), viewmats, radii, degree)


@pytest.mark.parametrize("degree,K,C", [(3, 16, 1), (3, 16, 3), (2, 16, 1), (2, 9, 2), (1, 16, 1), (0, 16, 2), (0, 1, 1)])
def test_split_twin_equals_the_stacked_path(degree, K, C):
    means, dc, rest, viewmats, radii = split_sh_inputs(400, C, K, seed=degree * 10 + C)
    got, (gm, gd, gr) = _colors_and_grads(split_sh_colors_torch, means, dc, rest, viewmats, radii, degree)
    want, (wm, wd, wr) = _colors_and_grads(_stacked_path, means, dc, rest, viewmats, radii, degree)
    assert got.shape == (C, 400, 3)
    assert torch.allclose(got, want, atol=1e-6)
    assert (got[radii <= 0] == 0).all() and (got[radii > 0] == 0).any()  # culled, and clamped where seen
    for g, w in ((gm, wm), (gd, wd), (gr, wr)):
        assert torch.allclose(g, w, atol=1e-6 * max(1.0, w.abs().amax().item() if w.numel() else 0.0))
    assert gd.abs().sum() > 0 and (gd[(radii > 0).sum(0) == 0] == 0).all()  # culled everywhere: no gradient
    n = (degree + 1) ** 2
    assert (gr[:, n - 1:] == 0).all()  # the bases past the degree in use
    if degree > 0:
        assert gr[:, : n - 1].abs().sum() > 0 and gm.abs().sum() > 0  # the means' through the direction


def test_split_twin_rejects_too_few_coefficients():
    means, dc, rest, viewmats, radii = split_sh_inputs(10, 1, 4, seed=0)
    with pytest.raises(ValueError, match="needs 9 coefficients"):
        split_sh_colors_torch(means, dc, rest, viewmats, radii, 2)


def test_stacked_coefficients_order_dc_first():
    dc, rest = torch.randn(5, 3), torch.randn(5, 15, 3)
    stacked = stacked_coefficients(ShCoefficients(dc, rest))
    assert stacked.shape == (5, 16, 3) and torch.equal(stacked[:, 0], dc) and torch.equal(stacked[:, 1:], rest)
    plain = torch.randn(5, 16, 3)
    assert stacked_coefficients(plain) is plain


def test_project_hands_split_coefficients_to_the_kernel_for_fixed_cameras(monkeypatch):
    """``ShCoefficients`` take the SH kernel for one camera too (the training step), stacked
    coefficients only for several; optimised cameras, float64 and a missing extension keep gsplat's."""
    monkeypatch.setattr(_wrapper, "_optional_ops", lambda: object())
    means, dc, rest, viewmats, _ = split_sh_inputs(20, 1, 16, seed=1)
    split = ShCoefficients(dc, rest)
    assert F._sh_kernel_serves(means, split, viewmats)
    assert F._sh_kernel_serves(means, split.stacked(), viewmats.expand(2, -1, -1))
    assert not F._sh_kernel_serves(means, split.stacked(), viewmats)
    assert not F._sh_kernel_serves(means, split, viewmats.clone().requires_grad_(True))
    assert not F._sh_kernel_serves(means.double(), ShCoefficients(dc.double(), rest.double()), viewmats)
    monkeypatch.setattr(_wrapper, "_optional_ops", lambda: None)
    assert not F._sh_kernel_serves(means, split, viewmats)


def test_project_torch_takes_split_coefficients_as_stacked():
    means, dc, rest, viewmats, _ = split_sh_inputs(60, 1, 16, seed=2)
    quats, scales = torch.randn(60, 4), torch.full((60, 3), 0.05)
    Ks = torch.tensor([[[40.0, 0, 32], [0, 40.0, 24], [0, 0, 1]]])
    args = {"sh_degree": 3, "near_plane": 0.01, "far_plane": 1e10, "eps2d": 0.3, "projection": "torch"}
    a = F.project(means, quats, scales, torch.rand(60), ShCoefficients(dc, rest), viewmats, Ks, 64, 48, **args)
    b = F.project(means, quats, scales, torch.rand(60), torch.cat((dc[:, None], rest), 1), viewmats, Ks, 64, 48, **args)
    assert torch.equal(a[4], b[4])
    with pytest.raises(ValueError, match="sh_degree"):
        F.project(means, quats, scales, torch.rand(60), ShCoefficients(dc, rest), viewmats, Ks, 64, 48,
                  **{**args, "sh_degree": None})


def _stacked_colors(self, gaussians):
    """The model's colors as they were before ShCoefficients: one torch.cat per step."""
    coefficients = torch.cat((gaussians["features_dc"][:, None, :], gaussians["features_rest"]), dim=1)
    return coefficients, min(self.step // self.config.sh_degree_interval, self.config.sh_degree)


def test_model_passes_its_sh_parameters_unstacked():
    model = make_model("reference", seed_cloud())
    model._backend = "fused"  # the fused training path's arguments (nothing is rendered here)
    model.train()
    model._get_background_color = lambda: torch.zeros(3)
    outputs = model(make_camera())
    (raster_args, sh_degree, _, _) = outputs["fused_pending"]
    colors = raster_args[4]
    assert isinstance(colors, ShCoefficients) and sh_degree == 0
    assert colors.dc is model.gauss_params["features_dc"] and colors.rest is model.gauss_params["features_rest"]


def test_model_trains_as_with_stacked_coefficients():
    """Six reference-backend steps through SH degrees 0, 1 and 2 (sh_degree_interval 2): the same
    losses and gradients as the model stacking its coefficients each step."""
    image, bg = target_image(), torch.tensor([0.3, 0.6, 0.2])
    runs = {}
    for name in ("split", "stacked"):
        model = make_model("reference", seed_cloud())
        if name == "stacked":
            model._colors_and_sh_degree = _stacked_colors.__get__(model)
        opts = {n: torch.optim.Adam([p], lr=1e-2, eps=1e-15) for n, p in model.gauss_params.items()}
        runs[name] = [model_train_step(model, make_camera(), image, step, bg, optimizers=opts) for step in range(6)]
    for s, (a, b) in enumerate(zip(runs["split"], runs["stacked"])):  # the same ops: bit for bit
        assert a["loss"] == b["loss"], s
        for n in a["grads"]:
            assert torch.equal(a["grads"][n], b["grads"][n]), (s, n)
    assert runs["split"][-1]["grads"]["features_rest"][:, :8].abs().sum() > 0  # degree 2 reached
    assert (runs["split"][-1]["grads"]["features_rest"][:, 8:] == 0).all()
    assert runs["split"][-1]["loss"] < runs["split"][0]["loss"]
