"""bytesplat-bench step's bytesplat inputs (``step.model_inputs``) are the model's: the SH parameters
unstacked and the quaternions as they are, rendering and differentiating as splatfacto's normalised,
stacked ones (``step.activated``) do (CPU, the reference rasterizer: its projection normalises)."""

from __future__ import annotations

import torch

from bytesplat_ns.bench import step
from bytesplat_ns.bench.synthetic import synthetic_scene
from bytesplat_ns.raster import rasterize
from bytesplat_ns.raster.sh import ShCoefficients


def _render_and_grads(inputs_of, params, scene):
    params = {n: torch.nn.Parameter(p.detach().clone()) for n, p in params.items()}
    render, _, _ = rasterize(*inputs_of(params), scene["viewmats"], scene["Ks"], scene["width"], scene["height"],
                             backend="reference", sh_degree=3)
    weights = torch.linspace(-1, 1, render.numel()).view_as(render)
    (render * weights).sum().backward()
    return render.detach(), {n: p.grad for n, p in params.items()}


def test_model_inputs_are_the_parameters_themselves():
    params = step.initial_params(synthetic_scene(50, 32, 24, 3, seed=0, device="cpu"))
    means, quats, _, _, colors = step.model_inputs(params)
    assert means is params["means"] and quats is params["quats"]
    assert isinstance(colors, ShCoefficients)
    assert colors.dc is params["features_dc"] and colors.rest is params["features_rest"]


def test_model_inputs_render_and_differentiate_as_splatfactos():
    scene = synthetic_scene(300, 64, 48, 3, seed=2, device="cpu")
    params = step.initial_params(scene)
    with torch.no_grad():  # quaternions far from unit length: the projection's own normalisation counts
        params["quats"].mul_(torch.linspace(0.3, 4.0, 300)[:, None])
    got, got_grads = _render_and_grads(step.model_inputs, params, scene)
    want, want_grads = _render_and_grads(step.activated, params, scene)
    assert want.abs().sum() > 0
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    for name, w in want_grads.items():
        assert w.abs().sum() > 0, name
        torch.testing.assert_close(got_grads[name], w, rtol=1e-4, atol=1e-4 * w.abs().max().item(), msg=name)
