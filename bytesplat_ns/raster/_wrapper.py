"""The autograd Functions around the compiled kernels (``cuda/``), as gsplat's ``cuda/_wrapper.py``.

Each Function takes plain tensors and the switches of its launch as arguments (nothing is read from
the environment): :class:`_RasterizeFused` (render_fwd / render_bwd), :class:`_FusedLoss` (the loss
and its 2D gradients in one of three schedules) and :class:`_MultiViewSH` (cuda/sh_views_*.cu);
:func:`adam_step` (cuda/adam.cu) is the optimizer's in-place update, used by ``optim.DeviceAdam``. The
public front end is ``raster.fused``; the PyTorch twins are in ``raster._torch_impl``.
"""

from __future__ import annotations

import functools
import math
import warnings
from typing import Optional

import torch
from torch import Tensor

from bytesplat_ns.raster._build import CudaBuildError, load_extension
from bytesplat_ns.raster.loss import SSIM_WIN_SIGMA, SSIM_WIN_SIZE
from bytesplat_ns.raster.options import CULL_BOX, CULL_OFF, CULL_ROWS, SCHEDULES, cull_mode

TILE_SIZE = 16
# Gaussians per shared-memory batch of render_fwd/render_bwd (cuda/render.cuh kBatch): what the
# split schedule reports as its "capacity".
RENDER_BATCH = 256

_two_phase_logged = False
_optional_warned = False
_clamp_inclusive: Optional[bool] = None


def _ops():
    return load_extension()


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


@functools.lru_cache(maxsize=None)
def ssim_window() -> Tensor:
    """pytorch_msssim's 1D Gaussian window (size 11, sigma 1.5), float32 on the CPU. Made once:
    its five small CPU ops sat on every step's host path before the first render (read-only)."""
    coords = torch.arange(SSIM_WIN_SIZE, dtype=torch.float) - SSIM_WIN_SIZE // 2
    g = torch.exp(-(coords**2) / (2 * SSIM_WIN_SIGMA**2))
    return g / g.sum()


def _flat(t: Tensor, d: int) -> Tensor:
    return t.reshape(-1, d).contiguous().float() if d > 1 else t.reshape(-1).contiguous().float()


def _cull(warp_cull) -> int:
    """The cull mode from a launch's ``warp_cull``: a mode (``FusedOptions.cull_mode``), or a bool (on: the
    box test, the default; off: none)."""
    if isinstance(warp_cull, bool):
        return cull_mode(warp_cull)
    if warp_cull not in (CULL_OFF, CULL_BOX, CULL_ROWS):
        raise ValueError(f"warp_cull must be a bool or a cull mode 0..2, got {warp_cull!r}")
    return int(warp_cull)


def _backward_masks(ops, m, c, o, offsets, flatten_ids, C, W, H, cull) -> Optional[Tensor]:
    """With CULL_ROWS, the plain backward's per-warp masks, one byte per tile-list entry (cuda/warp_masks.cu:
    the box, then the rows test); otherwise None, and the backward tests the box itself (or nothing)."""
    if cull != CULL_ROWS:
        return None
    return ops.warp_masks(m, c, o, offsets, flatten_ids, C, W, H, True)


class _RasterizeFused(torch.autograd.Function):
    """2D Gaussians -> (render [C,H,W,3] incl. T*bg, alpha [C,H,W,1]); backward by our kernel.
    ``warp_cull`` (see ``_cull``), ``butterfly``, ``fast_exp`` and ``bwd_pixels`` (the backward's pixels per
    thread): the launches' switches (``FusedOptions``)."""

    @staticmethod
    def forward(ctx, means2d, conics, colors, opacities, backgrounds, offsets, flatten_ids, W, H, absgrad,
                warp_cull=True, butterfly=True, fast_exp=False, bwd_pixels=1, tile_order=None):
        C = means2d.shape[0]
        m, c, col, o = _flat(means2d, 2), _flat(conics, 3), _flat(colors, 3), _flat(opacities, 1)
        bg = backgrounds.contiguous().float() if backgrounds is not None else None
        cull = _cull(warp_cull)
        rgb, alpha, T, last, _ = _ops().render_fwd(m, c, col, o, bg, offsets, flatten_ids, C, W, H, False,
                                                   cull != CULL_OFF, bool(fast_exp), tile_order)
        ctx.save_for_backward(means2d, m, c, col, o, bg, offsets, flatten_ids, T, last, tile_order)
        ctx.dims = (C, W, H, absgrad, backgrounds is not None and backgrounds.requires_grad)
        ctx.butterfly, ctx.warp_cull, ctx.fast_exp = bool(butterfly), cull, bool(fast_exp)
        ctx.bwd_pixels = int(bwd_pixels)
        return rgb, alpha

    @staticmethod
    def backward(ctx, v_rgb, v_alpha):
        means2d, m, c, col, o, bg, offsets, flatten_ids, T, last, tile_order = ctx.saved_tensors
        C, W, H, absgrad, bg_grad = ctx.dims
        if v_rgb is None:
            v_rgb = torch.zeros(C, H, W, 3, device=m.device)
        va = v_alpha.contiguous().float() if v_alpha is not None else None
        ops = _ops()
        masks = _backward_masks(ops, m, c, o, offsets, flatten_ids, C, W, H, ctx.warp_cull)
        vm, vc, vcol, vo, vabs, _ = ops.render_bwd(
            m, c, col, o, bg, offsets, flatten_ids, C, W, H, T, last, v_rgb.contiguous().float(), va, absgrad,
            ctx.butterfly, False, None, ctx.warp_cull != CULL_OFF, masks, ctx.fast_exp, ctx.bwd_pixels, tile_order,
            None,
        )
        N = means2d.shape[1]
        if absgrad:
            means2d.absgrad = vabs.view(C, N, 2)  # read by gsplat's DefaultStrategy(absgrad=True)
        v_bg = (v_rgb * T[..., None]).sum((1, 2)) if bg_grad else None
        return (vm.view(C, N, 2), vc.view(C, N, 3), vcol.view(C, N, 3), vo.view(C, N), v_bg,
                None, None, None, None, None, None, None, None, None, None)


def _split_forward(m, c, col, o, bg, gt, offsets, flatten_ids, C, W, H, ssim_lambda, contribution, cull, fast_exp,
                   tile_order):
    """The split schedule's first two launches: render_fwd (with the backgrounds: render + T*bg, alpha, T,
    last, and with ``contribution`` each pixel's stopping Gaussian) -> loss_grad (dL/d render = the per-pixel
    loss gradient times torch.clamp's mask, clamped rgb, per-region L1 and SSIM sums). Returns (rgb, alpha,
    partials, T, last, stop, v_render): nothing but images crosses to :func:`_split_backward`."""
    ops = _ops()
    render, alpha, T, last, stop = ops.render_fwd(m, c, col, o, bg, offsets, flatten_ids, C, W, H, bool(contribution),
                                                  cull != CULL_OFF, fast_exp, tile_order)
    v_render, rgb, partials = ops.loss_grad(render, gt, float(ssim_lambda), ssim_window(), _torch_clamp_inclusive())
    return rgb, alpha, partials, T, last, stop, v_render


def _split_backward(m, c, col, o, bg, offsets, flatten_ids, C, W, H, T, last, stop, v_render, absgrad, butterfly,
                    contribution, cull, fast_exp, bwd_pixels, tile_order, v_scale=None):
    """The split schedule's last launch: render_bwd from v_render (times ``v_scale``, a device scalar, when
    given) and the backgrounds, which it turns into the alpha term; the pruning score with ``contribution``.
    Returns (v_means2d, v_conics, v_colors, v_opacities, v_abs, contribution)."""
    ops = _ops()
    masks = _backward_masks(ops, m, c, o, offsets, flatten_ids, C, W, H, cull)
    return ops.render_bwd(m, c, col, o, bg, offsets, flatten_ids, C, W, H, T, last, v_render, None, bool(absgrad),
                          bool(butterfly), bool(contribution), stop if contribution else None, cull != CULL_OFF, masks,
                          fast_exp, bwd_pixels, tile_order, v_scale)


@functools.lru_cache(maxsize=64)
def _loss_map(device: torch.device, C: int, W: int, H: int, ssim_lambda: float):
    """(bias, matrix) of the affine map from the summed (L1, SSIM) partials to (l1, ssim, loss), in double:
    l1 and ssim are means over their pixels (SSIM's valid windows only), loss = (1-lambda) l1 + lambda (1-ssim).
    Cached per device, image size and lambda: its one host-to-device copy happens once, never inside a CUDA graph
    capture (the copy cannot be captured, and a cached tensor must not live in a graph's memory): a step graph's
    capture at a new image size follows an eager warm-up pass (step_graphs.WARMUP_STEPS)."""
    if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        raise RuntimeError(f"the loss's normalisation for a new image size ({W}x{H}) inside a CUDA graph capture: "
                           "run the step eagerly at this size first")
    n_l1 = C * H * W * 3
    n_ssim = C * 3 * (H - SSIM_WIN_SIZE + 1) * (W - SSIM_WIN_SIZE + 1)
    bias = torch.tensor([0.0, 0.0, ssim_lambda], dtype=torch.float64, device=device)
    matrix = torch.tensor([[1.0 / n_l1, 0.0], [0.0, 1.0 / n_ssim], [(1.0 - ssim_lambda) / n_l1, -ssim_lambda / n_ssim]],
                          dtype=torch.float64, device=device)
    return bias, matrix


class _FusedLoss(torch.autograd.Function):
    """Render + loss + its 2D gradients (``schedule``: one_launch, two_launch, split; ``butterfly``,
    ``warp_cull``, ``fast_exp`` and ``bwd_pixels``: the launches' switches; ``tile_order``: the split schedule's
    block order, ``tiles.tile_order``, None: row by row). Forward returns (loss, rgb, alpha, stats,
    contribution); only the loss is differentiable. The split schedule runs its backward launch in
    backward(), with the incoming gradient as the scale of dL/d render; the fused schedules, and the split one
    with ``contribution``, compute the gradients here and backward scales them.
    ``contribution=True``: the backward walk, which then runs inside this forward, also gathers the
    pruning score (largest alpha*T per view and Gaussian, ``pruning.contribution_scores_2d``'s
    definition) into ``contribution`` [C,N]; otherwise it is an empty tensor and the kernels skip it."""

    @staticmethod
    def forward(ctx, means2d, conics, colors, opacities, backgrounds, gt, offsets, flatten_ids, W, H,
                ssim_lambda, absgrad, capacity, blocks_per_sm, schedule, butterfly, warp_cull, contribution=False,
                fast_exp=False, bwd_pixels=1, tile_order=None):
        global _two_phase_logged
        C, N = means2d.shape[0], means2d.shape[1]
        if schedule not in SCHEDULES:
            raise ValueError(f"schedule must be one of {', '.join(SCHEDULES)}, got {schedule!r}")
        two_launch = schedule == "two_launch"
        butterfly, cull, fast_exp = bool(butterfly), _cull(warp_cull), bool(fast_exp)
        m, c, col, o = _flat(means2d, 2), _flat(conics, 3), _flat(colors, 3), _flat(opacities, 1)
        bg, gtc = backgrounds.contiguous().float(), gt.contiguous().float()
        # the split schedule's backward launch waits for backward() and its incoming gradient, unless the
        # pruning score, an output of this forward, needs it now
        deferred = schedule == "split" and not contribution
        if schedule == "split":
            rgb, alpha, partials, T, last, stop, v_render = _split_forward(
                m, c, col, o, bg, gtc, offsets, flatten_ids, C, W, H, ssim_lambda, contribution, cull, fast_exp,
                tile_order)
            if deferred:
                vm = vc = vcol = vo = vabs = None
                contrib = torch.empty(0, device=m.device)  # the score's absence, as render_bwd returns it
            else:
                vm, vc, vcol, vo, vabs, contrib = _split_backward(
                    m, c, col, o, bg, offsets, flatten_ids, C, W, H, T, last, stop, v_render, absgrad, butterfly,
                    contribution, cull, fast_exp, int(bwd_pixels), tile_order)
            del stop
            kinfo = torch.tensor([0, RENDER_BATCH, 0, 0], dtype=torch.long)
            out = rgb, alpha, partials, vm, vc, vcol, vo, vabs, kinfo, contrib
        else:
            out = _ops().fused_loss(
                m, c, col, o, bg, gtc, offsets, flatten_ids,
                C, W, H, float(ssim_lambda), ssim_window(), int(capacity or 0), int(blocks_per_sm),
                bool(absgrad), two_launch, _torch_clamp_inclusive(), butterfly, bool(contribution), cull != CULL_OFF,
                fast_exp,
            )
        rgb, alpha, partials, vm, vc, vcol, vo, vabs, kinfo, contrib = out
        contrib = contrib.view(C, N) if contribution else contrib
        two_phase, cap, resident, smem = (int(v) for v in kinfo.tolist())
        if two_phase and not two_launch and not _two_phase_logged:
            _two_phase_logged = True
            warnings.warn(
                f"bytesplat fused loss: only {resident} blocks fit on the GPU at once, fewer than the "
                f"{min(math.ceil(W / TILE_SIZE), math.ceil(H / TILE_SIZE)) + 2} the one-launch neighbour "
                f"wait needs at {W}x{H}; using the two-launch path (same result)."
            )
        # (l1, ssim, loss) from the region sums in three launches: sum, one affine map, the cast
        l1_ssim_loss = torch.addmv(*_loss_map(partials.device, C, W, H, float(ssim_lambda)),
                                   partials.sum(0, dtype=torch.float64)).float()
        stats, loss = l1_ssim_loss[:2], l1_ssim_loss[2]
        if deferred:
            ctx.save_for_backward(means2d, m, c, col, o, bg, offsets, flatten_ids, T, last, v_render, tile_order)
            ctx.launch = (W, H, butterfly, cull, fast_exp, int(bwd_pixels))
        else:
            ctx.save_for_backward(means2d, vm, vc, vcol, vo, vabs)
        ctx.deferred = deferred
        ctx.meta = (C, N, absgrad)
        ctx.mark_non_differentiable(rgb, alpha, stats, contrib)
        ctx.kinfo = dict(schedule=schedule, two_phase=bool(two_phase), capacity=cap, resident_blocks=resident,
                         smem_bytes=smem, bwd_reduce="butterfly" if butterfly else "shuffle",
                         contribution=bool(contribution), warp_cull=cull != CULL_OFF,
                         # the rows test is the plain backward's (split); the fused kernel tests the box
                         warp_cull_rows=cull == CULL_ROWS and schedule == "split", fast_exp=fast_exp,
                         bwd_pixels_per_thread=_backward_pixels(schedule, butterfly, contribution, bwd_pixels))
        _FusedLoss.last_kernel_info = ctx.kinfo
        return loss, rgb, alpha, stats, contrib

    @staticmethod
    def backward(ctx, g, _g_rgb, _g_alpha, _g_stats, _g_contrib):
        C, N, absgrad = ctx.meta
        if ctx.deferred:
            # the split schedule's backward launch, dL/d render scaled by g on the device as it is read: the
            # gradients come out scaled, with no pass over them (and |g| in the absolute sums)
            means2d, m, c, col, o, bg, offsets, flatten_ids, T, last, v_render, tile_order = ctx.saved_tensors
            W, H, butterfly, cull, fast_exp, bwd_pixels = ctx.launch
            vm, vc, vcol, vo, vabs, _ = _split_backward(
                m, c, col, o, bg, offsets, flatten_ids, C, W, H, T, last, None, v_render, absgrad, butterfly, False,
                cull, fast_exp, bwd_pixels, tile_order, g.detach().reshape(1).float().contiguous())
            if absgrad:
                means2d.absgrad = vabs.view(C, N, 2)
        else:
            means2d, vm, vc, vcol, vo, vabs = ctx.saved_tensors
            if absgrad:
                means2d.absgrad = (vabs * g.abs()).view(C, N, 2)
            # one multi-tensor launch instead of four elementwise ones (g is a device scalar: no host read)
            vm, vc, vcol, vo = torch._foreach_mul([vm, vc, vcol, vo], g)
        return (
            vm.view(C, N, 2), vc.view(C, N, 3), vcol.view(C, N, 3), vo.view(C, N),
            None, None, None, None, None, None, None, None, None, None, None, None, None, None, None, None, None,
        )


_FusedLoss.last_kernel_info = {}


def _backward_pixels(schedule: str, butterfly: bool, contribution: bool, bwd_pixels: int) -> int:
    """Pixels per thread the loss's backward ran with: ``bwd_pixels`` in render_bwd's two-pixel kernel (the
    split schedule, butterfly reduction, no pruning score), else 1."""
    return int(bwd_pixels) if schedule == "split" and butterfly and not contribution else 1


class _MultiViewSH(torch.autograd.Function):
    """SH colors of N Gaussians from C cameras (cuda/sh_views_*.cu) from the DC coefficients ``dc``
    [N,3] and the rest ``rest`` [N,K-1,3]; gradients for means, dc and rest, each written once into
    its own tensor. ``rest=None``: ``dc`` is stacked [N,K,3] coefficients, read and given their
    gradient through its two views (no concatenation either way)."""

    @staticmethod
    def forward(ctx, means, dc, rest, viewmats, radii, degree):  # type: ignore[override]
        ctx.stacked = rest is None
        if ctx.stacked:
            dc = dc.contiguous()
            dc, rest = dc[:, 0], dc[:, 1:]
        args = (means.contiguous(), _rows_contiguous(dc), _rows_contiguous(rest), viewmats.contiguous(),
                radii.to(torch.int32).contiguous())
        ctx.save_for_backward(*args)
        ctx.degree = degree
        return _ops().sh_views_fwd(*args, int(degree))

    @staticmethod
    def backward(ctx, v_colors):  # type: ignore[override]
        means, dc, rest = ctx.saved_tensors[:3]
        if ctx.stacked:
            v_coeffs = means.new_empty((means.shape[0], 1 + rest.shape[1], 3))
            v_dc, v_rest = v_coeffs[:, 0], v_coeffs[:, 1:]
        else:
            v_dc, v_rest = torch.empty_like(dc, memory_format=torch.contiguous_format), \
                torch.empty_like(rest, memory_format=torch.contiguous_format)
        v_means = _ops().sh_views_bwd(*ctx.saved_tensors, ctx.degree, v_colors.contiguous(), v_dc, v_rest)
        if ctx.stacked:
            return v_means, v_coeffs, None, None, None, None
        return v_means, v_dc, v_rest, None, None, None


def _rows_contiguous(t: Tensor) -> Tensor:
    """``t`` itself when each row's floats are contiguous (the SH kernels take any row stride), else a copy."""
    return t if t[:1].is_contiguous() else t.contiguous()


def check_adam_operands(param: Tensor, grad: Tensor, exp_avg: Tensor, exp_avg_sq: Tensor, step: Tensor,
                        visible: Optional[Tensor] = None, valid: Optional[Tensor] = None) -> None:
    """RuntimeError naming the first operand ``adam_step`` cannot take (metadata only: no device access)."""
    for name, t in (("param", param), ("grad", grad), ("exp_avg", exp_avg), ("exp_avg_sq", exp_avg_sq)):
        if not t.is_cuda or t.device != param.device:
            raise RuntimeError(f"adam_step: {name} must be on {param.device}")
        if t.dtype != torch.float32:
            raise RuntimeError(f"adam_step: {name} must be float32, got {t.dtype}")
        if not t.is_contiguous():
            raise RuntimeError(f"adam_step: {name} must be contiguous")
        if t.numel() != param.numel():
            raise RuntimeError(f"adam_step: {name} has {t.numel()} elements, param {param.numel()}")
    if not step.is_cuda or step.device != param.device or step.dtype != torch.float32 or step.numel() != 1:
        raise RuntimeError(f"adam_step: step must be one float32 on {param.device}")
    if visible is not None:
        if (not visible.is_cuda or visible.device != param.device or visible.dtype != torch.bool
                or visible.dim() != 1 or not visible.is_contiguous()):
            raise RuntimeError(f"adam_step: visible must be a contiguous 1-D bool tensor on {param.device}")
        if param.dim() == 0 or visible.numel() != param.shape[0]:
            raise RuntimeError(f"adam_step: visible has {visible.numel()} rows, param "
                               f"{param.shape[0] if param.dim() else 0}")
    if valid is not None and (not valid.is_cuda or valid.device != param.device or valid.dtype != torch.bool
                              or valid.numel() != 1):
        raise RuntimeError(f"adam_step: valid must be one bool on {param.device}")


def adam_step(param: Tensor, grad: Tensor, exp_avg: Tensor, exp_avg_sq: Tensor, step: Tensor, lr: float,
              beta1: float, beta2: float, eps: float, visible: Optional[Tensor] = None,
              valid: Optional[Tensor] = None) -> None:
    """One ``torch.optim.Adam`` step of one contiguous float32 CUDA tensor, in place (cuda/adam.cu).

    ``step`` is the tensor's float32 step count on its device, already incremented for this step
    (read by the kernel, so no host sync); the scalars are plain floats (no tensor ``lr``). The operands
    are checked here, before the extension is called (the same checks as the kernel's own). ``visible``
    ([rows] bool): only those rows (first dimension) are updated; the others keep their values and moments.
    ``valid`` (one bool on the device): False leaves everything as it is (the caller's count gets the same
    flag added instead of 1), decided on the GPU without a host read."""
    check_adam_operands(param, grad, exp_avg, exp_avg_sq, step, visible, valid)
    _ops().adam_step(param, grad, exp_avg, exp_avg_sq, step, float(lr), float(beta1), float(beta2), float(eps),
                     visible, valid)
