"""Spherical-harmonics colors of N Gaussians seen from C cameras, in one kernel launch each way.

gsplat's ``spherical_harmonics`` takes per-camera coefficients [C,N,K,3]: for C > 1 views of the
same Gaussians the projection either materialises that broadcast (36 GiB at 50M Gaussians, SH 3, 4
views) or calls it once per camera, which reads the coefficients C times and makes autograd add C
coefficient-sized gradients. ``multiview_sh_colors`` (``cuda/sh_views.cu``) gives the same colors
with one thread per Gaussian walking the cameras: coefficients read once, their gradient and the
means' written once. ``multiview_sh_colors_torch`` is its pure-PyTorch twin (the tests' oracle).
"""

from __future__ import annotations

import torch
from torch import Tensor


def multiview_sh_colors_torch(means: Tensor, coeffs: Tensor, viewmats: Tensor, radii: Tensor, degree: int) -> Tensor:
    """[C,N,3]: ``clamp_min(SH(d) + 0.5, 0)`` with d from camera c's center to each mean, 0 where
    ``radii`` [C,N] <= 0. ``means`` [N,3], ``coeffs`` [N,K,3], ``viewmats`` [C,4,4] rigid world-to-camera."""
    from bytesplat_ns.raster.projection import rigid_camera_centers
    from bytesplat_ns.raster.sh import sh_to_color

    C = viewmats.shape[0]
    dirs = means[None] - rigid_camera_centers(viewmats)[:, None]
    colors = sh_to_color(degree, dirs, coeffs.expand(C, -1, -1, -1))
    return torch.where((radii > 0)[..., None], colors, torch.zeros_like(colors))


class _MultiViewSH(torch.autograd.Function):
    @staticmethod
    def forward(ctx, means, coeffs, viewmats, radii, degree):  # type: ignore[override]
        from bytesplat_ns.raster._build import load_extension

        args = (means.contiguous(), coeffs.contiguous(), viewmats.contiguous(), radii.to(torch.int32).contiguous())
        ctx.save_for_backward(*args)
        ctx.degree = degree
        return load_extension().sh_views_fwd(*args, int(degree))

    @staticmethod
    def backward(ctx, v_colors):  # type: ignore[override]
        from bytesplat_ns.raster._build import load_extension

        v_coeffs, v_means = load_extension().sh_views_bwd(*ctx.saved_tensors, ctx.degree, v_colors.contiguous())
        return v_means, v_coeffs, None, None, None


def multiview_sh_colors(means: Tensor, coeffs: Tensor, viewmats: Tensor, radii: Tensor, degree: int) -> Tensor:
    """What :func:`multiview_sh_colors_torch` gives, by the CUDA kernels (float32 CUDA tensors);
    differentiable with respect to ``means`` and ``coeffs`` (not the cameras)."""
    if viewmats.requires_grad:
        raise ValueError("multiview_sh_colors has no camera gradient; use the per-camera path for optimised cameras")
    return _MultiViewSH.apply(means, coeffs, viewmats.detach(), radii.detach(), int(degree))
