"""Spherical-harmonics colors of N Gaussians seen from C cameras, in one kernel launch each way.

gsplat's ``spherical_harmonics`` takes per-camera coefficients [C,N,K,3]: for C > 1 views of the
same Gaussians the projection either materialises that broadcast (36 GiB at 50M Gaussians, SH 3, 4
views) or calls it once per camera, which reads the coefficients C times and makes autograd add C
coefficient-sized gradients. ``multiview_sh_colors`` (``cuda/sh_views.cu``) gives the same colors
with one thread per Gaussian walking the cameras: coefficients read once, their gradient and the
means' written once. ``multiview_sh_colors_torch`` (``raster._torch_impl``) is its pure-PyTorch twin.
"""

from __future__ import annotations

from torch import Tensor

from bytesplat_ns.raster._torch_impl import multiview_sh_colors_torch
from bytesplat_ns.raster._wrapper import _MultiViewSH

__all__ = ["multiview_sh_colors", "multiview_sh_colors_torch"]


def multiview_sh_colors(means: Tensor, coeffs: Tensor, viewmats: Tensor, radii: Tensor, degree: int) -> Tensor:
    """What :func:`multiview_sh_colors_torch` gives, by the CUDA kernels (float32 CUDA tensors);
    differentiable with respect to ``means`` and ``coeffs`` (not the cameras)."""
    if viewmats.requires_grad:
        raise ValueError("multiview_sh_colors has no camera gradient; use the per-camera path for optimised cameras")
    return _MultiViewSH.apply(means, coeffs, viewmats.detach(), radii.detach(), int(degree))
