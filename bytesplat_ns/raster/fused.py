"""The ``fused`` backend: bytesplat's CUDA tile rasterizer (``cuda/``).

Two entry points, both differentiable through torch autograd:

- :func:`rasterize_fused` has exactly :func:`bytesplat_ns.raster.reference.rasterize_reference`'s
  signature and return value. Projection + SH (gsplat's CUDA kernels, or the pure-PyTorch ones of
  ``raster.projection``/``raster.sh``), tile binning (torch, gsplat's ordering), then our forward
  kernel and our backward kernel behind :class:`_RasterizeFused`. Any loss works; eval and the
  viewer use it.
- :func:`fused_render_loss` renders AND computes splatfacto's loss
  ``(1-l)*mean|rgb-gt| + l*(1-SSIM(rgb, gt))`` (rgb = clamp(render + T*bg, 0, 1)) AND its
  2D gradients for all views in one kernel (:class:`_FusedLoss`), launched once
  (``mode="one_launch"``) or twice (``"two_launch"``, the measured-faster default: launch 1 only
  publishes the image), or as three plain kernels (``"split"``: render_fwd, the loss-gradient
  kernel, render_bwd; unmeasured); its backward hands the stashed gradients, scaled by the
  incoming gradient, to projection/SH autograd.

Pure-PyTorch twins that the tests hold the kernels against: :func:`render_2d_torch` (the
compositing of one set of 2D Gaussians, from the same tile lists) and :func:`splatfacto_loss_torch`
(the loss through pytorch_msssim's SSIM, which nerfstudio uses).
"""

from __future__ import annotations

import functools
import math
import os
import warnings
from typing import Dict, Literal, Optional, Tuple

import torch
from torch import Tensor

from bytesplat_ns.errors import SettingError
from bytesplat_ns.raster._build import CudaBuildError, load_extension

TILE_SIZE = 16
# Which schedule fused_render_loss uses by default (see its docstring and docs/fused_ssim.md).
# Measured on an H200 (1920x1080, SH 3, raster + loss fwd+bwd, docs/benchmarks/raster_h200.json):
# split 4.77 / 10.26 ms vs two launches 9.02 / 21.75 ms vs one launch 8.96 / 21.05 ms at 1M / 4M
# Gaussians: the compositing kernels run at their own occupancy once the SSIM scratch lives in a
# separate small kernel, which outweighs the per-pixel state's round trip through DRAM.
DEFAULT_MODE = "split"
# The schedules fused_render_loss can run (docs/fused_ssim.md): the fused kernel once or twice, or
# "split": render_fwd -> loss_grad (cuda/loss_grad.cu) -> render_bwd, three plain launches.
FUSED_MODES = ("one_launch", "two_launch", "split")
# Gaussians per shared-memory batch of render_fwd/render_bwd (cuda/render.cu kBatch): what the
# split schedule reports as its "capacity".
RENDER_BATCH = 256
SSIM_WIN_SIZE = 11
SSIM_WIN_SIGMA = 1.5

# Warp reduction of the backward kernels (cuda/common.cuh backward_slots): "butterfly" (a
# reduce-scatter over the warp, 13 shuffles per Gaussian with absgrad) or "shuffle" (the original one
# 5-shuffle warp sum per gradient component, 55 shuffles). Same gradients up to fp32 summation
# order; "shuffle" is kept for A/B runs. Env BYTESPLAT_BWD_REDUCE overrides.
DEFAULT_BWD_REDUCE = "butterfly"
BWD_REDUCE_CHOICES = ("butterfly", "shuffle")

_two_phase_logged = False
_clamp_inclusive: Optional[bool] = None


def warp_cull() -> bool:
    """Whether the kernels skip, per warp, the Gaussians that cannot reach alpha 1/255 at any of its
    pixels (``warp_mask`` in cuda/common.cuh; exact). On unless ``BYTESPLAT_WARP_CULL=0`` (A/B runs).
    Read at every launch."""
    value = os.environ.get("BYTESPLAT_WARP_CULL", "1").strip()
    if value not in ("0", "1"):
        raise SettingError(f"BYTESPLAT_WARP_CULL must be 0 or 1, got {value!r}")
    return value == "1"


def bwd_reduce() -> str:
    """The backward kernels' warp reduction: ``BYTESPLAT_BWD_REDUCE`` (butterfly|shuffle) or
    :data:`DEFAULT_BWD_REDUCE`. Read at every launch, so tests and benchmarks can switch it."""
    value = (os.environ.get("BYTESPLAT_BWD_REDUCE") or DEFAULT_BWD_REDUCE).strip().lower()
    if value not in BWD_REDUCE_CHOICES:
        raise SettingError(
            f"BYTESPLAT_BWD_REDUCE must be one of {', '.join(BWD_REDUCE_CHOICES)}, got {value!r}"
        )
    return value


def _torch_clamp_inclusive() -> bool:
    """Whether torch.clamp(x, 0, 1) passes the gradient at x == 0 / x == 1 (it does not in recent
    torch). The fused kernel follows the installed torch so it matches splatfacto's autograd."""
    global _clamp_inclusive
    if _clamp_inclusive is None:
        with torch.enable_grad():  # may be called where grad mode is off (autograd forward, eval)
            x = torch.tensor([0.0, 1.0], requires_grad=True)
            (g,) = torch.autograd.grad(torch.clamp(x, 0.0, 1.0).sum(), x)
        _clamp_inclusive = bool(g[0] > 0)
    return _clamp_inclusive


def _ops():
    return load_extension()


@functools.lru_cache(maxsize=None)
def ssim_window() -> Tensor:
    """pytorch_msssim's 1D Gaussian window (size 11, sigma 1.5), float32 on the CPU. Made once:
    its five small CPU ops sat on every step's host path before the first render (read-only)."""
    coords = torch.arange(SSIM_WIN_SIZE, dtype=torch.float) - SSIM_WIN_SIZE // 2
    g = torch.exp(-(coords**2) / (2 * SSIM_WIN_SIGMA**2))
    return g / g.sum()


# ----------------------------------------------------------------------------------------------
# Projection, SH and tile binning
# ----------------------------------------------------------------------------------------------


def _default_projection() -> str:
    env = os.environ.get("BYTESPLAT_PROJECTION")
    if env:
        return env
    try:
        import gsplat.cuda._wrapper  # noqa: F401

        return "gsplat"
    except Exception:
        return "torch"


def project(
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
    sh_degree: Optional[int],
    near_plane: float,
    far_plane: float,
    eps2d: float,
    projection: Optional[str] = None,
) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """3D -> 2D for C cameras. Returns radii [C,N] int32, means2d [C,N,2], depths [C,N],
    conics [C,N,3], colors [C,N,3] (post-activation), opacities [C,N]."""
    C = viewmats.shape[0]
    projection = projection or _default_projection()
    if projection == "gsplat":
        from gsplat.cuda._wrapper import fully_fused_projection, spherical_harmonics

        from bytesplat_ns.raster.projection import rigid_camera_centers

        radii, means2d, depths, conics, _ = fully_fused_projection(
            means, None, quats, scales, viewmats, Ks, width, height,
            eps2d=eps2d, near_plane=near_plane, far_plane=far_plane, packed=False,
        )
        if sh_degree is not None and colors.dim() == 3 and C > 1 and not viewmats.requires_grad \
                and colors.dtype == torch.float32 and means.dtype == torch.float32 and _optional_ops() is not None:
            # Shared coefficients, several cameras: one launch each way (raster/sh_views.py), where
            # gsplat would need them per camera (a [C,N,K,3] broadcast, 2 x 36 GiB for 50M
            # Gaussians, SH 3, 4 views) or one call per camera. Culled entries come out 0.
            from bytesplat_ns.raster.sh_views import multiview_sh_colors

            rgb = multiview_sh_colors(means, colors, viewmats, radii, sh_degree)
        elif sh_degree is not None:
            dirs = means[None, :, :] - rigid_camera_centers(viewmats)[:, None, :]
            if colors.dim() == 3 and C > 1:  # optimised cameras: one gsplat call per camera
                rgb = torch.stack([spherical_harmonics(sh_degree, dirs[c], colors, masks=radii[c] > 0) for c in range(C)])
            else:
                shs = colors.expand(C, -1, -1, -1) if colors.dim() == 3 else colors
                rgb = spherical_harmonics(sh_degree, dirs, shs, masks=radii > 0)
            rgb = torch.clamp_min(rgb + 0.5, 0.0)
    elif projection == "torch":
        from bytesplat_ns.raster.projection import camera_centers, project_gaussians
        from bytesplat_ns.raster.sh import sh_to_color

        pr = project_gaussians(
            means, quats, scales, viewmats, Ks, width, height,
            eps2d=eps2d, near_plane=near_plane, far_plane=far_plane,
        )
        radii, means2d, depths, conics = pr.radii, pr.means2d, pr.depths, pr.conics
        if sh_degree is not None:
            dirs = means[None, :, :] - camera_centers(viewmats)[:, None, :]
            shs = colors.expand(C, -1, -1, -1) if colors.dim() == 3 else colors
            rgb = sh_to_color(sh_degree, dirs, shs)
    else:
        raise ValueError(f"Unknown projection '{projection}' (use 'gsplat' or 'torch')")
    if sh_degree is None:
        rgb = colors.expand(C, -1, -1) if colors.dim() == 2 else colors
    opac = opacities.expand(C, -1) if opacities.dim() == 1 else opacities
    return radii, means2d, depths, conics, rgb, opac


def _binning_on_gpu(means2d: Tensor, radii: Tensor):
    """The extension when these inputs take the CUDA binning, else None (the torch twin)."""
    if (
        means2d.is_cuda
        and os.environ.get("BYTESPLAT_BINNING", "cuda") != "torch"
        and not radii.is_floating_point()
        and radii.dim() == 2
    ):
        return _optional_ops()
    return None


@torch.no_grad()
def bin_tiles(
    means2d: Tensor, radii: Tensor, depths: Tensor, width: int, height: int, tile_size: int = TILE_SIZE,
    known_total: Optional[int] = None,
) -> Tuple[Tensor, Tensor]:
    """Tile lists in gsplat's order: a Gaussian reaches the tiles its radius box touches; each
    tile's list is sorted front to back by camera depth (ties in Gaussian order).

    Returns ``offsets`` int32 [C*tiles_y*tiles_x + 1] (tile t's list is
    ``flatten_ids[offsets[t]:offsets[t+1]]``) and ``flatten_ids`` int32 (indices into [C*N]).

    ``known_total``: the number of (Gaussian, tile) pairs, i.e. ``tile_intersections(...).sum()``
    of these inputs, when the caller already has it on the host: the kernel then skips its one
    device read (the torch twin asserts it).

    CUDA tensors use our kernel (``cuda/binning.cu``, identical result, ~4x faster on an H200);
    ``BYTESPLAT_BINNING=torch`` forces :func:`bin_tiles_torch`, the pure-PyTorch twin.
    """
    ops = _binning_on_gpu(means2d, radii)
    if ops is not None:
        return tuple(ops.bin_tiles(
            means2d.detach().float().contiguous(),
            radii.to(torch.int32).contiguous(),
            depths.detach().float().contiguous(),
            int(width), int(height), int(tile_size), -1 if known_total is None else int(known_total),
        ))
    return bin_tiles_torch(means2d, radii, depths, width, height, tile_size, known_total)


@torch.no_grad()
def tile_intersections(means2d: Tensor, radii: Tensor, width: int, height: int,
                       tile_size: int = TILE_SIZE) -> Tensor:
    """Tiles reached per camera, [C] int64 on the inputs' device: what :func:`bin_tiles` of the
    same inputs counts, so a sender can tell a renderer its binning's size ahead of the records."""
    ops = _binning_on_gpu(means2d, radii)
    if ops is not None:
        return ops.tile_intersections(means2d.detach().float().contiguous(), radii.to(torch.int32).contiguous(),
                                      int(width), int(height), int(tile_size))
    return _tile_boxes(means2d, radii, width, height, tile_size)[0].sum(1)


def _tile_boxes(means2d: Tensor, radii: Tensor, width: int, height: int, tile_size: int):
    """(counts [C,N] int64, x0 [C,N], y0 [C,N], nx [C,N]): each Gaussian's tile box, as the kernel's."""
    tw, th = math.ceil(width / tile_size), math.ceil(height / tile_size)
    r = radii.to(torch.float32) / tile_size
    tx = means2d[..., 0].detach().float() / tile_size
    ty = means2d[..., 1].detach().float() / tile_size
    x0 = torch.floor(tx - r).clamp(0, tw).long()
    x1 = torch.ceil(tx + r).clamp(0, tw).long()
    y0 = torch.floor(ty - r).clamp(0, th).long()
    y1 = torch.ceil(ty + r).clamp(0, th).long()
    nx = (x1 - x0).clamp_min(0)
    counts = torch.where(radii > 0, nx * (y1 - y0).clamp_min(0), torch.zeros_like(nx))
    return counts, x0, y0, nx


_optional_warned = False


def _optional_ops():
    """The extension for the helpers that have a fallback (tile binning: its torch twin; SH of
    several cameras: gsplat per camera), or None (with one warning) when it cannot be built here:
    callers such as pruning or the projection with the gsplat backend must keep working."""
    global _optional_warned
    try:
        return _ops()
    except CudaBuildError as e:
        if not _optional_warned:
            warnings.warn(f"bytesplat: CUDA kernels unavailable, binning tiles in torch and SH per camera in gsplat ({e})")
            _optional_warned = True
        return None


def bin_tiles_torch(
    means2d: Tensor, radii: Tensor, depths: Tensor, width: int, height: int, tile_size: int = TILE_SIZE,
    known_total: Optional[int] = None,
) -> Tuple[Tensor, Tensor]:
    """Pure-PyTorch :func:`bin_tiles` (CPU tensors, ``BYTESPLAT_BINNING=torch``, the kernel's oracle)."""
    C, N = radii.shape
    dev = means2d.device
    tw, th = math.ceil(width / tile_size), math.ceil(height / tile_size)
    ntot = C * tw * th
    counts, x0, y0, nx = _tile_boxes(means2d, radii, width, height, tile_size)
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


# ----------------------------------------------------------------------------------------------
# Autograd wrappers of the kernels
# ----------------------------------------------------------------------------------------------


def _flat(t: Tensor, d: int) -> Tensor:
    return t.reshape(-1, d).contiguous().float() if d > 1 else t.reshape(-1).contiguous().float()


class _RasterizeFused(torch.autograd.Function):
    """2D Gaussians -> (render [C,H,W,3] incl. T*bg, alpha [C,H,W,1]); backward by our kernel."""

    @staticmethod
    def forward(ctx, means2d, conics, colors, opacities, backgrounds, offsets, flatten_ids, W, H, absgrad):
        C = means2d.shape[0]
        ops = _ops()
        m, c, col, o = _flat(means2d, 2), _flat(conics, 3), _flat(colors, 3), _flat(opacities, 1)
        bg = backgrounds.contiguous().float() if backgrounds is not None else None
        cull = warp_cull()
        rgb, alpha, T, last, _ = ops.render_fwd(m, c, col, o, bg, offsets, flatten_ids, C, W, H, False, cull)
        ctx.save_for_backward(means2d, m, c, col, o, bg, offsets, flatten_ids, T, last)
        ctx.dims = (C, W, H, absgrad, backgrounds is not None and backgrounds.requires_grad)
        ctx.butterfly = bwd_reduce() == "butterfly"  # validated here, where errors are easy to place
        ctx.warp_cull = cull
        return rgb, alpha

    @staticmethod
    def backward(ctx, v_rgb, v_alpha):
        means2d, m, c, col, o, bg, offsets, flatten_ids, T, last = ctx.saved_tensors
        C, W, H, absgrad, bg_grad = ctx.dims
        if v_rgb is None:
            v_rgb = torch.zeros(C, H, W, 3, device=m.device)
        va = v_alpha.contiguous().float() if v_alpha is not None else None
        vm, vc, vcol, vo, vabs, _ = _ops().render_bwd(
            m, c, col, o, bg, offsets, flatten_ids, C, W, H, T, last, v_rgb.contiguous().float(), va, absgrad,
            ctx.butterfly, False, None, ctx.warp_cull,
        )
        N = means2d.shape[1]
        if absgrad:
            means2d.absgrad = vabs.view(C, N, 2)  # read by gsplat's DefaultStrategy(absgrad=True)
        v_bg = (v_rgb * T[..., None]).sum((1, 2)) if bg_grad else None
        return (vm.view(C, N, 2), vc.view(C, N, 3), vcol.view(C, N, 3), vo.view(C, N), v_bg,
                None, None, None, None, None)


def _split_loss(m, c, col, o, bg, gt, offsets, flatten_ids, C, W, H, ssim_lambda, absgrad, butterfly,
                contribution=False, cull=True):
    """The split schedule: three plain launches, nothing but images crossing between them.

    render_fwd (with the backgrounds: render + T*bg, alpha, T, last, and with ``contribution`` each
    pixel's stopping Gaussian) -> loss_grad (dL/d render = the per-pixel loss gradient times
    torch.clamp's mask, clamped rgb, per-region L1 and SSIM sums) -> render_bwd (v_render and the
    backgrounds, which it turns into the alpha term; the pruning score with ``contribution``).
    Returns what fused_loss returns, info = (two_phase, capacity, resident, smem) =
    (0, RENDER_BATCH, 0, 0)."""
    ops = _ops()
    render, alpha, T, last, stop = ops.render_fwd(m, c, col, o, bg, offsets, flatten_ids, C, W, H, bool(contribution),
                                                  cull)
    v_render, rgb, partials = ops.loss_grad(render, gt, float(ssim_lambda), ssim_window(), _torch_clamp_inclusive())
    del render
    vm, vc, vcol, vo, vabs, contrib = ops.render_bwd(
        m, c, col, o, bg, offsets, flatten_ids, C, W, H, T, last, v_render, None, bool(absgrad), bool(butterfly),
        bool(contribution), stop if contribution else None, cull)
    info = torch.tensor([0, RENDER_BATCH, 0, 0], dtype=torch.long)
    return rgb, alpha, partials, vm, vc, vcol, vo, vabs, info, contrib


class _FusedLoss(torch.autograd.Function):
    """Render + loss + its 2D gradients (``schedule``: one_launch, two_launch, split). Forward
    returns (loss, rgb, alpha, stats, contribution); only the loss is differentiable; backward
    scales the stashed gradients. ``contribution=True``: the backward walk, which runs inside this
    forward, also gathers the pruning score (largest alpha*T per view and Gaussian,
    ``pruning.contribution_scores_2d``'s definition) into ``contribution`` [C,N]; otherwise it is
    an empty tensor and the kernels skip it."""

    @staticmethod
    def forward(ctx, means2d, conics, colors, opacities, backgrounds, gt, offsets, flatten_ids, W, H,
                ssim_lambda, absgrad, capacity, blocks_per_sm, schedule, contribution=False):
        global _two_phase_logged
        C, N = means2d.shape[0], means2d.shape[1]
        if schedule not in FUSED_MODES:
            raise ValueError(f"schedule must be one of {', '.join(FUSED_MODES)}, got {schedule!r}")
        force_two_phase = schedule == "two_launch"
        reduce, cull = bwd_reduce(), warp_cull()  # read once: the launch and the info agree
        m, c, col, o = _flat(means2d, 2), _flat(conics, 3), _flat(colors, 3), _flat(opacities, 1)
        bg, gtc = backgrounds.contiguous().float(), gt.contiguous().float()
        if schedule == "split":
            out = _split_loss(m, c, col, o, bg, gtc, offsets, flatten_ids, C, W, H, ssim_lambda, absgrad,
                              reduce == "butterfly", contribution, cull)
        else:
            out = _ops().fused_loss(
                m, c, col, o, bg, gtc, offsets, flatten_ids,
                C, W, H, float(ssim_lambda), ssim_window(), int(capacity or 0), int(blocks_per_sm),
                bool(absgrad), force_two_phase, _torch_clamp_inclusive(), reduce == "butterfly", bool(contribution),
                cull,
            )
        rgb, alpha, partials, vm, vc, vcol, vo, vabs, kinfo, contrib = out
        contrib = contrib.view(C, N) if contribution else contrib
        two_phase, cap, resident, smem = (int(v) for v in kinfo.tolist())
        if two_phase and not force_two_phase and not _two_phase_logged:
            _two_phase_logged = True
            warnings.warn(
                f"bytesplat fused loss: only {resident} blocks fit on the GPU at once, fewer than the "
                f"{min(math.ceil(W / TILE_SIZE), math.ceil(H / TILE_SIZE)) + 2} the one-launch neighbour "
                f"wait needs at {W}x{H}; using the two-launch path (same result)."
            )
        p = partials.double().sum(0)
        n_l1 = C * H * W * 3
        n_ssim = C * 3 * (H - SSIM_WIN_SIZE + 1) * (W - SSIM_WIN_SIZE + 1)
        l1 = p[0] / n_l1
        ssim = p[1] / n_ssim
        loss = ((1 - ssim_lambda) * l1 + ssim_lambda * (1 - ssim)).float()
        ctx.save_for_backward(means2d, vm, vc, vcol, vo, vabs)
        ctx.meta = (C, N, absgrad)
        stats = torch.stack([l1, ssim]).float()
        ctx.mark_non_differentiable(rgb, alpha, stats, contrib)
        ctx.kinfo = dict(schedule=schedule, two_phase=bool(two_phase), capacity=cap, resident_blocks=resident,
                         smem_bytes=smem, bwd_reduce=reduce, contribution=bool(contribution), warp_cull=cull)
        _FusedLoss.last_kernel_info = ctx.kinfo
        return loss, rgb, alpha, stats, contrib

    @staticmethod
    def backward(ctx, g, _g_rgb, _g_alpha, _g_stats, _g_contrib):
        means2d, vm, vc, vcol, vo, vabs = ctx.saved_tensors
        C, N, absgrad = ctx.meta
        if absgrad:
            means2d.absgrad = (vabs * g.abs()).view(C, N, 2)
        return (
            (vm * g).view(C, N, 2), (vc * g).view(C, N, 3), (vcol * g).view(C, N, 3), (vo * g).view(C, N),
            None, None, None, None, None, None, None, None, None, None, None, None,
        )


_FusedLoss.last_kernel_info = {}


# ----------------------------------------------------------------------------------------------
# Public API
# ----------------------------------------------------------------------------------------------


def fused_schedule(mode: Optional[str] = None) -> str:
    """The fused loss's schedule (one of :data:`FUSED_MODES`): ``mode``, else env
    ``BYTESPLAT_FUSED_MODE``, else :data:`DEFAULT_MODE`. Read at every call."""
    mode = (mode or os.environ.get("BYTESPLAT_FUSED_MODE") or DEFAULT_MODE).strip().lower()
    if mode not in FUSED_MODES:
        raise SettingError(f"mode (or BYTESPLAT_FUSED_MODE) must be one of {', '.join(FUSED_MODES)}, got {mode!r}")
    return mode


def _check(width: int, height: int, tile_size: int, device: torch.device):
    if tile_size != TILE_SIZE:
        raise ValueError(f"The fused rasterizer works on {TILE_SIZE}x{TILE_SIZE} tiles, got tile_size={tile_size}")
    if device.type != "cuda":
        raise CudaBuildError(f"The fused rasterizer needs CUDA tensors, got tensors on '{device}'.")


def _strategy_info(means2d, radii, depths, conics, opac, offsets, flatten_ids, width, height, tile_size) -> Dict:
    """The ``info`` dict gsplat's DefaultStrategy (and our tools) read, as the other backends return it."""
    return {
        "means2d": means2d,
        "radii": radii,
        "depths": depths,
        "conics": conics,
        "width": width,
        "height": height,
        "n_cameras": means2d.shape[0],
        "opacities": opac,
        "tile_size": tile_size,
        "gaussian_ids": None,
        "camera_ids": None,
        "isect_offsets": offsets,
        "flatten_ids": flatten_ids,
    }


def rasterize_fused(
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
    projection: Optional[str] = None,
) -> Tuple[Tensor, Tensor, Dict]:
    """Render C views (same contract as ``rasterize_reference``); gradients by our CUDA backward.

    With ``render_mode="RGB+ED"`` a 4th channel holds the expected depth (sum w_i z_i / alpha);
    it is rendered by a second pass of the same kernels (``absgrad`` then counts the RGB pass only).
    """
    _check(width, height, tile_size, means.device)
    if render_mode not in ("RGB", "RGB+ED"):
        raise ValueError(f"render_mode must be 'RGB' or 'RGB+ED', got {render_mode!r}")
    radii, means2d, depths, conics, rgb, opac = project(
        means, quats, scales, opacities, colors, viewmats, Ks, width, height,
        sh_degree=sh_degree, near_plane=near_plane, far_plane=far_plane, eps2d=eps2d, projection=projection,
    )
    offsets, flatten_ids = bin_tiles(means2d, radii, depths, width, height, tile_size)
    render, alpha = _RasterizeFused.apply(
        means2d, conics, rgb, opac, backgrounds, offsets, flatten_ids, width, height, absgrad
    )
    if render_mode == "RGB+ED":
        dcol = torch.cat([depths[..., None], torch.zeros_like(depths)[..., None].expand(-1, -1, 2)], -1)
        dimg, _ = _RasterizeFused.apply(means2d, conics, dcol, opac, None, offsets, flatten_ids, width, height, False)
        render = torch.cat([render, dimg[..., :1] / alpha.clamp(min=1e-10)], -1)
    info = _strategy_info(means2d, radii, depths, conics, opac, offsets, flatten_ids, width, height, tile_size)
    return render, alpha, info


def fused_render_loss(
    means: Tensor,
    quats: Tensor,
    scales: Tensor,
    opacities: Tensor,
    colors: Tensor,
    viewmats: Tensor,
    Ks: Tensor,
    width: int,
    height: int,
    gt_images: Tensor,
    backgrounds: Optional[Tensor] = None,
    *,
    sh_degree: Optional[int] = None,
    ssim_lambda: float = 0.2,
    absgrad: bool = False,
    near_plane: float = 0.01,
    far_plane: float = 1e10,
    eps2d: float = 0.3,
    tile_size: int = 16,
    projection: Optional[str] = None,
    capacity: Optional[int] = None,
    blocks_per_sm: int = 2,
    mode: Optional[str] = None,
    force_two_phase: bool = False,
    contribution: bool = False,
) -> Tuple[Tensor, Tensor, Tensor, Dict]:
    """splatfacto's loss and its gradients for C views in the fused kernel (see ``mode``).

    ``loss = (1-ssim_lambda)*mean|rgb-gt| + ssim_lambda*(1 - SSIM(rgb, gt))`` with
    ``rgb = clamp(render + T*bg, 0, 1)``, SSIM as ``pytorch_msssim.SSIM(data_range=1,
    size_average=True, channel=3, win_size=11, win_sigma=1.5)`` over all C views.
    ``gt_images`` [C,H,W,3] float in [0,1]; ``backgrounds`` [C,3] (None: black).

    Returns ``(loss, rgb [C,H,W,3] detached, alpha [C,H,W,1] detached, info)``; ``loss.backward()``
    fills the gradients of means/quats/scales/opacities/colors (and viewmats when they require
    grad) and ``info["means2d"].grad`` / ``.absgrad``. ``info`` also holds ``l1``, ``ssim`` and
    ``kernel`` (two_phase, capacity, ...). Advanced: ``capacity`` overrides the Gaussians per tile
    kept on chip (tests use it to force the streaming path); ``blocks_per_sm`` sets the shared
    memory budget per block. ``mode``: ``"one_launch"`` (the single kernel; falls back to two
    launches, logged once, when too few blocks fit for its neighbour wait), ``"two_launch"``
    (launch 1 renders and publishes rgb, launch 2 re-renders on chip, computes the loss gradient and
    the backward; same result), ``"split"`` (render_fwd, then the loss-gradient kernel
    ``loss_grad`` writes dL/d render, then render_bwd; same result, ``capacity`` and
    ``blocks_per_sm`` unused), or None for :data:`DEFAULT_MODE` (env ``BYTESPLAT_FUSED_MODE``).
    ``force_two_phase=True`` is ``mode="two_launch"``. ``contribution=True`` (any mode): the
    backward also gathers each Gaussian's pruning score per view (its largest ``alpha * T``, the
    Gaussian that stops a pixel counting with the weight it would have had: exactly
    ``pruning.contribution_scores_2d``), returned as ``info["contribution"]`` [C,N].
    """
    schedule = "two_launch" if force_two_phase else fused_schedule(mode)
    _check(width, height, tile_size, means.device)
    C = viewmats.shape[0]
    if gt_images.shape != (C, height, width, 3):
        raise ValueError(f"gt_images must be [C,H,W,3] = {[C, height, width, 3]}, got {list(gt_images.shape)}")
    if height < SSIM_WIN_SIZE or width < SSIM_WIN_SIZE:
        raise ValueError(f"SSIM needs images of at least {SSIM_WIN_SIZE}x{SSIM_WIN_SIZE} pixels")
    if backgrounds is None:
        backgrounds = torch.zeros(C, 3, device=means.device)
    radii, means2d, depths, conics, rgb, opac = project(
        means, quats, scales, opacities, colors, viewmats, Ks, width, height,
        sh_degree=sh_degree, near_plane=near_plane, far_plane=far_plane, eps2d=eps2d, projection=projection,
    )
    offsets, flatten_ids = bin_tiles(means2d, radii, depths, width, height, tile_size)
    _torch_clamp_inclusive()
    loss, img, alpha, stats, contrib = _FusedLoss.apply(
        means2d, conics, rgb, opac, backgrounds.detach(), gt_images.detach(), offsets, flatten_ids,
        width, height, ssim_lambda, absgrad, capacity, blocks_per_sm, schedule, contribution,
    )
    info = {
        **_strategy_info(means2d, radii, depths, conics, opac, offsets, flatten_ids, width, height, tile_size),
        "l1": stats[0],
        "ssim": stats[1],
        "kernel": dict(_FusedLoss.last_kernel_info),
    }
    if contribution:
        info["contribution"] = contrib  # read by pruning.scores_from_info (CONTRIBUTION_INFO_KEY)
    return loss, img, alpha, info


# ----------------------------------------------------------------------------------------------
# Training-time cross-check against the unfused path (diagnostics)
# ----------------------------------------------------------------------------------------------


def _norm_err(a: Optional[Tensor], b: Optional[Tensor]) -> float:
    if a is None or b is None:
        return float("nan") if (a is None) != (b is None) else 0.0
    a, b = a.detach().double(), b.detach().double()
    den = b.norm().item()
    return (a - b).norm().item() / den if den > 0 else (a - b).norm().item()


def compare_with_unfused(
    raster_args: Tuple,
    gt_images: Tensor,
    backgrounds: Tensor,
    params: Dict[str, Tensor],
    *,
    sh_degree: Optional[int],
    ssim_lambda: float,
    absgrad: bool,
    unfused_backend: Optional[str] = None,
) -> Dict[str, float]:
    """One training step's fused loss and gradients against the unfused path on the same inputs.

    The unfused path is what splatfacto does: ``unfused_backend`` (gsplat on CUDA, the reference
    elsewhere) renders, ``rgb = clamp(render + (1-alpha) bg, 0, 1)``, L1 + pytorch_msssim SSIM,
    autograd. Returns norm-wise relative errors (fused vs unfused) of the loss, of the 2D gradient
    handed to DefaultStrategy (``means2d.grad`` and ``.absgrad``, visible entries), of its
    per-Gaussian statistic (||absgrad * (W/2, H/2)||), of every parameter gradient, and whether
    the radii agree. Uses ``torch.autograd.grad`` (nothing accumulates into ``.grad``); costs one
    extra unfused and one extra fused step. ``ByteSplatModel`` runs it every
    ``BYTESPLAT_FUSED_CHECK`` steps.
    """
    from bytesplat_ns.raster import rasterize

    backend = unfused_backend or ("gsplat" if gt_images.device.type == "cuda" else "reference")
    names = list(params)
    leaves = [params[n] for n in names]
    W, H = raster_args[7], raster_args[8]

    def grads(loss: Tensor, means2d: Tensor):
        # retain_graph: raster_args' own nodes (exp, sigmoid, cat) are shared with the real step
        out = torch.autograd.grad(loss, [means2d] + leaves, allow_unused=True, retain_graph=True)
        return out[0], list(out[1:]), getattr(means2d, "absgrad", None)

    with torch.enable_grad():
        render, alpha, info_u = rasterize(*raster_args, backend=backend, sh_degree=sh_degree, absgrad=absgrad)
        loss_u = splatfacto_loss_torch(render, alpha, gt_images, backgrounds, ssim_lambda, render_has_bg=False)
        g2_u, gp_u, abs_u = grads(loss_u, info_u["means2d"])
        loss_f, _, _, info_f = fused_render_loss(*raster_args, gt_images, backgrounds, sh_degree=sh_degree,
                                                 ssim_lambda=ssim_lambda, absgrad=absgrad)
        g2_f, gp_f, abs_f = grads(loss_f, info_f["means2d"])
    vis = info_u["radii"] > 0
    out = {
        "loss_unfused": float(loss_u),
        "loss_fused": float(loss_f),
        "loss": abs(float(loss_f) - float(loss_u)) / max(abs(float(loss_u)), 1e-30),
        "radii_equal": float(torch.equal(info_f["radii"].to(info_u["radii"].dtype), info_u["radii"])),
        "means2d_grad": _norm_err(g2_f[vis], g2_u[vis]),
    }
    if absgrad and abs_f is not None and abs_u is not None:
        scale = torch.tensor([W / 2.0, H / 2.0], device=abs_u.device)
        out["means2d_absgrad"] = _norm_err(abs_f[vis], abs_u[vis])
        out["grad2d_stat"] = _norm_err((abs_f * scale).norm(dim=-1)[vis], (abs_u * scale).norm(dim=-1)[vis])
    for n, a, b in zip(names, gp_f, gp_u):
        out[f"grad_{n}"] = _norm_err(a, b)
    return out


# ----------------------------------------------------------------------------------------------
# Pure-PyTorch twins (test oracles at the kernel boundary)
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


def splatfacto_loss_torch(render: Tensor, alpha: Tensor, gt_images: Tensor, backgrounds: Optional[Tensor],
                          ssim_lambda: float = 0.2, render_has_bg: bool = True) -> Tensor:
    """splatfacto's loss on a rendered batch via pytorch_msssim (the unfused path).

    ``render`` [C,H,W,3] already includes T*bg when ``render_has_bg`` (as rasterizers return it
    when given backgrounds); otherwise ``(1-alpha)*bg`` is added, as splatfacto does.
    """
    from pytorch_msssim import SSIM

    rgb = render
    if not render_has_bg and backgrounds is not None:
        rgb = rgb + (1 - alpha) * backgrounds[:, None, None, :]
    rgb = torch.clamp(rgb, 0.0, 1.0)
    l1 = torch.abs(gt_images - rgb).mean()
    ssim = SSIM(data_range=1.0, size_average=True, channel=3, win_size=SSIM_WIN_SIZE, win_sigma=SSIM_WIN_SIGMA)
    sim = ssim(gt_images.permute(0, 3, 1, 2), rgb.permute(0, 3, 1, 2))
    return (1 - ssim_lambda) * l1 + ssim_lambda * (1 - sim)
