"""splatfacto's training loss, ``(1 - l) * mean|rgb - gt| + l * (1 - SSIM(rgb, gt))``, in PyTorch.

The unfused path of every trainer (the single-process oracle, the sharded step, the benchmarks) and
the oracle of the fused kernels, which compute the same loss on the GPU. SSIM is pytorch_msssim's
(``data_range=1``, 11-tap Gaussian window, sigma 1.5), as nerfstudio uses it.
"""

from __future__ import annotations

from typing import Callable, Optional

import torch
from torch import Tensor

SSIM_WIN_SIZE = 11
SSIM_WIN_SIGMA = 1.5
DEFAULT_SSIM_LAMBDA = 0.2


SsimFunction = Callable[[Tensor, Tensor], Tensor]  # ssim(pred, gt) of [B,3,H,W] images, mean over everything


def pytorch_msssim_ssim(pred: Tensor, gt: Tensor) -> Tensor:
    """nerfstudio's SSIM: pytorch_msssim with ``data_range=1``, the 11-tap window, sigma 1.5."""
    from pytorch_msssim import ssim

    return ssim(gt, pred, data_range=1.0, size_average=True, win_size=SSIM_WIN_SIZE, win_sigma=SSIM_WIN_SIGMA)


def splatfacto_loss(pred: Tensor, gt: Tensor, ssim_lambda: float = DEFAULT_SSIM_LAMBDA,
                    ssim: Optional[SsimFunction] = None) -> Tensor:
    """The loss of composited images in [0, 1]: one view [H,W,3] or a batch [C,H,W,3] (L1 and SSIM
    are then means over all C views). ``ssim``: another implementation of the same SSIM (the
    benchmarks' fussim baseline); pytorch_msssim's by default."""
    batch_pred = pred if pred.dim() == 4 else pred[None]
    batch_gt = gt if gt.dim() == 4 else gt[None]
    l1 = torch.abs(gt - pred).mean()
    sim = (ssim or pytorch_msssim_ssim)(batch_pred.permute(0, 3, 1, 2), batch_gt.permute(0, 3, 1, 2))
    return (1.0 - ssim_lambda) * l1 + ssim_lambda * (1.0 - sim)


def splatfacto_loss_torch(render: Tensor, alpha: Tensor, gt_images: Tensor, backgrounds: Optional[Tensor],
                          ssim_lambda: float = DEFAULT_SSIM_LAMBDA, render_has_bg: bool = True,
                          ssim: Optional[SsimFunction] = None) -> Tensor:
    """:func:`splatfacto_loss` of a rasterizer's output [C,H,W,3]: ``rgb = clamp(render, 0, 1)`` when
    ``render`` already includes T*bg (``render_has_bg``, as rasterizers return it when given
    backgrounds), else ``clamp(render + (1 - alpha) * bg, 0, 1)``, as splatfacto composites."""
    rgb = render
    if not render_has_bg and backgrounds is not None:
        rgb = rgb + (1 - alpha) * backgrounds[:, None, None, :]
    return splatfacto_loss(torch.clamp(rgb, 0.0, 1.0), gt_images, ssim_lambda, ssim)
