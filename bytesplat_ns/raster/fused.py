"""The ``fused`` backend: bytesplat's CUDA tile rasterizer (``cuda/``), public front end.

Two entry points, both differentiable through torch autograd:

- :func:`rasterize_fused` has exactly :func:`bytesplat_ns.raster.reference.rasterize_reference`'s
  signature and return value. Projection + SH (gsplat's CUDA kernels, or the pure-PyTorch ones of
  ``raster.projection``/``raster.sh``), tile binning (``cuda/binning.cu``, gsplat's ordering), then
  our forward and backward kernels. Any loss works; eval and the viewer use it.
- :func:`fused_render_loss` renders AND computes splatfacto's loss
  ``(1-l)*mean|rgb-gt| + l*(1-SSIM(rgb, gt))`` (rgb = clamp(render + T*bg, 0, 1)) AND its 2D
  gradients for all views, in one of three schedules (``FusedOptions.schedule``): ``"split"`` (the
  default, the measured fastest: render_fwd, the loss-gradient kernel, render_bwd),
  ``"two_launch"`` (the fused kernel twice: launch 1 only publishes the image) or ``"one_launch"``;
  its backward hands the stashed gradients, scaled by the incoming gradient, to projection/SH autograd.

Every behaviour switch arrives as a :class:`~bytesplat_ns.raster.options.FusedOptions` argument
(the model passes its ``fused`` config's). The autograd Functions are in ``raster._wrapper``, the
PyTorch twins the kernels are tested against in ``raster._torch_impl``, splatfacto's loss in
``raster.loss`` and the training-time cross-check in ``raster.diagnostics``.
"""

from __future__ import annotations

from typing import Dict, Literal, Optional, Tuple, Union

import torch
from torch import Tensor

from bytesplat_ns.raster import _wrapper
from bytesplat_ns.raster._build import CudaBuildError
from bytesplat_ns.raster._torch_impl import bin_tiles_torch, render_2d_torch, tile_intersections_torch
from bytesplat_ns.raster._wrapper import RENDER_BATCH, TILE_SIZE, _FusedLoss, _RasterizeFused, ssim_window
from bytesplat_ns.raster.loss import SSIM_WIN_SIGMA, SSIM_WIN_SIZE, splatfacto_loss_torch
from bytesplat_ns.raster.options import DEFAULT_OPTIONS, SCHEDULES, FusedOptions
from bytesplat_ns.raster.sh import ShCoefficients, stacked_coefficients
from bytesplat_ns.raster.tile_reach import opacity_aware_radii
from bytesplat_ns.raster.tiles import tile_order
from bytesplat_ns.raster.warp_masks import trim_tile_lists_torch

__all__ = [
    "DEFAULT_OPTIONS", "RENDER_BATCH", "SCHEDULES", "SSIM_WIN_SIGMA", "SSIM_WIN_SIZE", "TILE_SIZE",
    "FusedOptions", "bin_tiles", "bin_tiles_in_room", "bin_tiles_torch", "fused_render_loss", "project",
    "rasterize_fused", "render_2d_torch", "resolve_projection", "splatfacto_loss_torch", "ssim_window", "tile_intersections",
    "tile_lists", "tile_lists_in_room", "trim_tile_lists",
]


# ----------------------------------------------------------------------------------------------
# Projection, SH and tile binning
# ----------------------------------------------------------------------------------------------


def resolve_projection(projection: Optional[str], device: torch.device) -> str:
    """``auto`` (or None) -> ``gsplat`` for CUDA tensors when its CUDA extension imports, else ``torch``."""
    if projection not in (None, "auto"):
        return projection
    if device.type != "cuda":
        return "torch"
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
    colors: Union[Tensor, ShCoefficients],
    viewmats: Tensor,
    Ks: Tensor,
    width: int,
    height: int,
    *,
    sh_degree: Optional[int],
    near_plane: float,
    far_plane: float,
    eps2d: float,
    projection: Optional[str] = "auto",
) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """3D -> 2D for C cameras. Returns radii [C,N] int32, means2d [C,N,2], depths [C,N],
    conics [C,N,3], colors [C,N,3] (post-activation), opacities [C,N]. ``projection``: gsplat, torch
    or auto (None: auto; see :func:`resolve_projection`). ``colors``: post-activation [N,3] / [C,N,3]
    (``sh_degree=None``), SH coefficients [N,K,3] / [C,N,K,3], or ``ShCoefficients`` (DC and rest
    apart, read without stacking them by the SH kernel where it serves, see :func:`_sh_kernel_serves`)."""
    C = viewmats.shape[0]
    if isinstance(colors, ShCoefficients) and sh_degree is None:
        raise ValueError("ShCoefficients are SH coefficients: pass their sh_degree")
    projection = resolve_projection(projection, means.device)
    if projection == "gsplat":
        from gsplat.cuda._wrapper import fully_fused_projection, spherical_harmonics

        from bytesplat_ns.raster.projection import rigid_camera_centers

        radii, means2d, depths, conics, _ = fully_fused_projection(
            means, None, quats, scales, viewmats, Ks, width, height,
            eps2d=eps2d, near_plane=near_plane, far_plane=far_plane, packed=False,
        )
        if sh_degree is not None and _sh_kernel_serves(means, colors, viewmats):
            from bytesplat_ns.raster.sh_views import multiview_sh_colors

            rgb = multiview_sh_colors(means, colors, viewmats, radii, sh_degree)
        elif sh_degree is not None:
            colors = stacked_coefficients(colors)
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
            colors = stacked_coefficients(colors)
            dirs = means[None, :, :] - camera_centers(viewmats)[:, None, :]
            shs = colors.expand(C, -1, -1, -1) if colors.dim() == 3 else colors
            rgb = sh_to_color(sh_degree, dirs, shs)
    else:
        raise ValueError(f"Unknown projection '{projection}' (use 'gsplat' or 'torch')")
    if sh_degree is None:
        rgb = colors.expand(C, -1, -1) if colors.dim() == 2 else colors
    opac = opacities.expand(C, -1) if opacities.dim() == 1 else opacities
    return radii, means2d, depths, conics, rgb, opac


def _sh_kernel_serves(means: Tensor, colors: Union[Tensor, ShCoefficients], viewmats: Tensor) -> bool:
    """Whether our SH kernel (raster/sh_views.py) computes the colors after gsplat's projection: for
    coefficients shared by all cameras, fixed cameras (it has no camera gradient; optimised cameras
    keep gsplat's SH) and float32, where the extension builds. ``ShCoefficients`` take it for any
    number of cameras (the training step's one included: gsplat would need them stacked); stacked
    [N,K,3] ones for C > 1 (gsplat needs a [C,N,K,3] broadcast, 2 x 36 GiB at 50M Gaussians, SH 3,
    4 views, or one call per camera). Culled entries come out 0 (gsplat's masked call leaves them
    unset; neither is rendered)."""
    split = isinstance(colors, ShCoefficients)
    if viewmats.requires_grad or means.dtype != torch.float32:
        return False
    if split:
        if colors.dc.dtype != torch.float32 or colors.rest.dtype != torch.float32:
            return False
    elif colors.dim() != 3 or viewmats.shape[0] == 1 or colors.dtype != torch.float32:
        return False
    return _wrapper._optional_ops() is not None


def _binning_on_gpu(means2d: Tensor, radii: Tensor, binning: str):
    """The extension when these inputs take the CUDA binning, else None (the torch twin)."""
    per_axis = radii.dim() == 3 and radii.shape[-1] == 2
    if binning == "cuda" and means2d.is_cuda and not radii.is_floating_point() and (radii.dim() == 2 or per_axis):
        return _wrapper._optional_ops()
    return None


@torch.no_grad()
def bin_tiles(
    means2d: Tensor, radii: Tensor, depths: Tensor, width: int, height: int, tile_size: int = TILE_SIZE,
    known_total: Optional[int] = None, binning: str = "cuda",
) -> Tuple[Tensor, Tensor]:
    """Tile lists in gsplat's order: a Gaussian reaches the tiles its radius box touches; each
    tile's list is sorted front to back by camera depth (ties in Gaussian order). ``radii`` [C,N]
    (the same along x and y) or [C,N,2] (x, y: ``tile_reach.opacity_aware_radii``).

    Returns ``offsets`` int32 [C*tiles_y*tiles_x + 1] (tile t's list is
    ``flatten_ids[offsets[t]:offsets[t+1]]``) and ``flatten_ids`` int32 (indices into [C*N]).

    ``known_total``: the number of (Gaussian, tile) pairs, i.e. ``tile_intersections(...).sum()``
    of these inputs, when the caller already has it on the host: the kernel then skips its one
    device read (the torch twin asserts it).

    ``binning="cuda"``: CUDA tensors use our kernel (``cuda/binning.cu``, identical result, ~4x
    faster on an H200); ``"torch"`` (``FusedOptions.binning``) forces :func:`bin_tiles_torch`.
    """
    ops = _binning_on_gpu(means2d, radii, binning)
    if ops is not None:
        return _bin_tiles_cuda(ops, means2d, radii, depths, width, height, tile_size, known_total)[:2]
    return bin_tiles_torch(means2d, radii, depths, width, height, tile_size, known_total)


def _bin_tiles_cuda(ops, means2d: Tensor, radii: Tensor, depths: Tensor, width: int, height: int, tile_size: int,
                    known_total: Optional[int]) -> Tuple[Tensor, Tensor, Tensor]:
    return tuple(ops.bin_tiles(
        means2d.detach().float().contiguous(),
        radii.to(torch.int32).contiguous(),
        depths.detach().float().contiguous(),
        int(width), int(height), int(tile_size), -1 if known_total is None else int(known_total),
    ))


@torch.no_grad()
def bin_tiles_in_room(
    means2d: Tensor, radii: Tensor, depths: Tensor, width: int, height: int, tile_size: int = TILE_SIZE,
    room: Optional[int] = None, binning: str = "cuda",
) -> Tuple[Tensor, Tensor, Tensor]:
    """:func:`bin_tiles` into buffers with room for ``room`` (Gaussian, tile) pairs, sized by the caller
    ahead of time, so that nothing is read back from the GPU (None: sized by the true count, read back).
    Returns ``(offsets, flatten_ids, total)``, ``total`` [1] int64 on the inputs' device being the true
    number of pairs: the lists are :func:`bin_tiles`' exactly when ``total <= room`` (``flatten_ids`` may be
    longer than the lists, as with ``trim_tile_lists``); otherwise the pairs past the room are missing. The
    torch twin reads its count and always returns the complete lists."""
    ops = _binning_on_gpu(means2d, radii, binning)
    if ops is not None:
        return _bin_tiles_cuda(ops, means2d, radii, depths, width, height, tile_size, room)
    offsets, flatten_ids = bin_tiles_torch(means2d, radii, depths, width, height, tile_size)
    return offsets, flatten_ids, torch.full((1,), flatten_ids.numel(), dtype=torch.int64, device=means2d.device)


@torch.no_grad()
def tile_intersections(means2d: Tensor, radii: Tensor, width: int, height: int,
                       tile_size: int = TILE_SIZE, binning: str = "cuda") -> Tensor:
    """Tiles reached per camera, [C] int64 on the inputs' device: what :func:`bin_tiles` of the
    same inputs counts, so a sender can tell a renderer its binning's size ahead of the records."""
    ops = _binning_on_gpu(means2d, radii, binning)
    if ops is not None:
        return ops.tile_intersections(means2d.detach().float().contiguous(), radii.to(torch.int32).contiguous(),
                                      int(width), int(height), int(tile_size))
    return tile_intersections_torch(means2d, radii, width, height, tile_size)


def tile_radii(radii: Tensor, conics: Tensor, opacities: Tensor, options: FusedOptions) -> Tensor:
    """The radii the binning takes: the projection's, or with ``options.opacity_aware_tiles`` the
    per-axis reach of each Gaussian's alpha >= 1/255 ellipse (``tile_reach``; the same render), from
    our kernel (``cuda/tile_reach.cu``, the same radii) on CUDA tensors with ``options.tile_reach ==
    "cuda"``, else from its torch definition."""
    if not options.opacity_aware_tiles:
        return radii
    ops = _wrapper._optional_ops() if options.tile_reach == "cuda" and radii.is_cuda else None
    if ops is not None and radii.dim() == 2:
        return ops.opacity_aware_radii(radii.to(torch.int32).contiguous(), conics.detach().float().contiguous(),
                                       opacities.detach().float().contiguous())
    return opacity_aware_radii(radii, conics, opacities)


@torch.no_grad()
def trim_tile_lists(means2d: Tensor, conics: Tensor, opacities: Tensor, offsets: Tensor, flatten_ids: Tensor,
                    width: int, height: int) -> Tuple[Tensor, Tensor]:
    """The tile lists without the entries whose Gaussian reaches no 8x4 pixel block of their tile
    (``FusedOptions.trim_tile_lists``; the rows test of ``raster.warp_masks``): ``cuda/warp_masks.cu`` on CUDA
    tensors (no device read: the arrays keep their length, the lists are their first ``offsets[-1]``
    entries), else its torch twin. Every list keeps its order, every image its pixels."""
    C = means2d.shape[0]
    m = means2d.detach().reshape(-1, 2).float().contiguous()
    c = conics.detach().reshape(-1, 3).float().contiguous()
    o = opacities.detach().reshape(-1).float().contiguous()
    ops = _wrapper._optional_ops() if means2d.is_cuda else None
    if ops is not None:
        offsets, flatten_ids, _ = ops.trim_tile_lists(m, c, o, offsets, flatten_ids, C, int(width), int(height))
    else:
        offsets, flatten_ids, _ = trim_tile_lists_torch(m, c, o, offsets, flatten_ids, C, int(width), int(height))
    return offsets, flatten_ids


def tile_lists(means2d: Tensor, radii: Tensor, depths: Tensor, conics: Tensor, opacities: Tensor, width: int,
               height: int, tile_size: int, options: FusedOptions,
               known_total: Optional[int] = None) -> Tuple[Tensor, Tensor]:
    """The tile lists the render kernels walk, as ``options`` asks: :func:`bin_tiles` into
    :func:`tile_radii`, then with ``options.trim_tile_lists`` :func:`trim_tile_lists`."""
    offsets, flatten_ids = bin_tiles(means2d, tile_radii(radii, conics, opacities, options), depths, width, height,
                                     tile_size, known_total=known_total, binning=options.binning)
    return _trimmed(means2d, conics, opacities, offsets, flatten_ids, width, height, options)


def tile_lists_in_room(means2d: Tensor, radii: Tensor, depths: Tensor, conics: Tensor, opacities: Tensor, width: int,
                       height: int, tile_size: int, options: FusedOptions,
                       room: Optional[int]) -> Tuple[Tensor, Tensor, Tensor]:
    """:func:`tile_lists` binned by :func:`bin_tiles_in_room`: ``(offsets, flatten_ids, total)``, the lists
    complete when ``total <= room``."""
    offsets, flatten_ids, total = bin_tiles_in_room(means2d, tile_radii(radii, conics, opacities, options), depths,
                                                    width, height, tile_size, room=room, binning=options.binning)
    offsets, flatten_ids = _trimmed(means2d, conics, opacities, offsets, flatten_ids, width, height, options)
    return offsets, flatten_ids, total


def _trimmed(means2d: Tensor, conics: Tensor, opacities: Tensor, offsets: Tensor, flatten_ids: Tensor, width: int,
             height: int, options: FusedOptions) -> Tuple[Tensor, Tensor]:
    if options.trim_tile_lists:
        return trim_tile_lists(means2d, conics, opacities, offsets, flatten_ids, width, height)
    return offsets, flatten_ids


def plain_kernel_switches(options: FusedOptions, offsets: Tensor, width: int, height: int, tile_size: int) -> Tuple:
    """The trailing switches of ``_RasterizeFused`` (the plain render kernels): the per-warp cull, butterfly
    reduction, falloff as 2^q, backward pixels per thread, and the blocks' tile order for these lists."""
    return (options.cull_mode, options.butterfly, options.fast_exp, options.bwd_pixels_per_thread,
            tile_order(offsets, options.tile_order, width, height, tile_size))


def loss_tile_order(options: FusedOptions, offsets: Tensor, width: int, height: int, tile_size: int) -> Optional[Tensor]:
    """``_FusedLoss``'s tile order: the split schedule runs the plain kernels, which take one; the fused
    kernels claim their tiles from a counter in their own order (docs/fused_ssim.md)."""
    if options.schedule != "split":
        return None
    return tile_order(offsets, options.tile_order, width, height, tile_size)


# ----------------------------------------------------------------------------------------------
# Public API
# ----------------------------------------------------------------------------------------------


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
    colors: Union[Tensor, ShCoefficients],
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
    options: FusedOptions = DEFAULT_OPTIONS,
) -> Tuple[Tensor, Tensor, Dict]:
    """Render C views (same contract as ``rasterize_reference``); gradients by our CUDA backward.

    With ``render_mode="RGB+ED"`` a 4th channel holds the expected depth (sum w_i z_i / alpha);
    it is rendered by a second pass of the same kernels (``absgrad`` then counts the RGB pass only).
    ``options``: projection, binning, warp culling and backward reduction (``schedule`` is unused).
    ``colors`` may also be ``ShCoefficients`` (see :func:`project`).
    """
    _check(width, height, tile_size, means.device)
    if render_mode not in ("RGB", "RGB+ED"):
        raise ValueError(f"render_mode must be 'RGB' or 'RGB+ED', got {render_mode!r}")
    radii, means2d, depths, conics, rgb, opac = project(
        means, quats, scales, opacities, colors, viewmats, Ks, width, height,
        sh_degree=sh_degree, near_plane=near_plane, far_plane=far_plane, eps2d=eps2d, projection=options.projection,
    )
    offsets, flatten_ids = tile_lists(means2d, radii, depths, conics, opac, width, height, tile_size, options)
    switches = plain_kernel_switches(options, offsets, width, height, tile_size)
    render, alpha = _RasterizeFused.apply(
        means2d, conics, rgb, opac, backgrounds, offsets, flatten_ids, width, height, absgrad, *switches
    )
    if render_mode == "RGB+ED":
        dcol = torch.cat([depths[..., None], torch.zeros_like(depths)[..., None].expand(-1, -1, 2)], -1)
        dimg, _ = _RasterizeFused.apply(means2d, conics, dcol, opac, None, offsets, flatten_ids, width, height, False,
                                        *switches)
        render = torch.cat([render, dimg[..., :1] / alpha.clamp(min=1e-10)], -1)
    info = _strategy_info(means2d, radii, depths, conics, opac, offsets, flatten_ids, width, height, tile_size)
    return render, alpha, info


def fused_render_loss(
    means: Tensor,
    quats: Tensor,
    scales: Tensor,
    opacities: Tensor,
    colors: Union[Tensor, ShCoefficients],
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
    capacity: Optional[int] = None,
    blocks_per_sm: int = 2,
    contribution: bool = False,
    options: FusedOptions = DEFAULT_OPTIONS,
    pair_room: Optional[int] = None,
) -> Tuple[Tensor, Tensor, Tensor, Dict]:
    """splatfacto's loss and its gradients for C views in the fused kernels (``options.schedule``).

    ``loss = (1-ssim_lambda)*mean|rgb-gt| + ssim_lambda*(1 - SSIM(rgb, gt))`` with
    ``rgb = clamp(render + T*bg, 0, 1)``, SSIM as ``pytorch_msssim.SSIM(data_range=1,
    size_average=True, channel=3, win_size=11, win_sigma=1.5)`` over all C views.
    ``gt_images`` [C,H,W,3] float in [0,1]; ``backgrounds`` [C,3] (None: black).

    Returns ``(loss, rgb [C,H,W,3] detached, alpha [C,H,W,1] detached, info)``; ``loss.backward()``
    fills the gradients of means/quats/scales/opacities/colors (``ShCoefficients``: their dc and
    rest, see :func:`project`; and viewmats when they require grad) and ``info["means2d"].grad`` / ``.absgrad``. ``info`` also holds ``l1``, ``ssim`` and
    ``kernel`` (two_phase, capacity, ...). Advanced: ``capacity`` overrides the Gaussians per tile
    kept on chip (tests use it to force the streaming path); ``blocks_per_sm`` sets the shared
    memory budget per block. ``options.schedule``: ``"split"`` (the default: render_fwd, then the
    loss-gradient kernel ``loss_grad`` writes dL/d render, then render_bwd; ``capacity`` and
    ``blocks_per_sm`` unused), ``"two_launch"`` (launch 1 renders and publishes rgb, launch 2
    re-renders on chip, computes the loss gradient and the backward) or ``"one_launch"`` (the
    single kernel; falls back to two launches, logged once, when too few blocks fit for its
    neighbour wait); all give the same result. The other ``options`` as for :func:`rasterize_fused`.
    ``contribution=True`` (any schedule): the
    backward also gathers each Gaussian's pruning score per view (its largest ``alpha * T``, the
    Gaussian that stops a pixel counting with the weight it would have had: exactly
    ``pruning.contribution_scores_2d``), returned as ``info["contribution"]`` [C,N].
    ``pair_room``: bin into buffers with room for that many (Gaussian, tile) pairs instead of reading the
    count back from the GPU (:func:`bin_tiles_in_room`); ``info["pair_total"]`` ([1] int64 on the device,
    always there) is the true count: the outputs are exact when it is at most ``pair_room``.
    """
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
        sh_degree=sh_degree, near_plane=near_plane, far_plane=far_plane, eps2d=eps2d, projection=options.projection,
    )
    offsets, flatten_ids, pair_total = tile_lists_in_room(means2d, radii, depths, conics, opac, width, height,
                                                          tile_size, options, pair_room)
    loss, img, alpha, stats, contrib = _FusedLoss.apply(
        means2d, conics, rgb, opac, backgrounds.detach(), gt_images.detach(), offsets, flatten_ids,
        width, height, ssim_lambda, absgrad, capacity, blocks_per_sm, options.schedule, options.butterfly,
        options.cull_mode, contribution, options.fast_exp, options.bwd_pixels_per_thread,
        loss_tile_order(options, offsets, width, height, tile_size),
    )
    info = {
        **_strategy_info(means2d, radii, depths, conics, opac, offsets, flatten_ids, width, height, tile_size),
        "l1": stats[0],
        "ssim": stats[1],
        "kernel": dict(_FusedLoss.last_kernel_info),
        "pair_total": pair_total,
    }
    if contribution:
        info["contribution"] = contrib  # read by pruning.scores_from_info (CONTRIBUTION_INFO_KEY)
    return loss, img, alpha, info


