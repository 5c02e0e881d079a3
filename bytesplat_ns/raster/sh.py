"""Real spherical harmonics, degrees 0..3, in the basis and sign convention of gsplat 1.4.0 / 3DGS.

The 16 bases (unit direction d = (x, y, z)), indexed l^2 + l + m for m = -l..l:

- l=0: Y0 = 1/(2 sqrt(pi))
- l=1: -k1 y, k1 z, -k1 x                                  (k1 = sqrt(3/(4 pi)))
- l=2: k2 xy, -k2 yz, k20 (3z^2 - 1), -k2 xz, k2/2 (x^2 - y^2)
- l=3: the standard real l=3 polynomials with the leading minus signs of the Condon-Shortley phase
  on the odd-m terms (see ``sh_basis``).

Colors are ``sum_k coeff_k Y_k(d)`` per channel; the caller adds 0.5 and clamps at 0.

Coefficients come either stacked, one tensor [N,K,3], or as :class:`ShCoefficients` (the DC term
and the rest as two tensors, splatfacto's ``features_dc`` / ``features_rest``), which the fused
path's SH kernel reads as they are (``raster.sh_views``); :func:`stacked_coefficients` gives the
[N,K,3] layout to the code that needs it.
"""

from __future__ import annotations

import math
from typing import NamedTuple, Union

import torch
from torch import Tensor

# Normalisation constants, derived from N_lm = sqrt((2l+1)/(4 pi) (l-|m|)!/(l+|m|)!) (times sqrt 2
# for m != 0) applied to the associated Legendre polynomials.
_Y00 = 0.5 / math.sqrt(math.pi)
_K1 = math.sqrt(3.0 / (4.0 * math.pi))
_K2 = 0.5 * math.sqrt(15.0 / math.pi)  # xy, yz, xz terms
_K20 = 0.25 * math.sqrt(5.0 / math.pi)  # (3z^2 - 1)
_K22 = 0.25 * math.sqrt(15.0 / math.pi)  # (x^2 - y^2)
_K33 = 0.25 * math.sqrt(35.0 / (2.0 * math.pi))  # y(3x^2 - y^2), x(x^2 - 3y^2)
_K32 = 0.5 * math.sqrt(105.0 / math.pi)  # xyz
_K31 = 0.25 * math.sqrt(21.0 / (2.0 * math.pi))  # y(5z^2 - 1), x(5z^2 - 1)
_K30 = 0.25 * math.sqrt(7.0 / math.pi)  # z(5z^2 - 3)
_K32b = 0.25 * math.sqrt(105.0 / math.pi)  # z(x^2 - y^2)


class ShCoefficients(NamedTuple):
    """SH coefficients as two tensors: ``dc`` [N,3] (basis 0) and ``rest`` [N,K-1,3] (bases 1..K-1).

    The trainer's parameters are already split this way; keeping them apart saves the
    ``torch.cat`` (and its backward's split) of every step on the path that does not need [N,K,3]."""

    dc: Tensor
    rest: Tensor

    def stacked(self) -> Tensor:
        """[N,K,3], basis 0 first."""
        return torch.cat((self.dc[:, None, :], self.rest), dim=1)


def stacked_coefficients(colors: Union[Tensor, ShCoefficients]) -> Tensor:
    """``colors`` as one tensor: :class:`ShCoefficients` stacked to [N,K,3], a tensor as it is."""
    return colors.stacked() if isinstance(colors, ShCoefficients) else colors


def num_sh_bases(degree: int) -> int:
    return (degree + 1) ** 2


def sh_basis(degree: int, dirs: Tensor) -> Tensor:
    """Evaluate the real SH bases up to ``degree`` (0..3) at ``dirs`` [...,3] (any length, not 0).

    Returns [..., (degree+1)^2].
    """
    if not 0 <= degree <= 3:
        raise ValueError(f"SH degree must be in 0..3, got {degree}")
    out = [torch.full(dirs.shape[:-1], _Y00, dtype=dirs.dtype, device=dirs.device)]
    if degree >= 1:
        # (a zero direction, i.e. a Gaussian at the camera center, is culled anyway: keep it finite)
        d = dirs / dirs.norm(dim=-1, keepdim=True).clamp_min(1e-20)
        x, y, z = d.unbind(-1)
        out += [-_K1 * y, _K1 * z, -_K1 * x]
        if degree >= 2:
            xx, yy, zz = x * x, y * y, z * z
            out += [
                _K2 * x * y,
                -_K2 * y * z,
                _K20 * (3.0 * zz - 1.0),
                -_K2 * x * z,
                _K22 * (xx - yy),
            ]
            if degree >= 3:
                out += [
                    -_K33 * y * (3.0 * xx - yy),
                    _K32 * x * y * z,
                    -_K31 * y * (5.0 * zz - 1.0),
                    _K30 * z * (5.0 * zz - 3.0),
                    -_K31 * x * (5.0 * zz - 1.0),
                    _K32b * z * (xx - yy),
                    -_K33 * x * (xx - 3.0 * yy),
                ]
    return torch.stack(out, dim=-1)


def eval_sh(degree: int, dirs: Tensor, coeffs: Tensor) -> Tensor:
    """SH colors: ``dirs`` [...,3], ``coeffs`` [...,K,D] with K >= (degree+1)^2 (only the first
    (degree+1)^2 are used). Returns [...,D] (no +0.5 offset, no clamp)."""
    n = num_sh_bases(degree)
    if coeffs.shape[-2] < n:
        raise ValueError(f"SH degree {degree} needs {n} coefficients, got {coeffs.shape[-2]}")
    basis = sh_basis(degree, dirs)  # [...,n]
    return (basis[..., None, :] @ coeffs[..., :n, :]).squeeze(-2)


def sh_to_color(degree: int, dirs: Tensor, coeffs: Tensor) -> Tensor:
    """gsplat's color rule for SH inputs: ``clamp_min(eval_sh + 0.5, 0)``."""
    return torch.clamp_min(eval_sh(degree, dirs, coeffs) + 0.5, 0.0)
