"""The multi-camera SH twin (``raster.sh_views.multiview_sh_colors_torch``, the oracle of the
CUDA kernels in tests/raster/test_sh_views_gpu.py) against the reference rasterizer's color rule."""

from __future__ import annotations

import torch

from bytesplat_ns.raster.projection import camera_centers
from bytesplat_ns.raster.sh import sh_to_color
from bytesplat_ns.raster.sh_views import multiview_sh_colors_torch
from tests.helpers.distributed_worker import look_at


def test_twin_is_the_reference_color_rule_per_camera_masked():
    g = torch.Generator().manual_seed(0)
    N, C = 500, 3
    means = torch.randn(N, 3, generator=g)
    coeffs = torch.randn(N, 16, 3, generator=g) * 0.5
    viewmats = torch.stack([look_at((float(x), 0.5, -4.0)) for x in (-1.0, 0.0, 2.0)])
    radii = torch.randint(0, 3, (C, N), generator=g, dtype=torch.int32)
    for degree in range(4):
        got = multiview_sh_colors_torch(means, coeffs, viewmats, radii, degree)
        assert got.shape == (C, N, 3)
        for c in range(C):
            want = sh_to_color(degree, means - camera_centers(viewmats)[c], coeffs)
            seen = radii[c] > 0
            assert torch.allclose(got[c][seen], want[seen], atol=1e-5)
            assert (got[c][~seen] == 0).all()
