"""Rasterizer front end: one call signature, three backends.

Every backend takes gsplat 1.4.0's ``rasterization`` arguments (the subset splatfacto uses) and
returns ``(render_colors [C,H,W,D], render_alphas [C,H,W,1], info)``. ``info`` carries what
gsplat's ``DefaultStrategy`` reads for densification: ``means2d`` (a graph tensor whose ``.grad``
and, with ``absgrad=True``, ``.absgrad`` are filled by the backward), ``radii`` [C,N],
``width``, ``height``, ``n_cameras`` and ``gaussian_ids`` (None: results are not packed).

Backends:
- ``reference``: pure PyTorch (projection, SH, tile binning, compositing), gradients by autograd,
  any device. The CPU path and the oracle the other two are tested against.
- ``gsplat``: gsplat 1.4.0's CUDA rasterizer, the baseline.
- ``fused``: our CUDA kernels (``cuda/``): projection and SH (gsplat's or PyTorch's), our tile
  binning, forward and backward kernels; its switches arrive as ``fused_options``
  (``raster.options.FusedOptions``). Training uses ``raster.fused.fused_render_loss``, which also
  computes splatfacto's loss and its gradients in the kernels.
"""

from __future__ import annotations

import warnings
from typing import Dict, Literal, Optional, Tuple, Union

import torch
from torch import Tensor

from bytesplat_ns.raster.options import DEFAULT_OPTIONS, FusedOptions
from bytesplat_ns.raster.sh import ShCoefficients, stacked_coefficients

Backend = Literal["reference", "gsplat", "fused"]
BACKENDS: Tuple[str, ...] = ("reference", "gsplat", "fused")


def _auto_backend(device: torch.device) -> str:
    """``auto``: the fused kernels on CUDA (built on first use), gsplat when they cannot be built
    here (the cause is logged once), the reference rasterizer elsewhere."""
    if device.type != "cuda":
        return "reference"
    from bytesplat_ns.raster._build import CudaBuildError, load_extension

    try:
        load_extension()
        return "fused"
    except CudaBuildError as e:
        warnings.warn(f"bytesplat: the fused CUDA kernels are unavailable here ({e}); rasterizing with gsplat. "
                      "Fix the cause or pass --pipeline.model.rasterizer gsplat to silence this.")
        return "gsplat"


def resolve_backend(name: str, device: torch.device) -> str:
    """Map ``auto`` to the backend for ``device`` and check the choice can run there (a clear
    ``BytesplatError`` otherwise: e.g. a GPU-trained config opened in ns-viewer on a CPU machine)."""
    from bytesplat_ns.errors import BytesplatError

    if name == "auto":
        return _auto_backend(device)
    if name not in BACKENDS:
        raise BytesplatError(f"Unknown rasterizer '{name}'; choose one of auto, {', '.join(BACKENDS)}.")
    if name in ("gsplat", "fused") and device.type != "cuda":
        raise BytesplatError(
            f"The '{name}' rasterizer needs a CUDA device but the model is on '{device}'. "
            "Use --pipeline.model.rasterizer reference (or auto) on CPU."
        )
    return name


def rasterize(
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
    backend: str = "reference",
    sh_degree: Optional[int] = None,
    backgrounds: Optional[Tensor] = None,
    render_mode: Literal["RGB", "RGB+ED"] = "RGB",
    absgrad: bool = False,
    near_plane: float = 0.01,
    far_plane: float = 1e10,
    eps2d: float = 0.3,
    tile_size: int = 16,
    fused_options: FusedOptions = DEFAULT_OPTIONS,
) -> Tuple[Tensor, Tensor, Dict]:
    """Render C views of N Gaussians with the chosen backend (see module docstring).
    ``fused_options``: the fused backend's switches; the other backends have none. ``colors`` may
    be ``raster.sh.ShCoefficients`` (the model's DC and rest apart): the fused backend reads them
    as they are, the others get them stacked to [N,K,3]."""
    kwargs = dict(
        sh_degree=sh_degree,
        backgrounds=backgrounds,
        render_mode=render_mode,
        absgrad=absgrad,
        near_plane=near_plane,
        far_plane=far_plane,
        eps2d=eps2d,
        tile_size=tile_size,
    )
    if backend != "fused":  # only the fused backend reads ShCoefficients apart
        colors = stacked_coefficients(colors)
    args = (means, quats, scales, opacities, colors, viewmats, Ks, width, height)
    if backend == "reference":
        from bytesplat_ns.raster.reference import rasterize_reference

        return rasterize_reference(*args, **kwargs)
    if backend == "gsplat":
        from gsplat.rendering import rasterization

        render, alpha, info = rasterization(*args, packed=False, **kwargs)
        info["n_cameras"] = viewmats.shape[0]
        return render, alpha, info
    if backend == "fused":
        from bytesplat_ns.raster.fused import rasterize_fused

        return rasterize_fused(*args, **kwargs, options=fused_options)
    raise ValueError(f"Unknown rasterizer backend '{backend}'")
