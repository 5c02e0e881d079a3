"""Spherical-harmonics colors of N Gaussians seen from C cameras, in one kernel launch each way.

gsplat's ``spherical_harmonics`` takes per-camera coefficients [C,N,K,3]: for C > 1 views of the
same Gaussians the projection either materialises that broadcast (36 GiB at 50M Gaussians, SH 3, 4
views) or calls it once per camera, which reads the coefficients C times and makes autograd add C
coefficient-sized gradients. ``multiview_sh_colors`` (``cuda/sh_views_*.cu``) gives the same colors
with one thread per Gaussian walking the cameras: coefficients read once (a block's rows copied into
shared memory together, so the global reads and gradient writes are coalesced), their gradient and
the means' written once. The coefficients may be stacked [N,K,3] or an ``ShCoefficients`` (DC [N,3] and
rest [N,K-1,3], splatfacto's two parameters): the kernels read both forms where they lie and write
their gradients the same way, so the training step (one camera) needs no ``torch.cat``.
``split_sh_colors_torch`` and ``multiview_sh_colors_torch`` (``raster._torch_impl``) are the
pure-PyTorch twins of the two forms.
"""

from __future__ import annotations

from typing import Union

from torch import Tensor

from bytesplat_ns.raster._torch_impl import multiview_sh_colors_torch, split_sh_colors_torch
from bytesplat_ns.raster._wrapper import _MultiViewSH
from bytesplat_ns.raster.sh import ShCoefficients

__all__ = ["multiview_sh_colors", "multiview_sh_colors_torch", "split_sh_colors_torch"]


def multiview_sh_colors(means: Tensor, coeffs: Union[Tensor, ShCoefficients], viewmats: Tensor, radii: Tensor,
                        degree: int) -> Tensor:
    """What :func:`multiview_sh_colors_torch` (stacked ``coeffs``) or :func:`split_sh_colors_torch`
    (``ShCoefficients``) gives, by the CUDA kernels (float32 CUDA tensors); differentiable with
    respect to ``means`` and the coefficients (not the cameras)."""
    if viewmats.requires_grad:
        raise ValueError("multiview_sh_colors has no camera gradient; use the per-camera path for optimised cameras")
    dc, rest = coeffs if isinstance(coeffs, ShCoefficients) else (coeffs, None)
    return _MultiViewSH.apply(means, dc, rest, viewmats.detach(), radii.detach(), int(degree))
