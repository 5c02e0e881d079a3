"""Rasterization + loss benchmark: gsplat 1.4.0 vs the fused backend, identical inputs.

Measured per Gaussian count (median ms over ``repeats`` after ``warmup``, CUDA events):

- ``raster_loss``: from the same projected 2D Gaussians (projection and tile binning done once,
  outside the timing): gsplat ``rasterize_to_pixels`` forward + clamp + splatfacto loss
  (L1 + pytorch_msssim SSIM) + backward, vs ``_FusedLoss`` (one launch) + its backward.
- ``full``: from the 3D Gaussians (projection, SH, binning, raster, loss, backward to the 3D
  parameters): gsplat ``rasterization`` + the same loss vs ``fused_render_loss``.
- ``full_fused_raster_torch_loss``: ``rasterize_fused`` (our plain fwd/bwd kernels) + the torch
  loss: the path a custom loss takes.

The loss values of both paths are reported so the comparison is visibly like for like.
"""

from __future__ import annotations

import json
import math
import platform
import statistics
import sys
import time
from typing import Callable, Dict, List, Optional

import torch

from bytesplat_ns.raster.fused import (
    _FusedLoss,
    bin_tiles,
    bin_tiles_torch,
    fused_render_loss,
    project,
    rasterize_fused,
    splatfacto_loss_torch,
)


def synthetic_scene(n: int, width: int, height: int, sh_degree: int = 3, seed: int = 0, device: str = "cuda"):
    """N random Gaussians filling one pinhole camera's frustum (depth 2..20, uniform on screen),
    log-normal world scales giving a few pixels of footprint, SH degree ``sh_degree`` colors."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    f = 0.9 * width
    z = 2.0 + 18.0 * torch.rand(n, generator=g)
    u = torch.rand(n, generator=g) * width * 1.1 - 0.05 * width
    v = torch.rand(n, generator=g) * height * 1.1 - 0.05 * height
    x = (u - width / 2) / f * z
    y = (v - height / 2) / f * z
    means = torch.stack([x, y, z], -1)
    # ~1.5 px median projected sigma at any depth, spread x/÷ 1.6
    scales = (z[:, None] * 1.5 / f) * torch.exp(torch.randn(n, 3, generator=g) * 0.5)
    quats = torch.randn(n, 4, generator=g)
    opacities = torch.sigmoid(torch.randn(n, generator=g))
    k = (sh_degree + 1) ** 2
    sh = torch.randn(n, k, 3, generator=g) * 0.1
    sh[:, 0, :] = torch.rand(n, 3, generator=g) * 1.5 - 0.75
    viewmats = torch.eye(4)[None]
    Ks = torch.tensor([[f, 0, width / 2], [0, f, height / 2], [0, 0, 1.0]])[None]
    gt = torch.rand(1, height, width, 3, generator=g)
    gt = torch.nn.functional.avg_pool2d(gt.permute(0, 3, 1, 2), 5, 1, 2).permute(0, 2, 3, 1).contiguous()
    to = lambda t: t.to(device)  # noqa: E731
    return dict(means=to(means), quats=to(quats), scales=to(scales.log().exp()), opacities=to(opacities),
                colors=to(sh), viewmats=to(viewmats), Ks=to(Ks), gt=to(gt),
                backgrounds=torch.zeros(1, 3, device=device), width=width, height=height, sh_degree=sh_degree)


def time_ms(fn: Callable[[], None], warmup: int, repeats: int) -> Dict[str, float]:
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times: List[float] = []
    for _ in range(repeats):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b))
    return {"median_ms": statistics.median(times), "min_ms": min(times), "max_ms": max(times)}


def _safe(out: Dict, key: str, fn: Callable[[], object]) -> None:
    """Record fn()'s result under key, or the error (one failing path must not hide the others)."""
    try:
        out[key] = fn()
    except Exception as e:  # noqa: BLE001
        out[key] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
        print(f"[bench] {key} failed: {out[key]['error']}", file=sys.stderr, flush=True)


def bench_one(n: int, width: int, height: int, sh_degree: int, warmup: int, repeats: int,
              skip_gsplat: bool = False, projection: str = "gsplat", raster_only: bool = False) -> Dict:
    s = synthetic_scene(n, width, height, sh_degree)
    W, H = width, height
    params = {k: s[k].clone().requires_grad_(True) for k in ("means", "quats", "scales", "opacities", "colors")}
    args3d = lambda: (params["means"], params["quats"], params["scales"], params["opacities"],  # noqa: E731
                      params["colors"], s["viewmats"], s["Ks"], W, H)
    out: Dict = {"num_gaussians": n}

    # Projected inputs shared by both raster+loss paths (gsplat projection: the baseline's own).
    with torch.no_grad():
        radii, m2, depths, con, col, op = project(
            *args3d()[:9], sh_degree=sh_degree, near_plane=0.01, far_plane=1e10, eps2d=0.3, projection=projection)
    m2, con, col, op = (t.contiguous() for t in (m2, con, col, op))
    offsets, fids = bin_tiles(m2, radii, depths, W, H)
    counts = (offsets[1:] - offsets[:-1]).float()
    out["visible"] = int((radii > 0).sum())
    out["intersections"] = int(fids.numel())
    _safe(out, "per_tile_mean", lambda: float(counts.mean()))
    _safe(out, "per_tile_p99", lambda: float(counts.quantile(0.99)))
    _safe(out, "per_tile_max", lambda: float(counts.max()))
    leaf = lambda: [t.detach().clone().requires_grad_(True) for t in (m2, con, col, op)]  # noqa: E731

    def fused_raster_loss():
        a, b, c, d = leaf()
        loss, _, _, _ = _FusedLoss.apply(a, b, c, d, s["backgrounds"], s["gt"], offsets, fids, W, H,
                                         0.2, False, None, 2, False)
        loss.backward()
        return loss

    _safe(out, "fused_loss_value", lambda: fused_raster_loss().item())
    _safe(out, "fused_kernel", lambda: dict(_FusedLoss.last_kernel_info))
    _safe(out, "raster_loss_fused", lambda: time_ms(fused_raster_loss, warmup, repeats))
    _safe(out, "raster_loss_fused_two_phase", lambda: time_ms(
        lambda: _FusedLoss.apply(*leaf(), s["backgrounds"], s["gt"], offsets, fids, W, H, 0.2, False, None, 2,
                                 True)[0].backward(), warmup, repeats))

    gsplat_ok = not skip_gsplat
    if gsplat_ok:
        try:
            import gsplat.cuda._backend as _gb

            gsplat_ok = _gb._C is not None
        except Exception as e:  # noqa: BLE001
            gsplat_ok = False
            out["gsplat_error"] = f"{type(e).__name__}: {e}"[:300]
    if gsplat_ok:
        from gsplat.cuda._wrapper import isect_offset_encode, isect_tiles, rasterize_to_pixels
        from gsplat.rendering import rasterization

        tw, th = math.ceil(W / 16), math.ceil(H / 16)
        _, isect_ids, g_fids = isect_tiles(m2, radii, depths, 16, tw, th)
        g_off = isect_offset_encode(isect_ids, 1, tw, th)

        def gsplat_raster_loss():
            a, b, c, d = leaf()
            render, alpha = rasterize_to_pixels(a, b, c, d, W, H, 16, g_off, g_fids, backgrounds=s["backgrounds"])
            loss = splatfacto_loss_torch(render, alpha, s["gt"], s["backgrounds"])
            loss.backward()
            return loss

        def gsplat_raster_fwd():
            with torch.no_grad():
                rasterize_to_pixels(m2, con, col, op, W, H, 16, g_off, g_fids, backgrounds=s["backgrounds"])

        _safe(out, "gsplat_loss_value", lambda: gsplat_raster_loss().item())
        _safe(out, "raster_loss_gsplat", lambda: time_ms(gsplat_raster_loss, warmup, repeats))
        _safe(out, "raster_fwd_gsplat", lambda: time_ms(gsplat_raster_fwd, warmup, repeats))

        def gsplat_full():
            render, alpha, _ = rasterization(*args3d(), sh_degree=sh_degree, backgrounds=s["backgrounds"],
                                             packed=False)
            splatfacto_loss_torch(render, alpha, s["gt"], s["backgrounds"]).backward()

        if not raster_only:
            _safe(out, "full_gsplat", lambda: time_ms(gsplat_full, warmup, repeats))

    def fused_full():
        loss, _, _, _ = fused_render_loss(*args3d(), s["gt"], s["backgrounds"], sh_degree=sh_degree,
                                          projection=projection)
        loss.backward()

    def fused_raster_torch_loss_full():
        render, alpha, _ = rasterize_fused(*args3d(), sh_degree=sh_degree, backgrounds=s["backgrounds"],
                                           projection=projection)
        splatfacto_loss_torch(render, alpha, s["gt"], s["backgrounds"]).backward()

    def fused_raster_fwd():
        with torch.no_grad():
            from bytesplat_ns.raster.fused import _RasterizeFused

            _RasterizeFused.apply(m2, con, col, op, s["backgrounds"], offsets, fids, W, H, False)

    if not raster_only:
        _safe(out, "full_fused", lambda: time_ms(fused_full, warmup, repeats))
        _safe(out, "full_fused_raster_torch_loss", lambda: time_ms(fused_raster_torch_loss_full, warmup, repeats))
    _safe(out, "raster_fwd_fused", lambda: time_ms(fused_raster_fwd, warmup, repeats))
    _safe(out, "binning_torch", lambda: time_ms(lambda: bin_tiles_torch(m2, radii, depths, W, H), warmup, repeats))
    _safe(out, "binning_cuda", lambda: time_ms(lambda: bin_tiles(m2, radii, depths, W, H), warmup, repeats))
    del s, params
    torch.cuda.empty_cache()
    return out


def run(num_gaussians: List[int], width: int, height: int, sh_degree: int = 3, warmup: int = 5,
        repeats: int = 20, out: Optional[str] = None, command: Optional[str] = None,
        skip_gsplat: bool = False, projection: str = "gsplat", raster_only: bool = False) -> Dict:
    if not torch.cuda.is_available():
        raise SystemExit("bytesplat-bench raster needs a CUDA GPU.")
    try:
        import gsplat

        gsplat_version = gsplat.__version__
    except Exception:
        gsplat_version = None
    result = {
        "benchmark": "raster",
        "command": command or " ".join(sys.argv),
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "gpu": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "gsplat": gsplat_version,
        "python": platform.python_version(),
        "width": width,
        "height": height,
        "sh_degree": sh_degree,
        "views": 1,
        "warmup": warmup,
        "repeats": repeats,
        "ssim_lambda": 0.2,
        "projection": projection,
        "runs": [],
    }
    for n in num_gaussians:
        r = bench_one(n, width, height, sh_degree, warmup, repeats, skip_gsplat=skip_gsplat,
                      projection=projection, raster_only=raster_only)
        result["runs"].append(r)
        print(json.dumps(r), flush=True)
        if out:  # write after every size so a cut-off run keeps what it measured
            with open(out, "w") as f:
                json.dump(result, f, indent=2)
    return result
