"""The fused rasterizer's behaviour switches.

:class:`FusedRasterConfig` is what a user sets (``--pipeline.model.fused.*``, recorded in
``config.yml``); :class:`FusedOptions` is the small frozen value the kernels' Python front end
(``raster.fused``) takes as an argument, so a call's behaviour is fixed by its arguments alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from bytesplat_ns.errors import SettingError

# The schedules of ``fused_render_loss`` (docs/fused_ssim.md). "split" (render_fwd -> loss_grad ->
# render_bwd, three plain launches) is the default: on an H200 it measured about twice as fast as
# the on-chip schedules at 1M and 4M Gaussians (``bytesplat-bench raster`` times all three).
SCHEDULES = ("one_launch", "two_launch", "split")
# Warp reduction of the backward kernels (cuda/common.cuh backward_slots): "butterfly" (a
# reduce-scatter over the warp, 13 shuffles per Gaussian with absgrad) or "shuffle" (one 5-shuffle
# warp sum per gradient component, 55 shuffles). Same gradients up to fp32 summation order.
BWD_REDUCTIONS = ("butterfly", "shuffle")
# Pixels per thread of the plain backward kernel (cuda/render_bwd.cu): 2 shares each Gaussian's warp
# reduction between 64 pixels instead of 32 (render_bwd_2px_kernel, butterfly reduction only).
BWD_PIXELS_PER_THREAD = (1, 2)
PROJECTIONS = ("auto", "gsplat", "torch")
BINNINGS = ("cuda", "torch")
TILE_REACHES = ("torch", "cuda")
# The order in which the plain rasterizer's blocks take their tiles (cuda/common.cuh block_tile): "raster"
# (row by row) or "longest_first" (by tile list length, longest first, so no long tile starts in the last wave).
TILE_ORDERS = ("raster", "longest_first")

Schedule = Literal["one_launch", "two_launch", "split"]
BwdReduce = Literal["butterfly", "shuffle"]
Projection = Literal["auto", "gsplat", "torch"]
Binning = Literal["cuda", "torch"]
TileReach = Literal["torch", "cuda"]
TileOrder = Literal["raster", "longest_first"]


def _check_choice(field: str, value: str, choices) -> None:
    if value not in choices:
        raise SettingError(f"fused.{field} must be one of {', '.join(choices)}, got {value!r}")


# The per-warp cull modes a launch takes: none, the box test (inline in the kernels), and the box then the
# rows test (the plain backward reads masks from cuda/warp_masks.cu).
CULL_OFF, CULL_BOX, CULL_ROWS = 0, 1, 2


def cull_mode(warp_cull: bool, rows: bool = False) -> int:
    """The kernels' cull mode for ``warp_cull`` (on or off) and ``rows`` (the box, then each row of blocks)."""
    return CULL_OFF if not warp_cull else CULL_ROWS if rows else CULL_BOX


@dataclass(frozen=True)
class FusedOptions:
    """How one call of the fused kernels runs (see :class:`FusedRasterConfig` for each field)."""

    schedule: Schedule = "split"
    warp_cull: bool = True
    warp_cull_rows: bool = False
    bwd_reduce: BwdReduce = "butterfly"
    projection: Projection = "auto"
    binning: Binning = "cuda"
    opacity_aware_tiles: bool = True
    tile_reach: TileReach = "cuda"
    fast_exp: bool = True
    bwd_pixels_per_thread: int = 1
    tile_order: TileOrder = "raster"
    trim_tile_lists: bool = True

    def __post_init__(self):
        _check_choice("schedule", self.schedule, SCHEDULES)
        _check_choice("bwd_reduce", self.bwd_reduce, BWD_REDUCTIONS)
        _check_choice("projection", self.projection, PROJECTIONS)
        _check_choice("binning", self.binning, BINNINGS)
        _check_choice("tile_reach", self.tile_reach, TILE_REACHES)
        _check_choice("tile_order", self.tile_order, TILE_ORDERS)
        for field in ("warp_cull", "warp_cull_rows", "opacity_aware_tiles", "fast_exp", "trim_tile_lists"):
            if not isinstance(getattr(self, field), bool):
                raise SettingError(f"fused.{field} must be true or false, got {getattr(self, field)!r}")
        if self.bwd_pixels_per_thread not in BWD_PIXELS_PER_THREAD or isinstance(self.bwd_pixels_per_thread, bool):
            raise SettingError(f"fused.bwd_pixels_per_thread must be 1 or 2, got {self.bwd_pixels_per_thread!r}")
        if self.bwd_pixels_per_thread == 2 and self.bwd_reduce != "butterfly":
            raise SettingError("fused.bwd_pixels_per_thread 2 needs fused.bwd_reduce butterfly "
                               f"(got {self.bwd_reduce!r}): the two-pixel backward has only that reduction")

    @property
    def butterfly(self) -> bool:
        return self.bwd_reduce == "butterfly"

    @property
    def cull_mode(self) -> int:
        """The launches' per-warp cull mode (CULL_OFF, CULL_BOX or CULL_ROWS)."""
        return cull_mode(self.warp_cull, self.warp_cull_rows)


DEFAULT_OPTIONS = FusedOptions()


@dataclass
class FusedRasterConfig:
    """Switches of the fused rasterizer (``--pipeline.model.fused.*``). The defaults are the measured
    fastest; the others exist for A/B runs and diagnostics and give the same results."""

    schedule: Schedule = "split"
    """Training step's schedule: split (render, loss gradient, backward: three kernels), two_launch (the fused
    kernel twice), one_launch (once; falls back to two launches, logged, when too few blocks fit)."""
    warp_cull: bool = True
    """Skip, per warp, the Gaussians that cannot reach alpha 1/255 at any of its pixels (exact)."""
    warp_cull_rows: bool = False
    """With warp_cull, in the plain backward: after the box of the alpha >= 1/255 ellipse, test each row of warp
    blocks against the ellipse's own x-extent over that row's pixels (masks computed once per pass,
    cuda/warp_masks.cu), so that a thin Gaussian lying across a tile at an angle reaches only the blocks it
    crosses (exact). Off: on the trained fox capture raster + loss 1.11x on the untrimmed lists but none on the
    default trimmed ones, the whole step 4.45 against 4.10 ms (suite trained-capture, docs/configuration.md)."""
    bwd_reduce: BwdReduce = "butterfly"
    """Warp reduction of the backward kernels: butterfly (reduce-scatter) or shuffle (one warp sum per component)."""
    projection: Projection = "auto"
    """3D -> 2D projection and SH: gsplat's CUDA kernels, the pure-PyTorch ones, or auto (gsplat when importable)."""
    binning: Binning = "cuda"
    """Tile binning: bytesplat's kernel (cuda/binning.cu, on CUDA tensors) or its PyTorch twin (same lists)."""
    opacity_aware_tiles: bool = True
    """Bin each Gaussian only into the tiles its alpha >= 1/255 ellipse reaches, per axis (raster/tile_reach.py;
    exact: shorter tile lists, the same render); false: into the projection's square 3-sigma box."""
    tile_reach: TileReach = "cuda"
    """How the opacity-aware reach is computed on CUDA tensors: bytesplat's kernel (cuda/tile_reach.cu, one launch,
    the same radii bit for bit) or its PyTorch definition (raster/tile_reach.py, about 15 elementwise launches)."""
    fast_exp: bool = True
    """Evaluate each Gaussian's falloff exp(-sigma) as 2^q, q = -log2(e)*sigma from a conic prescaled once per staged
    Gaussian, with the GPU's approximate exp2 (cuda/common.cuh staged_conic): 11 fewer instructions per Gaussian
    and pixel in the forward loop, 7-16 in the backward's (suite sass-loops), the same image up to float rounding
    (about 2e-6 relative). On: raster + loss 1.05-1.06x, eval PSNR +0.02 dB against expf over 7 seeds on the fox
    capture (suite kernel-levers); false: expf, for A/B runs."""
    bwd_pixels_per_thread: Literal[1, 2] = 1
    """Pixels per thread of the plain backward kernel (the split schedule's and rasterize_fused's): 2 runs 128
    threads per tile and shares each Gaussian's warp reduction between 64 pixels instead of 32, with the per-pixel
    work still skipped per 8x4-pixel block (cuda/render_bwd.cu render_bwd_2px_kernel; butterfly reduction only; the
    backward that gathers the pruning score keeps 1). The same gradients up to summation order. Off: raster + loss
    1.01-1.03x; together with fast_exp (the default) eval PSNR -0.16 dB over 9 seeds (suite kernel-levers)."""
    tile_order: TileOrder = "raster"
    """The order in which the plain rasterizer's blocks (the split schedule's and rasterize_fused's) take their
    tiles: raster (row by row) or longest_first (longest tile list first, so that no long tile is left for the
    last wave of blocks; one sort of the tile lengths per view batch). The same image and gradients. raster: on the
    trained fox capture longest_first made the step slower, 4.50 against 4.10 ms (suite trained-capture)."""
    trim_tile_lists: bool = True
    """After binning, drop each tile-list entry whose Gaussian's alpha >= 1/255 ellipse reaches no 8x4 pixel block
    of the tile (the rows test of warp_cull_rows, cuda/warp_masks.cu trim_tile_lists: two launches and a cumsum per
    view batch), so that every pass walks shorter lists: the binning's per-axis box still holds the tiles that a
    thin Gaussian lying across the grid at an angle misses. Exact: the same image, and the same gradients up to
    summation order. On: raster + loss 2.20 against 2.94 ms on the trained fox capture (trimming 0.16 ms), the
    loop body's host time no longer (suites trained-capture, host-time); false: the lists as binned, for isotropic
    scenes, where the trimming costs about what it saves (random Gaussians; docs/fused_ssim.md)."""
    sync_free_binning: bool = False
    """Bin each training step's tile lists into buffers sized from the true pair counts of earlier steps
    (pair_room_margin times the view's last one, scaled by the Gaussian count) instead of reading the
    step's own count back from the GPU: the host never waits for the GPU within a step. A step whose lists
    did not fit changes nothing (its Adam step and densification statistics are decided on the GPU) and its
    view is trained again two steps later, binned exactly (bytesplat_ns/pair_capacity.py). Needs bytesplat's
    Adam for the Gaussians (the default optimizer config), no gradient scaling or accumulation and no camera
    optimizer; otherwise, and for steps that score Gaussians for pruning, the count is read back. Off: it does
    not pay in ns-train on fox (one H100, suite sync-free-binning, 5000 iterations, seeds 0-2: median step
    3.50 against 3.23 ms with the count read back; docs/configuration.md)."""
    pair_room_margin: float = 1.2
    """With sync_free_binning: the room given over the view's last pair count (>= 1; a view not seen yet: the
    largest recent count). More room, fewer views trained twice; the radix sort also sorts the unused room."""
    check_every: int = 0
    """Every this many training steps, compare the fused loss and gradients with the unfused (splatfacto) path
    and log the errors (model.fused_check_log; 0: off). Costs two extra steps each time."""

    def options(self) -> FusedOptions:
        return FusedOptions(schedule=self.schedule, warp_cull=self.warp_cull, warp_cull_rows=self.warp_cull_rows,
                            bwd_reduce=self.bwd_reduce,
                            projection=self.projection, binning=self.binning,
                            opacity_aware_tiles=self.opacity_aware_tiles, tile_reach=self.tile_reach,
                            fast_exp=self.fast_exp, bwd_pixels_per_thread=self.bwd_pixels_per_thread,
                            tile_order=self.tile_order, trim_tile_lists=self.trim_tile_lists)
