"""Memory accounting per Gaussian and a planner: how many Gaussians fit in M GiB per GPU?

The model (every term in bytes; fp32 = 4 bytes; ``S = (sh_degree + 1) ** 2`` SH bases; N Gaussians in
the scene, R GPUs, ``n = N / R`` owned per GPU for the sharded strategies, ``B`` views per step,
``v`` the fraction of a GPU's Gaussians a view sees, ``k`` tiles touched per visible Gaussian,
``z`` the fraction of 2D gradient records that are non-zero, ``HW`` pixels per view)::

    persistent, per OWNED Gaussian (measured against the real tensors by tests/engine/test_memory.py):
      parameters        4 * F,  F = 3 means + 3 scales + 4 quats + 1 opacity + 3 S colours
                                    (59 floats at SH degree 3: 236 bytes)
      gradients         4 * F   (.grad of every parameter: 236)
      Adam state        8 * F   (exp_avg + exp_avg_sq: 472; plus one 4-byte step per group)
      densify stats     4 * 3   (grad2d, count, radii of gsplat's DefaultStrategy: 12)
                        = 956 bytes at SH degree 3

    per training step, per Gaussian it touches:
      SH concat         2 * 4 * 3 S per owned Gaussian (splatfacto's cat of dc+rest and its gradient)
      2D record         44 forward (means2d 2, depth 1, conic 3, opacity 1, colour 3 floats,
                        radii int32) + 36 gradient (means2d 2, conic 3, colour 3, opacity 1)
                        + 48 autograd saved for projection backward (estimate: covariance,
                        rotation, clamped direction) = 128 per projected Gaussian per view;
                        unpacked projection (gsplat packed=False, splatfacto's default) keeps it
                        for ALL the GPU's Gaussians of each view, packed only for visible ones
      intersections     24 per (Gaussian, tile) pair: int64 key + int32 id, doubled by the sort

    refine peak (densification; not at the same time as the step's transients):
      3 * 4 * 3 S       torch.cat re-allocates the largest group (features_rest: param + 2 Adam)

Strategies (per GPU):

- ``single``: one GPU holds all N (R must be 1). Step transients: SH concat over N, records for
  B views over N (unpacked) or v N (packed), intersections B v N k.
- ``dense`` (Grendel-style all-to-all of 2D Gaussians): owns n; projects its n for all B views;
  sends its visible records of the other ranks' views (44 forward + 36 gradient back) to their
  renderers and receives the other ranks' records of the B / R views it renders: send + receive =
  2 * B * v * n * (R - 1) / R * 80 (its own views' records stay on the GPU); intersections for
  its B / R views over all N: (B / R) v N k = B v n k.
- ``sparse-grad`` (ByteSplat): as dense, but gradients travel as compact records (int32 index + 9
  floats = 40 bytes) for the non-zero fraction z only, or the dense 36-byte rows where that is
  smaller: send + receive of gradients 2 * B v n (R - 1) / R min(40 z, 36),
  plus the dense 2D gradients of the received records, computed before encoding
  (B v n (R - 1) / R 36).
- ``pixel`` (Splaxel): owns a spatial cell of n; renders its n for all B views (records and
  intersections for B v n, nothing per Gaussian on the wire); exchanges per-pixel partial colour +
  transmittance (4 floats) and their gradients: 4 * B * HW * 16 bytes, independent of N.

Fixed per GPU: ``overhead_gib`` (CUDA context, allocator slack, the rasterizer's workspaces,
default 2 GiB) plus images: rendered, ground truth and gradient (3 x HW x 3 x 4) and SSIM
intermediates (10 x HW x 3 x 4) for each view the GPU renders (B for single, B / R otherwise),
plus the pixel exchange above.

The GPU measurement that calibrates ``visible_fraction``, ``tiles_per_gaussian``,
``nonzero_fraction`` and ``overhead_gib`` (and checks the autograd estimate) is described in
docs/large_scenes.md. ``python -m bytesplat_ns.memory --memory-gib 139 --gpus 2`` prints the plan.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import asdict, dataclass, replace
from typing import Dict, List, Literal, Optional

Strategy = Literal["single", "dense", "sparse-grad", "pixel"]
STRATEGIES: tuple = ("single", "dense", "sparse-grad", "pixel")

GIB = float(1 << 30)
FP32 = 4
RECORD_FORWARD_BYTES = 44
"""Per projected Gaussian per view: means2d 2 + depth 1 + conic 3 + opacity 1 + colour 3 floats + radii int32."""
RECORD_INFO_BYTES = 32
"""The part of the forward record kept in splatfacto's ``info`` dict (all but the colour)."""
RECORD_GRAD_BYTES = 36
"""2D gradient per projected Gaussian: means2d 2 + conic 3 + colour 3 + opacity 1 floats."""
AUTOGRAD_SAVED_BYTES = 48
"""Estimate of what autograd keeps per projected Gaussian for the projection backward."""
SPARSE_RECORD_BYTES = 40
"""An encoded non-zero gradient record: int32 index + 9 floats."""
INTERSECTION_BYTES = 24
"""Per (Gaussian, tile) pair: int64 sort key + int32 Gaussian id, doubled by the radix sort."""
DENSIFY_STAT_FLOATS = 3
"""gsplat DefaultStrategy state per Gaussian: grad2d, count, radii."""


def sh_bases(sh_degree: int) -> int:
    return (int(sh_degree) + 1) ** 2


def param_floats(sh_degree: int = 3) -> Dict[str, int]:
    """Floats per Gaussian of each parameter group (ByteSplatModel / splatfacto layout)."""
    return {
        "means": 3,
        "scales": 3,
        "quats": 4,
        "opacities": 1,
        "features_dc": 3,
        "features_rest": 3 * (sh_bases(sh_degree) - 1),
    }


@dataclass(frozen=True)
class PerGaussian:
    """Persistent bytes per owned Gaussian."""

    params: int
    grads: int
    adam: int
    densify: int

    @property
    def total(self) -> int:
        return self.params + self.grads + self.adam + self.densify


def per_gaussian_bytes(sh_degree: int = 3) -> PerGaussian:
    """Parameters 4F, gradients 4F, Adam 8F, densification statistics 12 (F = 59 at SH degree 3)."""
    f = sum(param_floats(sh_degree).values())
    return PerGaussian(params=FP32 * f, grads=FP32 * f, adam=2 * FP32 * f, densify=FP32 * DENSIFY_STAT_FLOATS)


@dataclass(frozen=True)
class Workload:
    """What a training step looks like (defaults: 1080p, 4 views per step, values to calibrate on GPU)."""

    width: int = 1920
    height: int = 1080
    batch: int = 4
    """Views per step (over all GPUs)."""
    sh_degree: int = 3
    visible_fraction: float = 0.25
    """Fraction of a GPU's Gaussians inside a view's frustum (packed records, intersections, exchange)."""
    tiles_per_gaussian: float = 4.0
    """Mean number of 16x16 tiles a visible Gaussian touches."""
    nonzero_fraction: float = 0.35
    """Fraction of exchanged 2D gradient records that are non-zero (sparse-grad)."""
    packed: bool = True
    """Projection keeps records for visible Gaussians only (False: for every Gaussian of each view)."""
    overhead_gib: float = 2.0
    """CUDA context, allocator slack and rasterizer workspaces per GPU."""


def _check(strategy: str, gpus: int) -> None:
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown strategy {strategy!r}; one of {', '.join(STRATEGIES)}")
    if int(gpus) < 1:
        raise ValueError(f"gpus must be >= 1, got {gpus}")
    if strategy == "single" and int(gpus) != 1:
        raise ValueError("strategy 'single' holds every Gaussian on one GPU: use gpus=1 (or a sharded strategy)")


def memory_per_gpu(num_gaussians: float, strategy: Strategy, gpus: int = 1, workload: Optional[Workload] = None) -> Dict[str, float]:
    """Bytes per GPU by component for ``num_gaussians`` in the scene; ``peak`` is what must fit:
    ``persistent + fixed + max(step transients, refine peak)``."""
    _check(strategy, gpus)
    w = workload or Workload()
    R, N, B = int(gpus), float(num_gaussians), int(w.batch)
    n = N / R  # owned per GPU (N for single)
    v, k, z = w.visible_fraction, w.tiles_per_gaussian, w.nonzero_fraction
    pg = per_gaussian_bytes(w.sh_degree)
    S = sh_bases(w.sh_degree)
    hw = w.width * w.height
    views_here = B if strategy == "single" else B / R
    out: Dict[str, float] = {
        "params": pg.params * n,
        "grads": pg.grads * n,
        "adam": pg.adam * n,
        "densify_stats": pg.densify * n,
        "overhead": w.overhead_gib * GIB,
        "images": views_here * hw * 3 * FP32 * (3 + 10),
    }
    record = RECORD_FORWARD_BYTES + RECORD_GRAD_BYTES + AUTOGRAD_SAVED_BYTES
    projected = B * n * (v if w.packed else 1.0)  # records this GPU projects (all B views, own Gaussians)
    step = {
        "sh_concat": 2 * FP32 * 3 * S * n,
        "records": record * projected,
        "intersections": INTERSECTION_BYTES * B * v * n * k,
        "exchange": 0.0,
        "pixel_exchange": 0.0,
    }
    if strategy in ("dense", "sparse-grad") and R > 1:
        # records sent (own Gaussians, the other ranks' B (R-1) / R views) = records received (the
        # other ranks' Gaussians, own B / R views): the own views' records never leave the GPU
        wire = B * v * n * (R - 1) / R
        if strategy == "dense":
            step["exchange"] = 2 * wire * (RECORD_FORWARD_BYTES + RECORD_GRAD_BYTES)
        else:
            # the sparse form, or the dense rows where indices would cost more (communicators.py)
            grad_wire = min(z * SPARSE_RECORD_BYTES, RECORD_GRAD_BYTES)
            step["exchange"] = 2 * wire * RECORD_FORWARD_BYTES + wire * (RECORD_GRAD_BYTES + 2 * grad_wire)
    if strategy == "pixel" and R > 1:
        step["pixel_exchange"] = 4 * B * hw * 4 * FP32
    refine = 3 * FP32 * max(param_floats(w.sh_degree).values()) * n
    out.update({f"step_{key}": val for key, val in step.items()})
    out["refine_peak"] = refine
    persistent = out["params"] + out["grads"] + out["adam"] + out["densify_stats"]
    fixed = out["overhead"] + out["images"]
    out["peak"] = persistent + fixed + max(sum(step.values()), refine)
    return out


def max_gaussians(memory_gib: float, strategy: Strategy, gpus: int = 1, workload: Optional[Workload] = None) -> int:
    """Largest scene (total Gaussians over all GPUs) whose per-GPU peak fits in ``memory_gib``; 0 if none."""
    budget = float(memory_gib) * GIB
    base = memory_per_gpu(0, strategy, gpus, workload)["peak"]
    if base >= budget:
        return 0
    # peak is piecewise linear and increasing in N: bisect on an exact bracket
    slope = memory_per_gpu(1e9, strategy, gpus, workload)["peak"] - base
    lo, hi = 0, int(math.ceil((budget - base) / (slope / 1e9) * 1.01)) + 1
    while memory_per_gpu(hi, strategy, gpus, workload)["peak"] <= budget:
        hi *= 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if memory_per_gpu(mid, strategy, gpus, workload)["peak"] <= budget:
            lo = mid
        else:
            hi = mid
    return lo


def plan_table(memory_gib: float, gpus_list: List[int], workload: Optional[Workload] = None) -> List[Dict[str, object]]:
    """One row per (strategy, gpus) that is valid: max Gaussians and bytes per Gaussian per GPU."""
    rows = []
    for strategy in STRATEGIES:
        for r in gpus_list:
            if strategy == "single" and r != 1:
                continue
            nmax = max_gaussians(memory_gib, strategy, r, workload)  # type: ignore[arg-type]
            m = memory_per_gpu(nmax, strategy, r, workload)  # type: ignore[arg-type]
            rows.append(
                dict(strategy=strategy, gpus=r, max_gaussians=nmax,
                     bytes_per_gaussian_per_gpu=(m["peak"] - memory_per_gpu(0, strategy, r, workload)["peak"]) / max(nmax, 1),  # type: ignore[arg-type]
                     peak_gib=m["peak"] / GIB)
            )
    return rows


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bytesplat_ns.memory", description="How many Gaussians fit per GPU")
    ap.add_argument("--memory-gib", type=float, default=139.0, help="usable memory per GPU (H200: about 139 GiB)")
    ap.add_argument("--gpus", type=int, nargs="+", default=[1, 2])
    d = Workload()
    for name, val in asdict(d).items():
        flag = "--" + name.replace("_", "-")
        if isinstance(val, bool):
            ap.add_argument(flag, type=lambda s: s.lower() in ("1", "true", "yes"), default=val)
        else:
            ap.add_argument(flag, type=type(val), default=val)
    a = ap.parse_args(argv)
    w = replace(d, **{k: getattr(a, k) for k in asdict(d)})
    pg = per_gaussian_bytes(w.sh_degree)
    print(f"persistent bytes per owned Gaussian (SH {w.sh_degree}): params {pg.params} + grads {pg.grads} + "
          f"Adam {pg.adam} + densify {pg.densify} = {pg.total}")
    print(f"workload: {w}")
    print(f"{'strategy':<12} {'GPUs':>4} {'max Gaussians':>15} {'bytes/G/GPU':>12} {'peak GiB':>9}")
    for row in plan_table(a.memory_gib, a.gpus, w):
        print(f"{row['strategy']:<12} {row['gpus']:>4} {row['max_gaussians']:>15,} "
              f"{row['bytes_per_gaussian_per_gpu']:>12.0f} {row['peak_gib']:>9.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
