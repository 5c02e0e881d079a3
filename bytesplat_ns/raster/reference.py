"""The ``reference`` rasterizer: pure PyTorch, any device and dtype, gradients by autograd.

Drop-in for gsplat 1.4.0 ``rasterization(..., packed=False)`` as splatfacto calls it (classic mode,
pinhole). Pipeline: projection (``projection.py``) -> SH colors (``sh.py``) -> binning into blocks
that subdivide the 16x16 tiles (``tiles.py``) -> per-block front-to-back compositing, done for many
blocks at once on padded [blocks, K, pixels] tensors in memory-bounded chunks.

Compositing per pixel, over its tile's Gaussians in depth order (gsplat's rules):
``sigma = 0.5 (a dx^2 + c dy^2) + b dx dy`` with ``d = mean2d - (x + 0.5, y + 0.5)``;
``alpha = min(0.999, o exp(-sigma))``, skipped when ``sigma < 0`` or ``alpha < 1/255``;
the pixel stops before the Gaussian that would take the transmittance to <= 1e-4;
``color = sum w_k c_k + T_final bg``, ``alpha_out = 1 - T_final``.
"""

from __future__ import annotations

import weakref
from typing import Dict, List, Literal, Optional, Tuple

import torch
from torch import Tensor

from bytesplat_ns.raster.projection import camera_centers, project_gaussians
from bytesplat_ns.raster.sh import sh_to_color
from bytesplat_ns.raster.tiles import (
    alpha_block_rects,
    bin_rects,
    intersect_rects,
    tile_grid,
    tile_rects,
)

ALPHA_MIN = 1.0 / 255.0
ALPHA_MAX = 0.999
T_MIN = 1e-4

# Upper bound on elements of one [blocks, pixels, K] tensor (memory bound of a chunk).
DEFAULT_CHUNK_ELEMS = 1 << 18


def _default_block_size(tile_size: int) -> int:
    for bs in (4, 2):
        if tile_size % bs == 0 and tile_size >= bs:
            return bs
    return tile_size


def _composite_chunk(dx: Tensor, dy: Tensor, g: Tensor, colors1T: Tensor) -> Tensor:
    """Front-to-back compositing of B blocks x K depth-sorted (padded) Gaussians x P pixels.

    Layout [B,K,P] (pixels innermost) keeps every tensor of the forward and of the autograd
    backward contiguous, including the gradient coming out of the final matmul.
    dx, dy: [B,K,P] mean - pixel center; g: [B,K,4] (-a/2, -b, -c/2, opacity) with opacity 0 on
    padding slots; colors1T [B,D+1,K] colors with a trailing row of ones. Returns [B,D+1,P]:
    sum_k w_k c_k and, last, sum_k w_k = 1 - T_final.
    """
    nha, nb, nhc, o = (t.unsqueeze(-1) for t in g.unbind(-1))  # [B,K,1] each
    # -sigma = -(0.5 (a dx^2 + c dy^2) + b dx dy)
    nsigma = torch.addcmul(nha * dx, nb, dy) * dx + nhc * dy * dy
    # The floor changes nothing (o * e^-20 < 1/255 is skipped either way) but keeps exp() off its
    # underflow path, which is an order of magnitude slower on CPU.
    alpha = torch.clamp_max(o * torch.exp(torch.clamp_min(nsigma, -20.0)), ALPHA_MAX)
    with torch.no_grad():
        # skipped: sigma < 0 or alpha < 1/255 (padding has opacity 0 so it is always skipped)
        keep = (nsigma <= 0) & (alpha >= ALPHA_MIN)
    alpha = alpha * keep
    T_incl = torch.cumprod(1.0 - alpha, dim=1)
    T_excl = torch.cat([torch.ones_like(T_incl[:, :1]), T_incl[:, :-1]], dim=1)
    w = alpha * T_excl
    with torch.no_grad():
        # T_incl is non-increasing along K, so "not stopped yet" is the prefix T_incl > 1e-4: the
        # Gaussian that would take T to <= 1e-4 and everything after it are left out.
        saturated = bool((T_incl[:, -1] <= T_MIN).any())
    if saturated:
        w = w * (T_incl > T_MIN)
    return colors1T @ w


def _plan_chunks(
    counts: List[int], P: int, chunk_elems: int, fill: float = 0.7, min_elems: int = 1 << 15
) -> List[Tuple[int, int]]:
    """Split blocks sorted by descending list length into [i, j) chunks padded to counts[i].

    A chunk grows while its padded size stays within ``chunk_elems`` and the blocks it takes are
    at least ``fill`` of its longest list (bounding padding waste), or while it is still tiny
    (``min_elems``: per-op overhead dominates there).
    """
    out = []
    n = len(counts)
    i = 0
    while i < n:
        K = counts[i]
        per = P * K
        j = i + 1
        while j < n and (j - i + 1) * per <= chunk_elems and (
            counts[j] >= fill * K or (j - i + 1) * per <= min_elems
        ):
            j += 1
        out.append((i, j))
        i = j
    return out


def rasterize_to_pixels_reference(
    means2d: Tensor,
    conics: Tensor,
    colors: Tensor,
    opacities: Tensor,
    radii: Tensor,
    depths: Tensor,
    width: int,
    height: int,
    tile_size: int = 16,
    *,
    backgrounds: Optional[Tensor] = None,
    absgrad: bool = False,
    block_size: Optional[int] = None,
    chunk_elems: int = DEFAULT_CHUNK_ELEMS,
) -> Tuple[Tensor, Tensor]:
    """Composite projected Gaussians into images (gsplat's ``rasterize_to_pixels`` counterpart).

    means2d [C,N,2], conics [C,N,3], colors [C,N,D], opacities [C,N], radii [C,N] (0 = culled),
    depths [C,N] (sort key), backgrounds [C,D] or None. Returns (render [C,H,W,D],
    alpha [C,H,W,1]). With ``absgrad`` the backward sets ``means2d.absgrad`` [C,N,2] to the sum
    over pixels of |d loss / d mean2d| per pixel.
    """
    C, N = radii.shape
    D = colors.shape[-1]
    device, dtype = means2d.device, means2d.dtype
    bs = block_size or _default_block_size(tile_size)
    if tile_size % bs != 0:
        raise ValueError(f"block_size {bs} must divide tile_size {tile_size}")
    P = bs * bs
    tw, th = tile_grid(width, height, tile_size)
    gw, gh = tile_grid(width, height, bs)
    n_cells = C * gh * gw

    ratio = tile_size // bs
    rect_t = tile_rects(means2d, radii, tile_size, tw, th) * ratio
    rect_a = alpha_block_rects(means2d, conics, opacities, bs)
    rect = intersect_rects(rect_t, rect_a)
    rect = torch.where((radii > 0)[..., None], rect, torch.zeros_like(rect))
    bins = bin_rects(rect, depths, gw, gh)

    CN = C * N
    # One table gathered per (block, slot): mean (2), (-a/2, -b, -c/2, opacity) (4), colors, 1.
    tab = torch.cat(
        [
            means2d,
            -0.5 * conics[..., :1],
            -conics[..., 1:2],
            -0.5 * conics[..., 2:],
            opacities[..., None],
            colors,
            torch.ones_like(colors[..., :1]),
        ],
        dim=-1,
    ).reshape(CN, 7 + D)

    counts = bins.counts
    nonempty = torch.nonzero(counts > 0).squeeze(1)
    cnt_sorted, order = torch.sort(counts[nonempty], descending=True)
    cells = nonempty[order]
    cnt_list: List[int] = cnt_sorted.tolist()

    absbuf = None
    if absgrad and means2d.requires_grad:
        absbuf = torch.zeros(CN + 1, 2, dtype=dtype, device=device)  # last row: padding sink
        # The hook lives in means2d's autograd node: a strong reference back to means2d would be a
        # cycle through C++ that the garbage collector cannot see, leaking every step's means2d,
        # its gradient, absgrad and graph nodes (GBs over a CPU training run).
        means2d_ref = weakref.ref(means2d)

        def _publish(grad: Tensor, buf: Tensor = absbuf) -> None:
            m = means2d_ref()
            if m is not None:
                m.absgrad = buf[:CN].reshape(C, N, 2).clone()
            buf.zero_()

        means2d.register_hook(_publish)

    lp = torch.arange(P, device=device)
    lx = (lp % bs).to(dtype) + 0.5
    ly = torch.div(lp, bs, rounding_mode="floor").to(dtype) + 0.5

    outs: List[Tensor] = []
    for i, j in _plan_chunks(cnt_list, P, chunk_elems):
        K = cnt_list[i]
        cid = cells[i:j]
        ccnt = cnt_sorted[i:j]
        ar = torch.arange(K, device=device)
        valid = ar[None, :] < ccnt[:, None]  # [B,K]
        pos = bins.offsets[cid][:, None] + ar[None, :]
        gid = bins.flatten_ids[pos.clamp_max(bins.flatten_ids.numel() - 1)]
        gid = torch.where(valid, gid, torch.zeros_like(gid))
        bx = (cid % gw).to(dtype)
        by = torch.div(cid, gw, rounding_mode="floor").remainder(gh).to(dtype)
        px = bx[:, None] * bs + lx[None, :]  # [B,P]
        py = by[:, None] * bs + ly[None, :]
        # [B,K,7+D]; padding slots all zero (opacity 0), via where() so that no non-finite value
        # of a culled Gaussian can leak into them
        t = torch.where(valid[..., None], tab[gid], torch.zeros((), dtype=dtype, device=device))
        dx = t[..., 0:1] - px[:, None, :]  # [B,K,P]
        dy = t[..., 1:2] - py[:, None, :]
        if absbuf is not None and dx.requires_grad:
            sink = torch.where(valid, gid, torch.full_like(gid, CN)).reshape(-1)

            def _hook(grad: Tensor, col: int, sink: Tensor = sink) -> None:
                absbuf[:, col].index_add_(0, sink, grad.abs().sum(-1).reshape(-1).to(dtype))

            dx.register_hook(lambda gr, s=sink: _hook(gr, 0, s))
            dy.register_hook(lambda gr, s=sink: _hook(gr, 1, s))
        outs.append(_composite_chunk(dx, dy, t[..., 2:6], t[..., 6:].transpose(1, 2)))

    full = torch.zeros(n_cells, D + 1, P, dtype=dtype, device=device)
    if outs:
        full = full.index_copy(0, cells, torch.cat(outs, 0))
    elif tab.requires_grad:
        # Nothing visible: stay attached to the graph (zero gradients) so that backward() and
        # DefaultStrategy's means2d.grad still work, as with gsplat.
        full = full + tab[:0].sum()
    img = full.reshape(C, gh, gw, D + 1, bs, bs).permute(0, 1, 4, 2, 5, 3)
    img = img.reshape(C, gh * bs, gw * bs, D + 1)[:, :height, :width]
    render = img[..., :D]
    alpha = img[..., D:]
    if backgrounds is not None:
        render = render + (1.0 - alpha) * backgrounds[:, None, None, :]
    return render, alpha


def rasterize_reference(
    means: Tensor,
    quats: Tensor,
    scales: Tensor,
    opacities: Tensor,
    colors: Tensor,
    viewmats: Tensor,
    Ks: Tensor,
    width: int,
    height: int,
    *,
    sh_degree: Optional[int] = None,
    backgrounds: Optional[Tensor] = None,
    render_mode: Literal["RGB", "RGB+ED"] = "RGB",
    absgrad: bool = False,
    near_plane: float = 0.01,
    far_plane: float = 1e10,
    eps2d: float = 0.3,
    tile_size: int = 16,
    block_size: Optional[int] = None,
    chunk_elems: int = DEFAULT_CHUNK_ELEMS,
) -> Tuple[Tensor, Tensor, Dict]:
    """Render C views of N Gaussians; see ``bytesplat_ns.raster.rasterize`` for the contract."""
    N = means.shape[0]
    C = viewmats.shape[0]
    if render_mode not in ("RGB", "RGB+ED"):
        raise ValueError(f"render_mode must be 'RGB' or 'RGB+ED', got {render_mode!r}")
    assert means.shape == (N, 3), means.shape
    assert quats.shape == (N, 4), quats.shape
    assert scales.shape == (N, 3), scales.shape
    assert opacities.shape == (N,), opacities.shape
    assert viewmats.shape == (C, 4, 4) and Ks.shape == (C, 3, 3)

    proj = project_gaussians(
        means,
        quats,
        scales,
        viewmats,
        Ks,
        width,
        height,
        eps2d=eps2d,
        near_plane=near_plane,
        far_plane=far_plane,
    )

    if sh_degree is None:
        if colors.dim() == 2:
            assert colors.shape[0] == N, colors.shape
            cols = colors.expand(C, -1, -1)
        else:
            assert colors.shape[:2] == (C, N), colors.shape
            cols = colors
    else:
        assert colors.shape[-1] == 3 and colors.shape[-3] == N, colors.shape
        dirs = means[None, :, :] - camera_centers(viewmats)[:, None, :]  # [C,N,3]
        coeffs = colors.expand(C, -1, -1, -1) if colors.dim() == 3 else colors
        cols = sh_to_color(sh_degree, dirs, coeffs)  # [C,N,3]

    bgs = backgrounds
    if render_mode == "RGB+ED":
        cols = torch.cat([cols, proj.depths[..., None]], dim=-1)
        if bgs is not None:
            bgs = torch.cat([bgs, torch.zeros_like(bgs[..., :1])], dim=-1)

    render, alpha = rasterize_to_pixels_reference(
        proj.means2d,
        proj.conics,
        cols,
        opacities.expand(C, -1),
        proj.radii,
        proj.depths,
        width,
        height,
        tile_size,
        backgrounds=bgs,
        absgrad=absgrad,
        block_size=block_size,
        chunk_elems=chunk_elems,
    )
    if render_mode == "RGB+ED":
        render = torch.cat([render[..., :-1], render[..., -1:] / alpha.clamp_min(1e-10)], dim=-1)

    tw, th = tile_grid(width, height, tile_size)
    info = {
        "camera_ids": None,
        "gaussian_ids": None,
        "radii": proj.radii,
        "means2d": proj.means2d,
        "depths": proj.depths,
        "conics": proj.conics,
        "opacities": opacities.expand(C, -1),
        "width": width,
        "height": height,
        "tile_size": tile_size,
        "tile_width": tw,
        "tile_height": th,
        "n_cameras": C,
    }
    return render, alpha, info
