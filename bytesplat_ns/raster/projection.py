"""3D Gaussians -> 2D screen-space Gaussians (pinhole), pure PyTorch, differentiable by autograd.

Conventions follow gsplat 1.4.0's classic (non-antialiased) projection so that every backend of
``bytesplat_ns.raster`` renders the same image:

- ``viewmats`` are world-to-camera [C,4,4]; camera looks down +z; ``Ks`` [C,3,3] pinhole
  (fx=K[0,0], fy=K[1,1], cx=K[0,2], cy=K[1,2]).
- 3D covariance ``R(q) diag(s)^2 R(q)^T`` with ``q = (w,x,y,z)`` normalized here.
- The Jacobian of the perspective map uses x/z and y/z clamped to the frustum widened by
  ``0.3*tan(fov/2)`` on each side (the mean itself is projected unclamped).
- ``eps2d`` is added to the diagonal of the 2D covariance; the conic is its inverse.
- radius = ceil(3*sqrt(b + sqrt(max(b^2 - det, 0.01)))), b = half trace (not differentiable).
- Culled (radius 0) when z < near or z > far, det <= 0, or the radius box lies fully outside the
  image. Culled entries of means2d / depths / conics are zero and receive zero gradient.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor


class Projection(NamedTuple):
    radii: Tensor  # [C,N] int32, 0 = culled
    means2d: Tensor  # [C,N,2] pixel coordinates (non-leaf when inputs require grad)
    depths: Tensor  # [C,N] camera-space z
    conics: Tensor  # [C,N,3] (a, b, c) of the inverse 2D covariance [[a,b],[b,c]]
    covars2d: Tensor  # [C,N,3] (xx, xy, yy) of the blurred 2D covariance
    visible: Tensor  # [C,N] bool, radii > 0


def quat_to_rotmat(quats: Tensor) -> Tensor:
    """Unnormalized quaternions (w,x,y,z) [...,4] -> rotation matrices [...,3,3]."""
    q = quats / quats.norm(dim=-1, keepdim=True)
    w, x, y, z = q.unbind(-1)
    r00 = 1 - 2 * (y * y + z * z)
    r01 = 2 * (x * y - w * z)
    r02 = 2 * (x * z + w * y)
    r10 = 2 * (x * y + w * z)
    r11 = 1 - 2 * (x * x + z * z)
    r12 = 2 * (y * z - w * x)
    r20 = 2 * (x * z - w * y)
    r21 = 2 * (y * z + w * x)
    r22 = 1 - 2 * (x * x + y * y)
    return torch.stack([r00, r01, r02, r10, r11, r12, r20, r21, r22], dim=-1).reshape(
        quats.shape[:-1] + (3, 3)
    )


def camera_centers(viewmats: Tensor) -> Tensor:
    """Camera centers in world space [C,3] (via the matrix inverse, as gsplat does for SH)."""
    return torch.linalg.inv(viewmats)[:, :3, 3]


def rigid_camera_centers(viewmats: Tensor) -> Tensor:
    """Camera centers in world space [C,3] of rigid world-to-camera matrices: -R^T t. Equal to
    :func:`camera_centers` up to rounding, without the matrix inverse, whose CUDA version checks
    for singular input by reading a flag back from the GPU (a host-device wait every step)."""
    return -(viewmats[:, :3, :3].transpose(1, 2) @ viewmats[:, :3, 3:4]).squeeze(-1)


def project_gaussians(
    means: Tensor,
    quats: Tensor,
    scales: Tensor,
    viewmats: Tensor,
    Ks: Tensor,
    width: int,
    height: int,
    *,
    eps2d: float = 0.3,
    near_plane: float = 0.01,
    far_plane: float = 1e10,
) -> Projection:
    """Project N Gaussians into C pinhole cameras (see module docstring for the conventions)."""
    R = viewmats[:, :3, :3]  # [C,3,3]
    t = viewmats[:, :3, 3]  # [C,3]
    mean_c = torch.einsum("cij,nj->cni", R, means) + t[:, None, :]  # [C,N,3]
    x, y, z = mean_c.unbind(-1)

    with torch.no_grad():
        in_depth = (z >= near_plane) & (z <= far_plane)
    # Keep every intermediate finite for culled entries so no NaN leaks into the backward.
    zs = torch.where(in_depth, z, torch.ones_like(z))

    fx = Ks[:, 0, 0, None]
    fy = Ks[:, 1, 1, None]
    cx = Ks[:, 0, 2, None]
    cy = Ks[:, 1, 2, None]
    tan_fovx = 0.5 * width / fx
    tan_fovy = 0.5 * height / fy
    lim_x_pos = (width - cx) / fx + 0.3 * tan_fovx
    lim_x_neg = cx / fx + 0.3 * tan_fovx
    lim_y_pos = (height - cy) / fy + 0.3 * tan_fovy
    lim_y_neg = cy / fy + 0.3 * tan_fovy

    rz = 1.0 / zs
    u = x * rz
    v = y * rz
    tx = zs * torch.minimum(torch.maximum(u, -lim_x_neg), lim_x_pos)
    ty = zs * torch.minimum(torch.maximum(v, -lim_y_neg), lim_y_pos)

    # J = [[fx/z, 0, -fx tx/z^2], [0, fy/z, -fy ty/z^2]]; cov2d = J (R Sigma R^T) J^T.
    zero = torch.zeros_like(rz)
    J = torch.stack(
        [fx * rz, zero, -fx * tx * rz * rz, zero, fy * rz, -fy * ty * rz * rz], dim=-1
    ).reshape(z.shape + (2, 3))
    M = quat_to_rotmat(quats) * scales[..., None, :]  # [N,3,3], Sigma = M M^T
    JRM = J @ (R[:, None] @ M[None])  # [C,N,2,3]
    cov2d = JRM @ JRM.transpose(-1, -2)  # [C,N,2,2]
    cxx = cov2d[..., 0, 0] + eps2d
    cxy = cov2d[..., 0, 1]
    cyy = cov2d[..., 1, 1] + eps2d
    det = cxx * cyy - cxy * cxy

    mean2d = torch.stack([fx * u + cx, fy * v + cy], dim=-1)  # [C,N,2]

    with torch.no_grad():
        ok = in_depth & (det > 0)
        b = 0.5 * (cxx + cyy)
        v1 = b + torch.sqrt(torch.clamp_min(b * b - det, 0.01))
        radius = torch.ceil(3.0 * torch.sqrt(torch.where(ok, v1, torch.ones_like(v1))))
        mx, my = mean2d.unbind(-1)
        ok &= ~(
            (mx + radius <= 0) | (mx - radius >= width) | (my + radius <= 0) | (my - radius >= height)
        )
        radii = torch.where(ok, radius, torch.zeros_like(radius)).to(torch.int32)

    det_s = torch.where(ok, det, torch.ones_like(det))
    conics = torch.stack([cyy / det_s, -cxy / det_s, cxx / det_s], dim=-1)
    okf = ok[..., None]
    conics = torch.where(okf, conics, torch.zeros_like(conics))
    means2d = torch.where(okf, mean2d, torch.zeros_like(mean2d))
    depths = torch.where(ok, z, torch.zeros_like(z))
    covars2d = torch.stack([cxx, cxy, cyy], dim=-1)
    return Projection(radii, means2d, depths, conics, covars2d, ok)
