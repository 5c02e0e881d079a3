"""Pure-PyTorch twins of the CUDA kernels (``cuda/``): the oracles the kernels are tested against,
and what the Python front end falls back to where a kernel is optional.

- :func:`bin_tiles_torch` / :func:`tile_intersections_torch`: ``cuda/binning.cu`` (the same lists);
- :func:`render_2d_torch`: the compositing of one set of 2D Gaussians, pixel by pixel (slow; small images);
- :class:`TorchOps`: the extension's rasterizer entry points, vectorised per tile (the per-warp masks:
  ``raster/warp_masks.py``);
- :func:`split_sh_colors_torch`: ``cuda/sh_views_*.cu`` (the DC and other coefficients as two tensors);
  :func:`multiview_sh_colors_torch`: the same colors from stacked [N,K,3] coefficients.
"""

from __future__ import annotations

import math
from typing import Optional, Tuple

import torch
from torch import Tensor

from bytesplat_ns.raster._wrapper import TILE_SIZE
from bytesplat_ns.raster.loss import SSIM_WIN_SIGMA, SSIM_WIN_SIZE
from bytesplat_ns.raster.tiles import unpack_tile_order
from bytesplat_ns.raster.warp_masks import warp_masks_torch


def _ssim(rgb: Tensor, gt: Tensor) -> Tensor:
    """pytorch_msssim's SSIM of [C,H,W,3] batches, averaged (splatfacto's settings)."""
    from pytorch_msssim import ssim

    return ssim(gt.permute(0, 3, 1, 2), rgb.permute(0, 3, 1, 2), data_range=1.0, size_average=True,
                win_size=SSIM_WIN_SIZE, win_sigma=SSIM_WIN_SIGMA)


# ----------------------------------------------------------------------------------------------
# Tile binning (cuda/binning.cu)
# ----------------------------------------------------------------------------------------------


def tile_boxes(means2d: Tensor, radii: Tensor, width: int, height: int, tile_size: int):
    """(counts [C,N] int64, x0 [C,N], y0 [C,N], nx [C,N]): each Gaussian's tile box, as the kernel's.
    ``radii`` [C,N] (the same in x and y) or [C,N,2] (x, y); a radius <= 0 on either axis bins nothing."""
    tw, th = math.ceil(width / tile_size), math.ceil(height / tile_size)
    r_xy = radii if radii.dim() == 3 else radii[..., None].expand(*radii.shape, 2)
    rx = r_xy[..., 0].to(torch.float32) / tile_size
    ry = r_xy[..., 1].to(torch.float32) / tile_size
    tx = means2d[..., 0].detach().float() / tile_size
    ty = means2d[..., 1].detach().float() / tile_size
    x0 = torch.floor(tx - rx).clamp(0, tw).long()
    x1 = torch.ceil(tx + rx).clamp(0, tw).long()
    y0 = torch.floor(ty - ry).clamp(0, th).long()
    y1 = torch.ceil(ty + ry).clamp(0, th).long()
    nx = (x1 - x0).clamp_min(0)
    binned = (r_xy[..., 0] > 0) & (r_xy[..., 1] > 0)
    counts = torch.where(binned, nx * (y1 - y0).clamp_min(0), torch.zeros_like(nx))
    return counts, x0, y0, nx


def bin_tiles_torch(
    means2d: Tensor, radii: Tensor, depths: Tensor, width: int, height: int, tile_size: int = TILE_SIZE,
    known_total: Optional[int] = None,
) -> Tuple[Tensor, Tensor]:
    """Pure-PyTorch ``fused.bin_tiles`` (CPU tensors, ``fused.binning="torch"``; the kernel's oracle)."""
    C, N = radii.shape[:2]
    dev = means2d.device
    tw, th = math.ceil(width / tile_size), math.ceil(height / tile_size)
    ntot = C * tw * th
    counts, x0, y0, nx = tile_boxes(means2d, radii, width, height, tile_size)
    counts = counts.flatten()
    total = int(counts.sum().item())
    if known_total is not None and known_total != total:
        raise AssertionError(f"binning told {known_total} tile intersections, counted {total}")
    if total == 0:
        return torch.zeros(ntot + 1, dtype=torch.int32, device=dev), torch.zeros(0, dtype=torch.int32, device=dev)
    gid = torch.repeat_interleave(torch.arange(C * N, device=dev), counts, output_size=total)
    first = torch.cumsum(counts, 0) - counts
    local = torch.arange(total, device=dev) - first[gid]
    w = nx.flatten()[gid]
    tile_y = y0.flatten()[gid] + torch.div(local, w, rounding_mode="floor")
    tile_x = x0.flatten()[gid] + torch.remainder(local, w)
    tile = torch.div(gid, N, rounding_mode="floor") * (tw * th) + tile_y * tw + tile_x
    depth_bits = depths.detach().float().contiguous().view(torch.int32).flatten()[gid].long()
    key = (tile << 32) | (depth_bits & 0xFFFFFFFF)
    _, order = torch.sort(key, stable=True)
    flatten_ids = gid[order].to(torch.int32)
    offsets = torch.zeros(ntot + 1, dtype=torch.int64, device=dev)
    offsets[1:] = torch.cumsum(torch.bincount(tile, minlength=ntot), 0)
    return offsets.to(torch.int32), flatten_ids


@torch.no_grad()
def tile_intersections_torch(means2d: Tensor, radii: Tensor, width: int, height: int,
                             tile_size: int = TILE_SIZE) -> Tensor:
    """Tiles reached per camera, [C] int64: what :func:`bin_tiles_torch` of the same inputs counts."""
    return tile_boxes(means2d, radii, width, height, tile_size)[0].sum(1)


# ----------------------------------------------------------------------------------------------
# Compositing and the fused loss (cuda/render_fwd.cu, render_bwd.cu, fused_loss.cu, loss_grad.cu)
# ----------------------------------------------------------------------------------------------


def render_2d_torch(
    means2d: Tensor, conics: Tensor, colors: Tensor, opacities: Tensor, backgrounds: Optional[Tensor],
    offsets: Tensor, flatten_ids: Tensor, width: int, height: int,
) -> Tuple[Tensor, Tensor]:
    """The compositing the kernels do, in torch (autograd gives the gradients): for each pixel,
    walk its tile's list front to back with gsplat's alpha/skip/stop rules. Slow; small images."""
    C = means2d.shape[0]
    m, c, col, o = means2d.reshape(-1, 2), conics.reshape(-1, 3), colors.reshape(-1, 3), opacities.reshape(-1)
    tw = math.ceil(width / TILE_SIZE)
    th = math.ceil(height / TILE_SIZE)
    ys, xs = torch.meshgrid(torch.arange(height, device=m.device), torch.arange(width, device=m.device), indexing="ij")
    out_rgb, out_a = [], []
    offs = offsets.tolist()
    for cam in range(C):
        img = torch.zeros(height * width, 3, device=m.device)
        Tout = torch.ones(height * width, device=m.device)
        for t in range(tw * th):
            tx, ty = t % tw, t // tw
            sel = (xs // TILE_SIZE == tx) & (ys // TILE_SIZE == ty)
            pidx = sel.flatten().nonzero().squeeze(1)
            ids = flatten_ids[offs[cam * tw * th + t]: offs[cam * tw * th + t + 1]].long()
            if pidx.numel() == 0:
                continue
            px = xs.flatten()[pidx].float() + 0.5
            py = ys.flatten()[pidx].float() + 0.5
            T = torch.ones(pidx.numel(), device=m.device)
            acc = torch.zeros(pidx.numel(), 3, device=m.device)
            alive = torch.ones(pidx.numel(), dtype=torch.bool, device=m.device)
            for g in ids.tolist():
                dx, dy = m[g, 0] - px, m[g, 1] - py
                sigma = 0.5 * (c[g, 0] * dx * dx + c[g, 2] * dy * dy) + c[g, 1] * dx * dy
                alpha = torch.clamp(o[g] * torch.exp(-sigma), max=0.999)
                use = alive & (sigma >= 0) & (alpha >= 1.0 / 255.0)
                nextT = T * (1 - alpha)
                stop = use & (nextT <= 1e-4)
                alive = alive & ~stop
                use = use & ~stop
                w = torch.where(use, alpha * T, torch.zeros_like(T))
                acc = acc + w[:, None] * col[g][None, :]
                T = torch.where(use, nextT, T)
            img = img.index_put((pidx,), acc)
            Tout = Tout.index_put((pidx,), T)
        if backgrounds is not None:
            img = img + Tout[:, None] * backgrounds[cam][None, :]
        out_rgb.append(img.view(height, width, 3))
        out_a.append((1 - Tout).view(height, width, 1))
    return torch.stack(out_rgb), torch.stack(out_a)


def tile_lists(offsets, fids, C, W, H):
    """(camera, pixel x [P], pixel y [P], Gaussian ids front to back) for every tile of every view."""
    tw, th = math.ceil(W / TILE_SIZE), math.ceil(H / TILE_SIZE)
    offs = offsets.long().tolist()
    for cam in range(C):
        for t in range(tw * th):
            tx, ty = t % tw, t // tw
            xs = torch.arange(tx * TILE_SIZE, min((tx + 1) * TILE_SIZE, W))
            ys = torch.arange(ty * TILE_SIZE, min((ty + 1) * TILE_SIZE, H))
            py, px = torch.meshgrid(ys, xs, indexing="ij")
            yield cam, px.flatten(), py.flatten(), fids[offs[cam * tw * th + t]: offs[cam * tw * th + t + 1]].long()


def twin_composite(m, c, col, o, bg, offsets, fids, C, W, H, absbuf: Optional[torch.Tensor] = None):
    """The kernels' compositing in torch, vectorised per tile (gsplat's alpha/skip/stop rules).

    m [C*N,2], c [C*N,3], col [C*N,3], o [C*N], bg [C,3] or None; returns rgb [C,H,W,3] (with
    T*bg), alpha [C,H,W,1], T [C,H,W]. ``absbuf`` [C*N,2]: the backward adds the per-pixel
    |dL/dmean2d| into it (gsplat's absgrad)."""
    vals, idxs = [], []
    for cam, px, py, ids in tile_lists(offsets, fids, C, W, H):
        idxs.append((cam * H + py) * W + px)
        P = px.numel()
        if ids.numel() == 0:
            rgb = torch.zeros(P, 3) + (bg[cam][None] if bg is not None else 0.0)
            vals.append(torch.cat([rgb, torch.ones(P, 1)], -1))
            continue
        dx = m[ids, 0][:, None] - (px.float() + 0.5)[None, :]  # [K,P]
        dy = m[ids, 1][:, None] - (py.float() + 0.5)[None, :]
        if absbuf is not None and dx.requires_grad:
            def _hook(g, col, ids=ids):
                absbuf[:, col].index_add_(0, ids, g.abs().sum(1))

            dx.register_hook(lambda g, ids=ids: _hook(g, 0, ids))
            dy.register_hook(lambda g, ids=ids: _hook(g, 1, ids))
        cc = c[ids]
        sigma = 0.5 * (cc[:, 0:1] * dx * dx + cc[:, 2:3] * dy * dy) + cc[:, 1:2] * dx * dy
        alpha = torch.clamp(o[ids][:, None] * torch.exp(-sigma), max=0.999)
        with torch.no_grad():
            keep = (sigma >= 0) & (alpha >= 1.0 / 255.0)
            T_try = torch.cumprod(1 - alpha * keep, 0)
            keep &= T_try > 1e-4  # non-increasing: a prefix; the pixel stops before the rest
        alpha = alpha * keep
        T_incl = torch.cumprod(1 - alpha, 0)
        T_excl = torch.cat([torch.ones_like(T_incl[:1]), T_incl[:-1]], 0)
        w = alpha * T_excl  # [K,P]
        rgb = w.t() @ col[ids]  # [P,3]
        T = T_incl[-1]
        if bg is not None:
            rgb = rgb + T[:, None] * bg[cam][None]
        vals.append(torch.cat([rgb, T[:, None]], -1))
    out = torch.zeros(C * H * W, 4).index_copy(0, torch.cat(idxs), torch.cat(vals))
    out = out.view(C, H, W, 4)
    return out[..., :3], 1 - out[..., 3:], out[..., 3]


@torch.no_grad()
def twin_contribution(m, c, o, offsets, fids, C, W, H):
    """The pruning score as the backward kernels gather it, in torch: walking each tile's list (the
    fused binning) front to back, the largest alpha*T each entry gets at a pixel of the tile, the
    Gaussian that stops a pixel counting with the T in front of it. [C*N]."""
    out = torch.zeros(m.shape[0], dtype=m.dtype)
    for cam, px, py, ids in tile_lists(offsets, fids, C, W, H):
        if ids.numel() == 0:
            continue
        dx = m[ids, 0][:, None] - (px.flatten().float() + 0.5)[None, :]  # [K,P]
        dy = m[ids, 1][:, None] - (py.flatten().float() + 0.5)[None, :]
        cc = c[ids]
        sigma = 0.5 * (cc[:, 0:1] * dx * dx + cc[:, 2:3] * dy * dy) + cc[:, 1:2] * dx * dy
        alpha = torch.clamp(o[ids][:, None] * torch.exp(-sigma), max=0.999)
        alpha = alpha * ((sigma >= 0) & (alpha >= 1.0 / 255.0))
        T_incl = torch.cumprod(1 - alpha, 0)
        T_excl = torch.cat([torch.ones_like(T_incl[:1]), T_incl[:-1]], 0)
        # up to the stopping Gaussian T in front is the composited one; behind it, <= 1e-4
        w = alpha * T_excl * (T_excl > 1e-4)
        out.scatter_reduce_(0, ids, w.amax(1), reduce="amax")
    return out


def check_tile_order(tile_order, offsets, W, H) -> None:
    """The kernels' tile order argument: None or every tile once, packed (``tiles.tile_order``). It changes only
    which block renders which tile, so the twin checks it and renders as without."""
    if tile_order is not None:
        assert tile_order.dtype == torch.int32 and tile_order.numel() == offsets.numel() - 1
        tiles = unpack_tile_order(tile_order, W, H)
        assert torch.equal(torch.sort(tiles).values, torch.arange(offsets.numel() - 1))


class TorchOps:
    """The compiled extension's rasterizer entry points (cuda/bindings.cpp: ``render_fwd``,
    ``render_bwd``, ``fused_loss``, ``loss_grad``) in PyTorch: same signatures and outputs, built on
    the same tile lists and compositing rules. The kernels' Python front end runs on it on the CPU
    (tests), so its glue is checked without a GPU. The warp culling, the backward reduction and its
    pixels per thread, and the falloff's form (``fast_exp``) change nothing here (in the kernels: exact,
    summation order, summation order, float rounding)."""

    def render_fwd(self, m, c, col, o, bg, offsets, fids, C, W, H, with_stop, warp_cull, fast_exp, tile_order):
        assert isinstance(with_stop, bool) and isinstance(warp_cull, bool) and isinstance(fast_exp, bool)
        check_tile_order(tile_order, offsets, W, H)
        rgb, alpha, T = twin_composite(m, c, col, o, bg, offsets, fids, C, W, H)
        stop = torch.full((C if with_stop else 0, H, W), -1, dtype=torch.int32)
        return rgb, alpha, T, torch.zeros(C, H, W, dtype=torch.int32), stop

    def render_bwd(self, m, c, col, o, bg, offsets, fids, C, W, H, T, last, v_rgb, v_alpha, absgrad,
                   butterfly, contribution, stop, warp_cull, warp_masks, fast_exp, pixels_per_thread, tile_order,
                   v_scale):
        check_tile_order(tile_order, offsets, W, H)
        if v_scale is not None:  # the kernel multiplies dL/d render and v_alpha by it as it reads them
            assert v_scale.dtype == torch.float32 and v_scale.numel() == 1 and v_scale.device == m.device
            v_rgb = v_rgb * v_scale
            v_alpha = v_alpha * v_scale if v_alpha is not None else None
        assert isinstance(butterfly, bool) and isinstance(contribution, bool) and isinstance(warp_cull, bool)
        assert warp_masks is None or (warp_masks.dtype == torch.uint8 and warp_masks.shape == fids.shape)
        assert isinstance(fast_exp, bool) and pixels_per_thread in (1, 2)
        assert (stop is not None) == contribution and (stop is None or stop.shape == (C, H, W))
        ins = [t.detach().clone().requires_grad_(True) for t in (m, c, col, o)]
        absbuf = torch.zeros_like(m) if absgrad else None
        with torch.enable_grad():
            rgb, alpha, _ = twin_composite(*ins, bg, offsets, fids, C, W, H, absbuf=absbuf)
            va = v_alpha if v_alpha is not None else torch.zeros_like(alpha)
            grads = torch.autograd.grad((rgb, alpha), ins, (v_rgb, va), allow_unused=True)
        grads = [g if g is not None else torch.zeros_like(x) for g, x in zip(grads, ins)]
        contrib = twin_contribution(m, c, o, offsets, fids, C, W, H) if contribution else torch.empty(0)
        return (*grads, absbuf if absgrad else torch.empty(0), contrib)

    def warp_masks(self, m, c, o, offsets, fids, C, W, H, rows):
        """cuda/warp_masks.cu: the plain backward's per-warp masks (raster/warp_masks.py)."""
        assert isinstance(rows, bool)
        return warp_masks_torch(m, c, o, offsets, fids, C, W, H, rows)

    def loss_grad(self, render, gt, ssim_lambda, window, clamp_inclusive):
        """cuda/loss_grad.cu: dL/d render of splatfacto's loss of clamp(render) (torch.clamp's own
        mask through autograd), the clamped rgb, and per-tile partials the host divides by the counts."""
        assert window.device.type == "cpu" and window.numel() == SSIM_WIN_SIZE
        assert isinstance(clamp_inclusive, bool) and render.shape == gt.shape and render.shape[-1] == 3
        C, H, W, _ = render.shape
        x = render.detach().clone().requires_grad_(True)
        with torch.enable_grad():
            rgb = torch.clamp(x, 0.0, 1.0)
            l1 = torch.abs(gt - rgb).mean()
            ssim = _ssim(rgb, gt)
            loss = (1 - ssim_lambda) * l1 + ssim_lambda * (1 - ssim)
            (v_render,) = torch.autograd.grad(loss, x)
        tw, th = math.ceil(W / TILE_SIZE), math.ceil(H / TILE_SIZE)
        partials = torch.zeros(C * tw * th, 2)
        partials[0, 0] = l1.detach() * (C * H * W * 3)
        partials[0, 1] = ssim.detach() * (C * 3 * (H - SSIM_WIN_SIZE + 1) * (W - SSIM_WIN_SIZE + 1))
        return v_render, rgb.detach(), partials

    def fused_loss(self, m, c, col, o, bg, gt, offsets, fids, C, W, H, ssim_lambda, window, cap,
                   blocks_per_sm, absgrad, force_two_phase, clamp_inclusive, butterfly, contribution, warp_cull,
                   fast_exp):
        assert isinstance(butterfly, bool) and isinstance(contribution, bool) and isinstance(warp_cull, bool)
        assert isinstance(fast_exp, bool)
        assert window.device.type == "cpu" and window.numel() == SSIM_WIN_SIZE
        ins = [t.detach().clone().requires_grad_(True) for t in (m, c, col, o)]
        absbuf = torch.zeros_like(m) if absgrad else None
        with torch.enable_grad():
            render, alpha, _ = twin_composite(*ins, bg, offsets, fids, C, W, H, absbuf=absbuf)
            rgb = torch.clamp(render, 0.0, 1.0)
            l1 = torch.abs(gt - rgb).mean()
            ssim = _ssim(rgb, gt)
            loss = (1 - ssim_lambda) * l1 + ssim_lambda * (1 - ssim)
            grads = torch.autograd.grad(loss, ins, allow_unused=True)
        grads = [g if g is not None else torch.zeros_like(x) for g, x in zip(grads, ins)]
        tw, th = math.ceil(W / TILE_SIZE), math.ceil(H / TILE_SIZE)
        partials = torch.zeros(C * tw * th, 2)
        partials[0, 0] = l1.detach() * (C * H * W * 3)  # the host divides by the counts
        partials[0, 1] = ssim.detach() * (C * 3 * (H - SSIM_WIN_SIZE + 1) * (W - SSIM_WIN_SIZE + 1))
        info = torch.tensor([int(force_two_phase), int(cap or 1920), 264, 0], dtype=torch.long)
        contrib = twin_contribution(m, c, o, offsets, fids, C, W, H) if contribution else torch.empty(0)
        return (rgb.detach(), alpha.detach(), partials, *grads,
                absbuf if absgrad else torch.empty(0), info, contrib)


# ----------------------------------------------------------------------------------------------
# Multi-camera SH colors (cuda/sh_views_*.cu)
# ----------------------------------------------------------------------------------------------


def multiview_sh_colors_torch(means: Tensor, coeffs: Tensor, viewmats: Tensor, radii: Tensor, degree: int) -> Tensor:
    """[C,N,3]: ``clamp_min(SH(d) + 0.5, 0)`` with d from camera c's center to each mean, 0 where
    ``radii`` [C,N] <= 0. ``means`` [N,3], ``coeffs`` [N,K,3], ``viewmats`` [C,4,4] rigid world-to-camera."""
    from bytesplat_ns.raster.projection import rigid_camera_centers
    from bytesplat_ns.raster.sh import sh_to_color

    C = viewmats.shape[0]
    dirs = means[None] - rigid_camera_centers(viewmats)[:, None]
    colors = sh_to_color(degree, dirs, coeffs.expand(C, -1, -1, -1))
    return torch.where((radii > 0)[..., None], colors, torch.zeros_like(colors))


def split_sh_colors_torch(means: Tensor, dc: Tensor, rest: Tensor, viewmats: Tensor, radii: Tensor,
                          degree: int) -> Tensor:
    """:func:`multiview_sh_colors_torch` with the coefficients as ``dc`` [N,3] and ``rest``
    [N,K-1,3] (never stacked): ``Y_0 dc + sum_{k>=1} Y_k rest[k-1]`` over the first (degree+1)^2
    bases; the rest past them gets a zero gradient."""
    from bytesplat_ns.raster.projection import rigid_camera_centers
    from bytesplat_ns.raster.sh import num_sh_bases, sh_basis

    n = num_sh_bases(degree)
    if 1 + rest.shape[1] < n:
        raise ValueError(f"SH degree {degree} needs {n} coefficients, got {1 + rest.shape[1]}")
    basis = sh_basis(degree, means[None] - rigid_camera_centers(viewmats)[:, None])  # [C,N,n]
    raw = basis[..., :1] * dc + torch.einsum("cnk,nkd->cnd", basis[..., 1:], rest[:, : n - 1])
    colors = torch.clamp_min(raw + 0.5, 0.0)
    return torch.where((radii > 0)[..., None], colors, torch.zeros_like(colors))
