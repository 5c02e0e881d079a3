"""On a GPU: the reference and gsplat backends give the same image and gradients (same scene, seed).

Skipped without CUDA. gsplat JIT-builds its kernels on first use (minutes on a fresh machine).
"""

from __future__ import annotations

import pytest
import torch

from bytesplat_ns.raster import rasterize
from tests.test_reference_raster import make_scene

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

PARAMS = ("means", "quats", "scales", "opacities", "colors")


def render(scene, backend, sh_degree, backgrounds, weights=None):
    inputs = {k: scene[k].float().cuda().requires_grad_(True) for k in PARAMS}
    image, alpha, _ = rasterize(
        inputs["means"], inputs["quats"], inputs["scales"], inputs["opacities"], inputs["colors"],
        scene["viewmats"].float().cuda(), scene["Ks"].float().cuda(), scene["W"], scene["H"],
        backend=backend, sh_degree=sh_degree, backgrounds=backgrounds, render_mode="RGB+ED",
    )
    out = torch.cat([image, alpha], dim=-1)
    if weights is None:
        weights = torch.randn_like(out)
    grads = torch.autograd.grad((out * weights).sum(), [inputs[k] for k in PARAMS])
    return out.detach(), dict(zip(PARAMS, grads)), weights


@pytest.mark.parametrize(
    "seed,width,height,views,sh_degree,with_background",
    [(0, 64, 48, 1, None, False), (1, 37, 23, 3, 3, True), (2, 160, 97, 2, 1, False), (3, 250, 130, 2, 2, True)],
)
def test_reference_matches_gsplat(seed, width, height, views, sh_degree, with_background):
    scene = make_scene(seed, N=400, W=width, H=height, C=views, sh_degree=sh_degree)
    backgrounds = torch.rand(views, 3, device="cuda") if with_background else None
    ours, our_grads, weights = render(scene, "reference", sh_degree, backgrounds)
    theirs, their_grads, _ = render(scene, "gsplat", sh_degree, backgrounds, weights)
    color_error = (ours[..., :3] - theirs[..., :3]).abs().max().item()
    assert color_error <= 1e-5, color_error
    alpha_error = (ours[..., -1] - theirs[..., -1]).abs().max().item()
    assert alpha_error <= 1e-5, alpha_error
    assert ours[..., :3].abs().max() > 0.05  # the scene is actually visible
    for name in PARAMS:
        a, b = our_grads[name], their_grads[name]
        relative = ((a - b).norm() / b.norm().clamp_min(1e-12)).item()
        assert relative <= 1e-4, (name, relative)
