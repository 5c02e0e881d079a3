"""Rotating real spherical-harmonic coefficients (degrees 1..3) together with the splat they colour.

Each band l spans a rotation-invariant space, so for a rotation R there is one (2l+1)x(2l+1) matrix D_l
(the real-basis Wigner D matrix) with Y_l(R^T d) = D_l Y_l(d) for every direction d. We get D_l exactly
by solving that identity by least squares over more sample directions than unknowns, in the basis the
rasterizers use (:func:`bytesplat_ns.raster.sh.sh_basis`), so its signs and ordering match by construction.
A splat rotated by R must look towards R d as it looked towards d, which fixes its new coefficients.
"""

from __future__ import annotations

from typing import List

import numpy as np
import torch

from bytesplat_ns.raster.sh import sh_basis

# Well-spread directions (a Fibonacci sphere): 64 >> 7 unknowns per row of the largest band.
_NUM_SAMPLES = 64


def _sample_dirs() -> np.ndarray:
    i = np.arange(_NUM_SAMPLES) + 0.5
    z = 1.0 - 2.0 * i / _NUM_SAMPLES
    phi = np.pi * (1.0 + 5.0**0.5) * i
    r = np.sqrt(1.0 - z * z)
    return np.stack([r * np.cos(phi), r * np.sin(phi), z], axis=1)


def _basis(dirs: np.ndarray, degree: int) -> np.ndarray:
    return sh_basis(degree, torch.from_numpy(dirs)).numpy()


def band_rotations(rotation: np.ndarray, degree: int) -> List[np.ndarray]:
    """For each band l = 1..degree, the matrix M_l with c_l' = M_l c_l for that band's coefficients [2l+1]."""
    rotation = np.asarray(rotation, dtype=np.float64)
    dirs = _sample_dirs()
    # f'(d) = f(R^T d): evaluate the old basis at the directions the new splat maps back to
    before = _basis(dirs, degree)
    after = _basis(dirs @ rotation, degree)  # rows: R^T d
    mats = []
    for l in range(1, degree + 1):
        band = slice(l * l, (l + 1) * (l + 1))
        # solves Y_j(R^T d) = sum_i Y_i(d) x[i, j] over the sample directions
        x, *_ = np.linalg.lstsq(before[:, band], after[:, band], rcond=None)
        mats.append(x)
    return mats


def rotate_sh(sh_rest: np.ndarray, rotation: np.ndarray) -> np.ndarray:
    """SH coefficients [N, K, 3] (bands 1.. of a splat) after rotating the splat by ``rotation`` [3,3].

    The rotated splat's colour towards ``rotation @ d`` equals the original's colour towards ``d``.
    """
    k = sh_rest.shape[1]
    if k == 0:
        return sh_rest.copy()
    degree = {3: 1, 8: 2, 15: 3}[k]
    out = np.empty_like(sh_rest)
    for l, mat in enumerate(band_rotations(rotation, degree), start=1):
        band = slice(l * l - 1, (l + 1) * (l + 1) - 1)  # sh_rest leaves out the DC term
        # f'(d) = sum_j c_j Y_j(R^T d) = sum_j c_j sum_i mat[i, j] Y_i(d)  ->  c'_i = sum_j mat[i, j] c_j
        out[:, band] = np.einsum("ij,njc->nic", mat, sh_rest[:, band].astype(np.float64))
    return out
