"""Float64 dense oracle for Gaussian splatting (gsplat 1.4.0 classic conventions).

Written independently of ``bytesplat_ns.raster`` (imports nothing from it) and as plainly as
possible: every pixel is tested against every visible Gaussian in depth order, one Gaussian at a
time, with the per-pixel transmittance carried along. The only "tiling" is gsplat's reach rule: a
Gaussian reaches a pixel only if the pixel's 16x16 tile lies inside the Gaussian's tile box.
Gradients come from autograd through the same float64 computation.
"""

from __future__ import annotations

import math
from typing import Dict, Optional

import torch
from torch import Tensor

# --- spherical harmonics (3DGS polynomial form, direction normalised first) ---------------------
SH_C0 = 0.28209479177387814
SH_C1 = 0.4886025119029199
SH_C2 = [1.0925484305920792, -1.0925484305920792, 0.31539156525252005, -1.0925484305920792,
         0.5462742152960396]
SH_C3 = [-0.5900435899266435, 2.890611442640554, -0.4570457994644658, 0.3731763325901154,
         -0.4570457994644658, 1.445305721320277, -0.5900435899266435]


def oracle_sh(degree: int, dirs: Tensor, sh: Tensor) -> Tensor:
    """dirs [...,3] (any length), sh [...,K,3] -> color [...,3] (before +0.5 and clamp)."""
    res = SH_C0 * sh[..., 0, :]
    if degree == 0:
        return res
    n = torch.sqrt((dirs * dirs).sum(-1, keepdim=True))
    x, y, z = (dirs / n).unbind(-1)
    x, y, z = x[..., None], y[..., None], z[..., None]
    res = res - SH_C1 * y * sh[..., 1, :] + SH_C1 * z * sh[..., 2, :] - SH_C1 * x * sh[..., 3, :]
    if degree == 1:
        return res
    xx, yy, zz, xy, yz, xz = x * x, y * y, z * z, x * y, y * z, x * z
    res = (res
           + SH_C2[0] * xy * sh[..., 4, :]
           + SH_C2[1] * yz * sh[..., 5, :]
           + SH_C2[2] * (2.0 * zz - xx - yy) * sh[..., 6, :]
           + SH_C2[3] * xz * sh[..., 7, :]
           + SH_C2[4] * (xx - yy) * sh[..., 8, :])
    if degree == 2:
        return res
    res = (res
           + SH_C3[0] * y * (3 * xx - yy) * sh[..., 9, :]
           + SH_C3[1] * xy * z * sh[..., 10, :]
           + SH_C3[2] * y * (4 * zz - xx - yy) * sh[..., 11, :]
           + SH_C3[3] * z * (2 * zz - 3 * xx - 3 * yy) * sh[..., 12, :]
           + SH_C3[4] * x * (4 * zz - xx - yy) * sh[..., 13, :]
           + SH_C3[5] * z * (xx - yy) * sh[..., 14, :]
           + SH_C3[6] * x * (xx - 3 * yy) * sh[..., 15, :])
    return res


# --- projection ------------------------------------------------------------------------------
def oracle_rotation(quats: Tensor) -> Tensor:
    """R = (w^2 - v.v) I + 2 v v^T + 2 w [v]_x for the normalised quaternion (w, v)."""
    q = quats / torch.sqrt((quats * quats).sum(-1, keepdim=True))
    w = q[:, 0]
    v = q[:, 1:]
    eye = torch.eye(3, dtype=q.dtype, device=q.device)
    vx = torch.zeros(q.shape[0], 3, 3, dtype=q.dtype, device=q.device)
    vx[:, 0, 1] = -v[:, 2]
    vx[:, 0, 2] = v[:, 1]
    vx[:, 1, 0] = v[:, 2]
    vx[:, 1, 2] = -v[:, 0]
    vx[:, 2, 0] = -v[:, 1]
    vx[:, 2, 1] = v[:, 0]
    return ((w * w - (v * v).sum(-1))[:, None, None] * eye
            + 2.0 * v[:, :, None] * v[:, None, :]
            + 2.0 * w[:, None, None] * vx)


def oracle_project(means, quats, scales, viewmat, K, width, height, *, eps2d=0.3,
                   near_plane=0.01, far_plane=1e10) -> Dict[str, Tensor]:
    """One camera. Returns means2d [N,2], conics [N,3], depths [N], radii [N] (long)."""
    Rw = viewmat[:3, :3]
    tw = viewmat[:3, 3]
    pc = means @ Rw.T + tw
    x, y, z = pc[:, 0], pc[:, 1], pc[:, 2]
    Rq = oracle_rotation(quats)
    Sigma = Rq @ torch.diag_embed(scales * scales) @ Rq.transpose(1, 2)
    Sigma_c = Rw @ Sigma @ Rw.T
    fx, fy, cx, cy = K[0, 0], K[1, 1], K[0, 2], K[1, 2]
    tanx = 0.5 * width / fx
    tany = 0.5 * height / fy
    xz = torch.clamp(x / z, min=-(cx / fx + 0.3 * tanx), max=(width - cx) / fx + 0.3 * tanx)
    yz = torch.clamp(y / z, min=-(cy / fy + 0.3 * tany), max=(height - cy) / fy + 0.3 * tany)
    N = means.shape[0]
    J = torch.zeros(N, 2, 3, dtype=means.dtype, device=means.device)
    J[:, 0, 0] = fx / z
    J[:, 0, 2] = -fx * xz / z
    J[:, 1, 1] = fy / z
    J[:, 1, 2] = -fy * yz / z
    cov = J @ Sigma_c @ J.transpose(1, 2)
    A = cov[:, 0, 0] + eps2d
    B = cov[:, 0, 1]
    Cc = cov[:, 1, 1] + eps2d
    det = A * Cc - B * B
    conics = torch.stack([Cc / det, -B / det, A / det], dim=-1)
    means2d = torch.stack([fx * x / z + cx, fy * y / z + cy], dim=-1)
    radii = torch.zeros(N, dtype=torch.long)
    with torch.no_grad():
        for i in range(N):
            zi = float(z[i])
            if zi < near_plane or zi > far_plane or float(det[i]) <= 0:
                continue
            half = 0.5 * float(A[i] + Cc[i])
            lam = half + math.sqrt(max(half * half - float(det[i]), 0.01))
            r = math.ceil(3.0 * math.sqrt(lam))
            mx, my = float(means2d[i, 0]), float(means2d[i, 1])
            if mx + r <= 0 or mx - r >= width or my + r <= 0 or my - r >= height:
                continue
            radii[i] = r
    return {"means2d": means2d, "conics": conics, "depths": z, "radii": radii}


# --- compositing -----------------------------------------------------------------------------
def oracle_composite(means2d, conics, colors, opacities, radii, depths, width, height, *,
                     tile_size=16, background=None, stop_T: Optional[float] = 1e-4,
                     alpha_min=1.0 / 255.0, alpha_max=0.999, reach_rule=True):
    """One camera. Returns (image [H,W,D], alpha [H,W,1], n_stopped pixels).

    ``stop_T=None`` and ``reach_rule=False`` switch those two rules off (used to show that the
    tests can tell them apart)."""
    dt = means2d.dtype
    ys, xs = torch.meshgrid(torch.arange(height), torch.arange(width), indexing="ij")
    xs = xs.reshape(-1)
    ys = ys.reshape(-1)
    pxc = xs.to(dt) + 0.5
    pyc = ys.to(dt) + 0.5
    tx = torch.div(xs, tile_size, rounding_mode="floor")
    ty = torch.div(ys, tile_size, rounding_mode="floor")
    n_tx = math.ceil(width / tile_size)
    n_ty = math.ceil(height / tile_size)
    HW = height * width
    D = colors.shape[-1]
    T = torch.ones(HW, dtype=dt)
    out = torch.zeros(HW, D, dtype=dt)
    done = torch.zeros(HW, dtype=torch.bool)
    order = sorted(range(means2d.shape[0]), key=lambda i: (float(depths[i].detach()), i))
    for i in order:
        r = int(radii[i])
        if r <= 0:
            continue
        mx, my = float(means2d[i, 0].detach()), float(means2d[i, 1].detach())
        x0 = min(max(math.floor((mx - r) / tile_size), 0), n_tx)
        x1 = min(max(math.ceil((mx + r) / tile_size), 0), n_tx)
        y0 = min(max(math.floor((my - r) / tile_size), 0), n_ty)
        y1 = min(max(math.ceil((my + r) / tile_size), 0), n_ty)
        reach = (tx >= x0) & (tx < x1) & (ty >= y0) & (ty < y1)
        if not reach_rule:
            reach = torch.ones_like(reach)
        dx = means2d[i, 0] - pxc
        dy = means2d[i, 1] - pyc
        a, b, c = conics[i, 0], conics[i, 1], conics[i, 2]
        sigma = 0.5 * (a * dx * dx + c * dy * dy) + b * dx * dy
        alpha = torch.clamp(opacities[i] * torch.exp(-sigma), max=alpha_max)
        use = reach & ~done & (sigma >= 0) & (alpha >= alpha_min)
        T_next = T * (1.0 - alpha)
        if stop_T is not None:
            stop = use & (T_next <= stop_T)
            done = done | stop
            use = use & ~stop
        out = out + torch.where(use[:, None], (alpha * T)[:, None] * colors[i][None, :], 0.0)
        T = torch.where(use, T_next, T)
    if background is not None:
        out = out + T[:, None] * background[None, :]
    return (out.reshape(height, width, D), (1.0 - T).reshape(height, width, 1),
            int(done.sum()))


def oracle_render(means, quats, scales, opacities, colors, viewmats, Ks, width, height, *,
                  sh_degree=None, backgrounds=None, render_mode="RGB", near_plane=0.01,
                  far_plane=1e10, eps2d=0.3, tile_size=16, stop_T: Optional[float] = 1e-4,
                  reach_rule=True, alpha_max=0.999, means2d_leaf=False):
    """All cameras. Returns (render [C,H,W,D], alpha [C,H,W,1], meta) like rasterization().

    meta: per-camera lists ``projections`` and ``n_stopped``; with ``means2d_leaf`` the 2D means
    are detached leaves (requires_grad) in ``meta["means2d"]`` [C,N,2] so that d/d(means2d) can be
    taken directly.
    """
    renders, alphas, projs, stopped, leaves = [], [], [], [], []
    for ci in range(viewmats.shape[0]):
        p = oracle_project(means, quats, scales, viewmats[ci], Ks[ci], width, height,
                           eps2d=eps2d, near_plane=near_plane, far_plane=far_plane)
        if sh_degree is None:
            col = colors if colors.dim() == 2 else colors[ci]
        else:
            campos = torch.linalg.inv(viewmats[ci])[:3, 3]
            col = torch.clamp(oracle_sh(sh_degree, means - campos, colors) + 0.5, min=0.0)
        if render_mode == "RGB+ED":
            col = torch.cat([col, p["depths"][:, None]], dim=-1)
        bg = None
        if backgrounds is not None:
            bg = backgrounds[ci]
            if render_mode == "RGB+ED":
                bg = torch.cat([bg, torch.zeros_like(bg[:1])])
        m2d = p["means2d"]
        if means2d_leaf:
            m2d = m2d.detach().requires_grad_(True)
            leaves.append(m2d)
        img, alp, ns = oracle_composite(m2d, p["conics"], col, opacities, p["radii"],
                                        p["depths"], width, height, tile_size=tile_size,
                                        background=bg, stop_T=stop_T, reach_rule=reach_rule,
                                        alpha_max=alpha_max)
        if render_mode == "RGB+ED":
            img = torch.cat([img[..., :-1], img[..., -1:] / torch.clamp(alp, min=1e-10)], -1)
        renders.append(img)
        alphas.append(alp)
        projs.append(p)
        stopped.append(ns)
    meta = {"projections": projs, "n_stopped": stopped}
    if means2d_leaf:
        meta["means2d"] = leaves
    return torch.stack(renders), torch.stack(alphas), meta
