"""Training-time cross-check of the fused kernels against the unfused (splatfacto) path.

Diagnostics only (``--pipeline.model.fused.check-every N``): not on the hot path of a step.
"""

from __future__ import annotations

from typing import Dict, Optional, Tuple

import torch
from torch import Tensor

from bytesplat_ns.raster.fused import fused_render_loss
from bytesplat_ns.raster.loss import splatfacto_loss_torch
from bytesplat_ns.raster.options import DEFAULT_OPTIONS, FusedOptions


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
    options: FusedOptions = DEFAULT_OPTIONS,
) -> Dict[str, float]:
    """One training step's fused loss and gradients against the unfused path on the same inputs.

    The unfused path is what splatfacto does: ``unfused_backend`` (gsplat on CUDA, the reference
    elsewhere) renders, ``rgb = clamp(render + (1-alpha) bg, 0, 1)``, L1 + pytorch_msssim SSIM,
    autograd; the fused step runs with ``options``. Returns norm-wise relative errors (fused vs
    unfused) of the loss, of the 2D gradient handed to DefaultStrategy (``means2d.grad`` and ``.absgrad``, visible entries), of its
    per-Gaussian statistic (||absgrad * (W/2, H/2)||), of every parameter gradient, and whether
    the radii agree. Uses ``torch.autograd.grad`` (nothing accumulates into ``.grad``); costs one
    extra unfused and one extra fused step. ``ByteSplatModel`` runs it every
    ``fused.check_every`` steps.
    """
    from bytesplat_ns.raster import rasterize

    backend = unfused_backend or ("gsplat" if gt_images.device.type == "cuda" else "reference")
    names = list(params)
    leaves = [params[n] for n in names]
    W, H = raster_args[7], raster_args[8]

    def grads(loss: Tensor, means2d: Tensor):
        # retain_graph: raster_args' own nodes (exp, sigmoid) are shared with the real step
        out = torch.autograd.grad(loss, [means2d] + leaves, allow_unused=True, retain_graph=True)
        return out[0], list(out[1:]), getattr(means2d, "absgrad", None)

    with torch.enable_grad():
        render, alpha, info_u = rasterize(*raster_args, backend=backend, sh_degree=sh_degree, absgrad=absgrad)
        loss_u = splatfacto_loss_torch(render, alpha, gt_images, backgrounds, ssim_lambda, render_has_bg=False)
        g2_u, gp_u, abs_u = grads(loss_u, info_u["means2d"])
        loss_f, _, _, info_f = fused_render_loss(*raster_args, gt_images, backgrounds, sh_degree=sh_degree,
                                                 ssim_lambda=ssim_lambda, absgrad=absgrad, options=options)
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
