"""Rasterization + loss benchmark: gsplat 1.4.0 vs the fused backend, identical inputs.

Measured per Gaussian count (median ms over ``repeats`` after ``warmup``, CUDA events):

- ``raster_loss``: from the same projected 2D Gaussians (projection and tile binning done once,
  outside the timing): gsplat ``rasterize_to_pixels`` forward + clamp + splatfacto loss
  (L1 + pytorch_msssim SSIM) + backward, vs ``_FusedLoss`` (one launch) + its backward; also the
  other schedules: ``raster_loss_fused_two_phase`` (two launches of the fused kernel) and
  ``raster_loss_fused_split`` (render_fwd -> loss_grad -> render_bwd), and the same two with the
  pruning score gathered in the backward (``..._contribution``: its cost, docs/pruning.md), and
  the split schedule and the forward without the kernels' per-warp culling
  (``..._no_warp_cull``: ``FusedOptions(warp_cull=False)``, the A/B of cuda/common.cuh ``warp_mask``),
  and the split schedule and the forward with the falloff as 2^q (``..._fast_exp``:
  ``FusedOptions(fast_exp=True)``, cuda/common.cuh ``staged_conic``) with its loss value, and the split
  schedule with two pixels per thread in its backward (``..._bwd_2px``:
  ``FusedOptions(bwd_pixels_per_thread=2)``, cuda/render_bwd.cu ``render_bwd_2px_kernel``) with its loss value.
  The split schedule, the from-3D path and the binning are also timed on opacity-aware tile lists
  (``..._opacity_tiles``: ``FusedOptions(opacity_aware_tiles=True)``, raster/tile_reach.py), with their
  ``intersections_opacity_aware`` and their loss value (the same as the default's). The split schedule on
  both kinds of list and the forward with the blocks taking the longest tile lists first
  (``..._longest_first``: ``FusedOptions(tile_order="longest_first")``, raster/tiles.py ``tile_order``, the
  sort timed with the pass), and the split schedule on both kinds of list with the backward's per-warp cull
  also testing each row of warp blocks (``..._rows_cull``: ``FusedOptions(warp_cull_rows=True)``,
  raster/warp_masks.py), with its loss value and the 8x4 warp blocks per opacity-aware tile-list entry each
  test keeps (``warp_blocks_per_entry_box`` / ``_rows``); the split schedule and the forward on the
  opacity-aware lists trimmed of the entries no 8x4 block of their tile can composite (``..._trimmed``:
  ``FusedOptions(trim_tile_lists=True)``, cuda/warp_masks.cu ``trim_tile_lists``; also with the rows cull),
  with ``intersections_trimmed``, its loss value and the trimming's own time (``trim_tile_lists_cuda``).
- ``full``: from the 3D Gaussians (projection, SH, binning, raster, loss, backward to the 3D
  parameters): gsplat ``rasterization`` + the same loss vs ``fused_render_loss``.
- ``full_fused_raster_torch_loss``: ``rasterize_fused`` (our plain fwd/bwd kernels) + the torch
  loss: the path a custom loss takes.

The loss values of both paths are reported so the comparison is visibly like for like.

- ``baselines``: gsplat + splatfacto's loss with each SSIM of ``--baseline-ssim`` (pytorch_msssim,
  fussim), for this process's gsplat and for the gsplat of each ``--gsplat-site`` (another version,
  timed in a child process on the same random scene): ``bench.baselines``.

The scene is ``synthetic_scene`` (N random Gaussians) or, with ``trained=RUN_DIR``, the Gaussians
of a finished nerfstudio run rendered from one of its train cameras against that view's real image
(``bench.trained.raster_scene``; rows say ``"scene": "trained:<run dir>"``).
"""

from __future__ import annotations

import json
import math
import os
import platform
import sys
import time
from typing import Dict, List, Optional, Sequence

import torch

from bytesplat_ns.bench.baselines import baseline_rows
from bytesplat_ns.bench.synthetic import synthetic_scene
from bytesplat_ns.bench.timing import record_or_error as _safe
from bytesplat_ns.bench.timing import QUEUE_MS
from bytesplat_ns.bench.timing import time_ms as time_events
from bytesplat_ns.raster.fused import (
    FusedOptions,
    _FusedLoss,
    _RasterizeFused,
    bin_tiles,
    bin_tiles_torch,
    fused_render_loss,
    project,
    rasterize_fused,
    splatfacto_loss_torch,
    tile_radii,
    trim_tile_lists,
)
from bytesplat_ns.raster.options import CULL_ROWS, DEFAULT_OPTIONS, FusedOptions
from bytesplat_ns.raster.tile_reach import opacity_aware_radii
from bytesplat_ns.raster.tiles import tile_order as tile_order_of


def training_arm(options: FusedOptions = DEFAULT_OPTIONS) -> str:
    """The raster + loss arm of :func:`bench_one` that times the pass training runs with ``options``: the split
    schedule on the trimmed opacity-aware lists, with the falloff as expf or as 2^q (projection, binning and
    tile reach do not act on the 2D pass). Options no arm times raise ValueError."""
    timed = dict(schedule="split", warp_cull=True, warp_cull_rows=False, bwd_reduce="butterfly",
                 opacity_aware_tiles=True, trim_tile_lists=True, bwd_pixels_per_thread=1, tile_order="raster")
    if any(getattr(options, field) != value for field, value in timed.items()):
        raise ValueError(f"no raster + loss arm times training with {options}")
    return "raster_loss_fused_split_trimmed" + ("_fast_exp" if options.fast_exp else "")


def gsplat_extension_error(skip_gsplat: bool = False) -> Optional[str]:
    """None when gsplat's CUDA extension is usable, else why not."""
    if skip_gsplat:
        return "skipped (--skip-gsplat)"
    try:
        import gsplat.cuda._backend as _gb

        return None if _gb._C is not None else "gsplat's CUDA extension did not build"
    except Exception as e:  # noqa: BLE001
        return f"{type(e).__name__}: {e}"[:300]


class StageInputs:
    """One scene (``synthetic_scene``'s N random Gaussians, or ``scene``: a dict of the same form,
    e.g. ``bench.trained.raster_scene``), projected once (``projection``) and binned once: the
    identical 2D inputs both raster+loss stages start from."""

    def __init__(self, n: int, width: int, height: int, sh_degree: int, projection: str = "gsplat",
                 scene: Optional[Dict] = None):
        self.scene = synthetic_scene(n, width, height, sh_degree) if scene is None else scene
        s = self.scene
        width, height, sh_degree = s["width"], s["height"], s["sh_degree"]
        self.W, self.H, self.sh_degree = width, height, sh_degree
        self.params = {k: s[k].clone().requires_grad_(True) for k in ("means", "quats", "scales", "opacities", "colors")}
        with torch.no_grad():
            self.radii, m2, self.depths, con, col, op = project(
                *self.args3d(), sh_degree=sh_degree, near_plane=0.01, far_plane=1e10, eps2d=0.3, projection=projection)
        self.m2, self.con, self.col, self.op = (t.contiguous() for t in (m2, con, col, op))
        self.offsets, self.fids = bin_tiles(self.m2, self.radii, self.depths, width, height)
        self._opacity_aware_bins = None
        self._trimmed_bins = None
        self._staged_leaves = None

    def opacity_aware_bins(self):
        """The tile lists of the same 2D inputs binned into each Gaussian's opacity-aware reach
        (``raster.tile_reach``: shorter lists, the same render)."""
        if self._opacity_aware_bins is None:
            reach = opacity_aware_radii(self.radii, self.con, self.op)
            self._opacity_aware_bins = bin_tiles(self.m2, reach, self.depths, self.W, self.H)
        return self._opacity_aware_bins

    def trimmed_bins(self):
        """:meth:`opacity_aware_bins` without the entries no 8x4 block of their tile can composite
        (``FusedOptions.trim_tile_lists``, cuda/warp_masks.cu: shorter lists, the same render)."""
        if self._trimmed_bins is None:
            self.trim()
        return self._trimmed_bins

    def trim(self):
        """Trim :meth:`opacity_aware_bins` again, as every training step does (its launches, for a profile of
        the pass training runs), and keep the result for :meth:`trimmed_bins`."""
        self._trimmed_bins = trim_tile_lists(self.m2, self.con, self.op, *self.opacity_aware_bins(), self.W, self.H)

    def warp_blocks_per_entry(self, rows: bool) -> float:
        """8x4 warp blocks the plain backward visits per entry of the opacity-aware tile lists: those the box
        test keeps, or with ``rows`` the rows test (cuda/warp_masks.cu, raster/warp_masks.py)."""
        from bytesplat_ns.raster._wrapper import _ops

        offsets, fids = self.opacity_aware_bins()
        C = self.m2.shape[0]
        masks = _ops().warp_masks(self.m2.reshape(-1, 2).float().contiguous(), self.con.reshape(-1, 3).float().contiguous(),
                                  self.op.reshape(-1).float().contiguous(), offsets, fids, C, self.W, self.H, rows).long()
        return float(sum(((masks >> w) & 1).sum() for w in range(8))) / max(1, masks.numel())

    def args3d(self):
        p, s = self.params, self.scene
        return (p["means"], p["quats"], p["scales"], p["opacities"], p["colors"], s["viewmats"], s["Ks"], self.W, self.H)

    def stage_leaves(self) -> None:
        """Clone the next pass's inputs now (``time_ms``'s ``prepare``: outside the timing, as a trainer's
        tensors exist before its step); :meth:`leaves` hands them out once."""
        self._staged_leaves = self._fresh_leaves()

    def leaves(self):
        """The 2D inputs as fresh leaves that take gradients: those :meth:`stage_leaves` made, else new clones."""
        staged, self._staged_leaves = self._staged_leaves, None
        return staged if staged is not None else self._fresh_leaves()

    def _fresh_leaves(self):
        return [t.detach().clone().requires_grad_(True) for t in (self.m2, self.con, self.col, self.op)]

    def fused_raster_loss(self, blocks_per_sm: int = 2, schedule: str = "one_launch", contribution: bool = False,
                          butterfly: bool = True, warp_cull=True, opacity_aware_tiles: bool = False,
                          fast_exp: bool = False, bwd_pixels: int = 1, tile_order: str = "raster",
                          trimmed: bool = False):
        """The fused loss (``schedule``: one_launch | two_launch | split): render + splatfacto loss +
        2D gradients (and the pruning score with ``contribution``), then autograd's hand-over.
        ``butterfly`` / ``warp_cull`` / ``fast_exp`` / ``bwd_pixels``: the backward reduction, the per-warp
        culling (a bool or a cull mode, ``options.CULL_*``), the falloff's form and the backward's pixels per
        thread (A/B runs);
        ``opacity_aware_tiles``: on :meth:`opacity_aware_bins`; ``trimmed``: on :meth:`trimmed_bins`; ``tile_order``: the split schedule's block order
        (``raster.tiles.tile_order``, sorted inside the timed pass as in training)."""
        s = self.scene
        offsets, fids = (self.trimmed_bins() if trimmed else self.opacity_aware_bins() if opacity_aware_tiles
                         else (self.offsets, self.fids))
        loss, _, _, _, _ = _FusedLoss.apply(*self.leaves(), s["backgrounds"], s["gt"], offsets, fids,
                                            self.W, self.H, 0.2, False, None, blocks_per_sm, schedule, butterfly,
                                            warp_cull, contribution, fast_exp, bwd_pixels,
                                            tile_order_of(offsets, tile_order, self.W, self.H))
        loss.backward()
        return loss

    def gsplat_binning(self):
        from gsplat.cuda._wrapper import isect_offset_encode, isect_tiles

        tw, th = math.ceil(self.W / 16), math.ceil(self.H / 16)
        _, isect_ids, g_fids = isect_tiles(self.m2, self.radii, self.depths, 16, tw, th)
        return isect_offset_encode(isect_ids, 1, tw, th), g_fids

    def gsplat_raster_loss(self, binned=None):
        """gsplat's rasterize_to_pixels forward + clamp + L1 + pytorch_msssim SSIM + backward."""
        from gsplat.cuda._wrapper import rasterize_to_pixels

        g_off, g_fids = binned if binned is not None else self.gsplat_binning()
        s = self.scene
        render, alpha = rasterize_to_pixels(*self.leaves(), self.W, self.H, 16, g_off, g_fids,
                                            backgrounds=s["backgrounds"])
        loss = splatfacto_loss_torch(render, alpha, s["gt"], s["backgrounds"])
        loss.backward()
        return loss


def bench_one(n: int, width: int, height: int, sh_degree: int, warmup: int, repeats: int,
              skip_gsplat: bool = False, projection: str = "gsplat", raster_only: bool = False,
              scene: Optional[Dict] = None, scene_label: str = "synthetic", baseline_ssim: Sequence[str] = (),
              gsplat_sites: Sequence[str] = (), queue_ms: float = QUEUE_MS) -> Dict:
    inp = StageInputs(n, width, height, sh_degree, projection, scene=scene)

    def time_ms(fn, warmup, repeats):  # each arm's launches queued ahead, the 2D passes' inputs cloned untimed
        return time_events(fn, warmup, repeats, prepare=inp.stage_leaves, queue_ms=queue_ms)

    scene = None  # inp holds it (freed below)
    s, W, H, sh_degree, args3d = inp.scene, inp.W, inp.H, inp.sh_degree, inp.args3d
    m2, con, col, op, radii, depths = inp.m2, inp.con, inp.col, inp.op, inp.radii, inp.depths
    offsets, fids = inp.offsets, inp.fids
    out: Dict = {"scene": scene_label, "num_gaussians": int(s["means"].shape[0])}
    counts = (offsets[1:] - offsets[:-1]).float()
    out["visible"] = int((radii > 0).sum())
    out["intersections"] = int(fids.numel())
    _safe(out, "per_tile_mean", lambda: float(counts.mean()))
    _safe(out, "per_tile_p99", lambda: float(counts.quantile(0.99)))
    _safe(out, "per_tile_max", lambda: float(counts.max()))

    _safe(out, "fused_loss_value", lambda: inp.fused_raster_loss().item())
    _safe(out, "fused_kernel", lambda: dict(_FusedLoss.last_kernel_info))
    _safe(out, "raster_loss_fused", lambda: time_ms(inp.fused_raster_loss, warmup, repeats))
    _safe(out, "raster_loss_fused_two_phase", lambda: time_ms(
        lambda: inp.fused_raster_loss(schedule="two_launch"), warmup, repeats))
    for bps in (1, 3, 4):  # on-chip capacity vs occupancy: fewer, larger blocks or more, smaller ones
        _safe(out, f"raster_loss_fused_two_phase_bps{bps}", lambda bps=bps: time_ms(
            lambda: inp.fused_raster_loss(blocks_per_sm=bps, schedule="two_launch"), warmup, repeats))
        _safe(out, f"fused_kernel_bps{bps}", lambda: dict(_FusedLoss.last_kernel_info))
    # A/B of the backward's per-Gaussian warp reduction
    _safe(out, "raster_loss_fused_two_phase_shuffle_reduce", lambda: time_ms(
        lambda: inp.fused_raster_loss(schedule="two_launch", butterfly=False), warmup, repeats))
    # the split schedule: render_fwd -> loss_grad -> render_bwd (plain kernels' occupancy)
    _safe(out, "fused_split_loss_value", lambda: inp.fused_raster_loss(schedule="split").item())
    _safe(out, "raster_loss_fused_split", lambda: time_ms(
        lambda: inp.fused_raster_loss(schedule="split"), warmup, repeats))
    # A/B of the per-warp culling (cuda/common.cuh warp_mask)
    _safe(out, "raster_loss_fused_split_no_warp_cull", lambda: time_ms(
        lambda: inp.fused_raster_loss(schedule="split", warp_cull=False), warmup, repeats))
    # A/B of the falloff as 2^q from the prescaled conic (cuda/common.cuh staged_conic): the same loss up to rounding
    _safe(out, "fused_split_fast_exp_loss_value", lambda: inp.fused_raster_loss(schedule="split", fast_exp=True).item())
    _safe(out, "raster_loss_fused_split_fast_exp", lambda: time_ms(
        lambda: inp.fused_raster_loss(schedule="split", fast_exp=True), warmup, repeats))
    # A/B of the backward with two pixels per thread (cuda/render_bwd.cu render_bwd_2px_kernel): the same loss
    _safe(out, "fused_split_bwd_2px_loss_value", lambda: inp.fused_raster_loss(schedule="split", bwd_pixels=2).item())
    _safe(out, "raster_loss_fused_split_bwd_2px", lambda: time_ms(
        lambda: inp.fused_raster_loss(schedule="split", bwd_pixels=2), warmup, repeats))
    # A/B of the opacity-aware tile reach (raster/tile_reach.py): shorter lists, the same loss
    _safe(out, "intersections_opacity_aware", lambda: int(inp.opacity_aware_bins()[1].numel()))
    _safe(out, "fused_split_opacity_tiles_loss_value", lambda: inp.fused_raster_loss(
        schedule="split", opacity_aware_tiles=True).item())
    _safe(out, "raster_loss_fused_split_opacity_tiles", lambda: time_ms(
        lambda: inp.fused_raster_loss(schedule="split", opacity_aware_tiles=True), warmup, repeats))
    # A/B of the blocks' tile order (raster/tiles.py tile_order): longest lists first, the same loss
    for tiles, tight in (("", False), ("_opacity_tiles", True)):
        _safe(out, f"fused_split{tiles}_longest_first_loss_value", lambda tight=tight: inp.fused_raster_loss(
            schedule="split", opacity_aware_tiles=tight, tile_order="longest_first").item())
        _safe(out, f"raster_loss_fused_split{tiles}_longest_first", lambda tight=tight: time_ms(
            lambda: inp.fused_raster_loss(schedule="split", opacity_aware_tiles=tight, tile_order="longest_first"),
            warmup, repeats))
    # A/B of the backward's rows test (raster/warp_masks.py): fewer warps per Gaussian, the same loss
    for test, rows in (("box", False), ("rows", True)):
        _safe(out, f"warp_blocks_per_entry_{test}", lambda rows=rows: inp.warp_blocks_per_entry(rows))
    for tiles, tight in (("", False), ("_opacity_tiles", True)):
        _safe(out, f"fused_split{tiles}_rows_cull_loss_value", lambda tight=tight: inp.fused_raster_loss(
            schedule="split", opacity_aware_tiles=tight, warp_cull=CULL_ROWS).item())
        _safe(out, f"raster_loss_fused_split{tiles}_rows_cull", lambda tight=tight: time_ms(
            lambda: inp.fused_raster_loss(schedule="split", opacity_aware_tiles=tight, warp_cull=CULL_ROWS),
            warmup, repeats))
    # A/B of trimming the opacity-aware lists (cuda/warp_masks.cu trim_tile_lists): shorter lists, the same loss;
    # the trimming itself (two launches and a cumsum, once per step in training) timed apart
    _safe(out, "intersections_trimmed", lambda: int(inp.trimmed_bins()[0][-1]))
    _safe(out, "fused_split_trimmed_loss_value", lambda: inp.fused_raster_loss(schedule="split", trimmed=True).item())
    _safe(out, "raster_loss_fused_split_trimmed", lambda: time_ms(
        lambda: inp.fused_raster_loss(schedule="split", trimmed=True), warmup, repeats))
    _safe(out, "raster_loss_fused_split_trimmed_rows_cull", lambda: time_ms(
        lambda: inp.fused_raster_loss(schedule="split", trimmed=True, warp_cull=CULL_ROWS), warmup, repeats))
    # the falloff as 2^q on the trimmed lists: training's pass with the one lever that keeps 0.1 dB alone
    _safe(out, "raster_loss_fused_split_trimmed_fast_exp", lambda: time_ms(
        lambda: inp.fused_raster_loss(schedule="split", trimmed=True, fast_exp=True), warmup, repeats))
    # every opt-in lever of the render at once: trimmed lists, the falloff as 2^q, two pixels per backward thread
    _safe(out, "raster_loss_fused_split_trimmed_levers", lambda: time_ms(
        lambda: inp.fused_raster_loss(schedule="split", trimmed=True, fast_exp=True, bwd_pixels=2), warmup, repeats))
    out["training_arm"] = training_arm()  # which of the arms above the report takes as training's pass
    _safe(out, "trim_tile_lists_cuda", lambda: time_ms(
        lambda: trim_tile_lists(m2, con, op, *inp.opacity_aware_bins(), W, H), warmup, repeats))
    for sched in ("two_launch", "split"):  # the pruning score gathered in the backward: what it costs
        _safe(out, f"raster_loss_fused_{sched}_contribution", lambda sched=sched: time_ms(
            lambda: inp.fused_raster_loss(schedule=sched, contribution=True), warmup, repeats))

    gsplat_error = gsplat_extension_error(skip_gsplat)
    gsplat_ok = gsplat_error is None
    if not gsplat_ok and not skip_gsplat:
        out["gsplat_error"] = gsplat_error
    if gsplat_ok:
        from gsplat.cuda._wrapper import rasterize_to_pixels
        from gsplat.rendering import rasterization

        g_off, g_fids = inp.gsplat_binning()

        def gsplat_raster_loss():
            return inp.gsplat_raster_loss((g_off, g_fids))

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
    out["baselines"] = baseline_rows(inp, scene_label, gsplat_ok, baseline_ssim, gsplat_sites, warmup, repeats,
                                     raster_only, out.get("fused_split_loss_value"), queue_ms)

    def fused_full(schedule=None, opacity_aware_tiles=False):
        options = FusedOptions(projection=projection, opacity_aware_tiles=opacity_aware_tiles,
                               **({"schedule": schedule} if schedule else {}))
        loss, _, _, _ = fused_render_loss(*args3d(), s["gt"], s["backgrounds"], sh_degree=sh_degree, options=options)
        loss.backward()

    def fused_raster_torch_loss_full():
        render, alpha, _ = rasterize_fused(*args3d(), sh_degree=sh_degree, backgrounds=s["backgrounds"],
                                           options=FusedOptions(projection=projection))
        splatfacto_loss_torch(render, alpha, s["gt"], s["backgrounds"]).backward()

    def fused_raster_fwd(warp_cull=True, fast_exp=False, tile_order="raster", lists=(offsets, fids)):
        with torch.no_grad():
            _RasterizeFused.apply(m2, con, col, op, s["backgrounds"], *lists, W, H, False, warp_cull, True,
                                  fast_exp, 1, tile_order_of(lists[0], tile_order, W, H))

    if not raster_only:
        _safe(out, "full_fused", lambda: time_ms(fused_full, warmup, repeats))
        _safe(out, "full_fused_split", lambda: time_ms(lambda: fused_full("split"), warmup, repeats))
        _safe(out, "full_fused_split_opacity_tiles", lambda: time_ms(lambda: fused_full("split", True), warmup, repeats))
        _safe(out, "full_fused_raster_torch_loss", lambda: time_ms(fused_raster_torch_loss_full, warmup, repeats))
    _safe(out, "raster_fwd_fused", lambda: time_ms(fused_raster_fwd, warmup, repeats))
    _safe(out, "raster_fwd_fused_no_warp_cull", lambda: time_ms(lambda: fused_raster_fwd(False), warmup, repeats))
    _safe(out, "raster_fwd_fused_fast_exp", lambda: time_ms(lambda: fused_raster_fwd(fast_exp=True), warmup, repeats))
    _safe(out, "raster_fwd_fused_longest_first", lambda: time_ms(
        lambda: fused_raster_fwd(tile_order="longest_first"), warmup, repeats))
    _safe(out, "raster_fwd_fused_opacity_tiles", lambda: time_ms(
        lambda: fused_raster_fwd(lists=inp.opacity_aware_bins()), warmup, repeats))
    _safe(out, "raster_fwd_fused_trimmed", lambda: time_ms(lambda: fused_raster_fwd(lists=inp.trimmed_bins()),
                                                           warmup, repeats))
    _safe(out, "binning_cuda", lambda: time_ms(lambda: bin_tiles(m2, radii, depths, W, H), warmup, repeats))
    _safe(out, "binning_cuda_opacity_tiles", lambda: time_ms(
        lambda: bin_tiles(m2, opacity_aware_radii(radii, con, op), depths, W, H), warmup, repeats))
    reach_kernel = FusedOptions(tile_reach="cuda")  # the reach from cuda/tile_reach.cu: the same lists
    _safe(out, "binning_cuda_opacity_tiles_reach_kernel", lambda: time_ms(
        lambda: bin_tiles(m2, tile_radii(radii, con, op, reach_kernel), depths, W, H), warmup, repeats))
    _safe(out, "binning_torch", lambda: time_ms(lambda: bin_tiles_torch(m2, radii, depths, W, H), warmup, repeats))
    if gsplat_ok:
        _safe(out, "binning_gsplat", lambda: time_ms(inp.gsplat_binning, warmup, repeats))
    inp = s = None  # free the scene before empty_cache (the closures above hold these cells)
    torch.cuda.empty_cache()
    return out


def run(num_gaussians: List[int], width: int, height: int, sh_degree: Optional[int] = 3, warmup: int = 5,
        repeats: int = 20, out: Optional[str] = None, command: Optional[str] = None,
        skip_gsplat: bool = False, projection: str = "gsplat", raster_only: bool = False,
        trained: Optional[str] = None, trained_view: int = 0, trained_scale: float = 1.0,
        baseline_ssim: Sequence[str] = (), gsplat_sites: Sequence[str] = (), queue_ms: float = QUEUE_MS) -> Dict:
    """One row per Gaussian count (synthetic scenes), or one row for the trained run ``trained``
    (its view ``trained_view`` at ``trained_scale`` x its resolution; ``num_gaussians``, ``width``
    and ``height`` are then the run's; ``sh_degree`` None: the model's)."""
    if not torch.cuda.is_available():
        raise SystemExit("bytesplat-bench raster needs a CUDA GPU.")
    scene, scene_label, trained_info = None, "synthetic", None
    if trained is not None:
        from bytesplat_ns.bench.trained import load_run, raster_scene

        run_ = load_run(trained)
        scene = raster_scene(run_, trained_view, trained_scale, sh_degree, device="cuda")
        scene_label = f"trained:{run_.run_dir}"
        num_gaussians, width, height, sh_degree = [run_.num_gaussians], scene["width"], scene["height"], scene["sh_degree"]
        trained_info = dict(run_.describe(), view=trained_view, scale=trained_scale,
                            image=str(run_.dataset.image_filenames[trained_view]))
        run_ = None
    sh_degree = 3 if sh_degree is None else sh_degree
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
        "queue_ms": queue_ms,
        "ssim_lambda": 0.2,
        "projection": projection,
        "scene": scene_label,
        "baseline_ssim": list(baseline_ssim),
        "gsplat_sites": list(gsplat_sites),
        "runs": [],
    }
    if trained_info is not None:
        result["trained"] = trained_info
    for n in num_gaussians:
        r = bench_one(n, width, height, sh_degree, warmup, repeats, skip_gsplat=skip_gsplat,
                      projection=projection, raster_only=raster_only, scene=scene, scene_label=scene_label,
                      baseline_ssim=baseline_ssim, gsplat_sites=gsplat_sites, queue_ms=queue_ms)
        scene = None  # bench_one frees it
        result["runs"].append(r)
        print(json.dumps(r), flush=True)
        if out:  # write after every size so a cut-off run keeps what it measured
            with open(out, "w") as f:
                json.dump(result, f, indent=2)
    return result
