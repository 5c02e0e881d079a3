"""Hardware-aware pruning (ByteSplat idea 2): keep each tile's Gaussian list within what one
block of the fused kernel holds on chip, removing the Gaussians that matter least.

Four parts, each usable on its own (``docs/pruning.md`` has the overview and the knobs):

(a) **Per-tile capacity** from the device: the built extension says it (``fused_capacity``, the
    number the kernel itself uses), read by :func:`device_tile_capacity`. :func:`tile_capacity` is
    the same arithmetic as a pure function of the shared-memory sizes, on the kernel's layout
    :data:`FUSED_SMEM_LAYOUT` (bytes per staged Gaussian, fixed per-block scratch, chunk): the
    extension reports its own (``fused_smem_layout``) and a GPU test checks that they agree. It serves
    where the extension is not built (a CUDA device whose build failed, or planning on a CPU).
(b) **Contribution score** of a Gaussian in a view: the largest compositing weight ``alpha * T`` it
    gets at any pixel, with gsplat's rules (alpha < 1/255 and sigma < 0 skipped; the Gaussian that
    stops a pixel counts with the weight it would have had, since it hides everything behind it).
    A score of exactly 0 means removing the Gaussian leaves every pixel of that view unchanged.
    The fused backend's training step gathers it in its backward kernels when asked
    (``fused_render_loss(contribution=True)`` -> ``info["contribution"]``, every schedule);
    :func:`contribution_scores_2d` is the definition, the reference the kernel is tested against,
    and the fallback for the reference and gsplat backends: a no-grad pass over the projected
    Gaussians of the ``info`` every backend returns (:func:`scores_from_info` picks).
    :class:`HardwarePruner` keeps a running max over the training views of a window.
(c) **Selection** (:func:`select_prune_mask`): in each (view, tile) over capacity, the
    lowest-scoring Gaussians until the tile fits (never a Gaussian whose tiles are all within
    capacity), then the Gaussians whose score is at or below a threshold; at most a fraction of
    all Gaussians per step (lowest scores first).
(d) **Apply** (:func:`apply_prune`): gsplat's ``strategy.ops.remove``, which filters the parameters,
    the optimizers' per-parameter state and every per-Gaussian tensor of the strategy state (the
    running score included, since it lives there).

:class:`HardwarePruner` is the strategy object that wires these into the model's densification
schedule (``ByteSplatModel.step_post_backward`` calls its ``step_post_backward``): it accumulates
scores before gsplat's step and prunes right after gsplat's refine steps, on the refined Gaussians,
keeping its state on itself and in the strategy state it shares with gsplat.
"""

from __future__ import annotations

import inspect
import math
import weakref
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch
from torch import Tensor

from bytesplat_ns.raster.reference import ALPHA_MAX, ALPHA_MIN, T_MIN, _default_block_size, _plan_chunks
from bytesplat_ns.raster.tiles import alpha_block_rects, bin_rects, intersect_rects, tile_grid, tile_rects

TILE_SIZE = 16
SCORE_KEY = "hw_score"  # [N, periods] running max of alpha*T per period, kept in the strategy state
ORIGIN_KEY = "hw_origin"  # [N] index before gsplat's step, only while gsplat refines at a prune step
SCORE_CHUNK_ELEMS = 1 << 20

# ----------------------------------------------------------------------------------------------
# (a) per-tile capacity
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SmemLayout:
    """What the fused kernel puts in one block's shared memory."""

    bytes_per_gaussian: int  # SmemGaussians::kBytes: one staged Gaussian record
    fixed_bytes: int  # kFixedBytes: SSIM scratch, gradient accumulators, reduction scratch
    granularity: int  # kChunk: the capacity is rounded down to a multiple of this


# The fused kernel's layout (cuda/common.cuh SmemGaussians::kBytes, cuda/fused_loss.cu kFixedBytes,
# kChunk); the extension's fused_smem_layout() returns the same three numbers (tests/engine/test_pruning.py).
FUSED_SMEM_LAYOUT = SmemLayout(bytes_per_gaussian=44, fixed_bytes=38832, granularity=32)


def fused_blocks_per_sm() -> int:
    """Blocks per SM the training step's fused kernel is sized for (``fused_render_loss``'s default)."""
    from bytesplat_ns.raster.fused import fused_render_loss

    return int(inspect.signature(fused_render_loss).parameters["blocks_per_sm"].default)


def tile_capacity(
    smem_per_block_optin: int,
    smem_per_sm: int,
    reserved_smem_per_block: int = 0,
    blocks_per_sm: int = 2,
    bytes_per_gaussian: Optional[int] = None,
    fixed_bytes: Optional[int] = None,
    granularity: Optional[int] = None,
) -> int:
    """Gaussians per tile one block keeps on chip, from the device's shared memory (bytes).

    The budget of a block is ``min(opt-in max per block, per SM / blocks_per_sm - reserved)``; the
    kernel's fixed scratch comes off it, the rest holds ``bytes_per_gaussian`` records, rounded down
    to a multiple of ``granularity``. Layout arguments left None come from :data:`FUSED_SMEM_LAYOUT`.
    Raises ValueError when not even one chunk fits (the kernel refuses that device too).
    """
    if bytes_per_gaussian is None or fixed_bytes is None or granularity is None:
        layout = FUSED_SMEM_LAYOUT
        bytes_per_gaussian = bytes_per_gaussian or layout.bytes_per_gaussian
        fixed_bytes = layout.fixed_bytes if fixed_bytes is None else fixed_bytes
        granularity = granularity or layout.granularity
    budget = min(int(smem_per_block_optin), int(smem_per_sm) // max(1, int(blocks_per_sm)) - int(reserved_smem_per_block))
    cap = (budget - fixed_bytes) // bytes_per_gaussian
    cap = (cap // granularity) * granularity
    if cap < granularity:
        raise ValueError(
            f"too little shared memory per block ({budget} bytes) for the fused kernel: it needs "
            f"{fixed_bytes} + {granularity} x {bytes_per_gaussian} bytes"
        )
    return int(cap)


def device_tile_capacity(device: Optional[torch.device] = None, blocks_per_sm: Optional[int] = None) -> int:
    """Per-tile capacity of the fused kernel on a CUDA device, read from the device."""
    if not torch.cuda.is_available():
        raise RuntimeError("device_tile_capacity needs a CUDA device")
    device = torch.device("cuda", torch.cuda.current_device()) if device is None else torch.device(device)
    bps = fused_blocks_per_sm() if blocks_per_sm is None else int(blocks_per_sm)
    from bytesplat_ns.raster._build import CudaBuildError, load_extension

    try:
        ext = load_extension()
    except CudaBuildError:
        ext = None
    if ext is not None:
        with torch.cuda.device(device):
            return int(ext.fused_capacity(bps))
    props = torch.cuda.get_device_properties(device)
    # cudaDevAttrReservedSharedMemoryPerBlock is 1 KiB from compute capability 8.0 on, 0 before;
    # torch does not expose it.
    reserved = 1024 if props.major >= 8 else 0
    return tile_capacity(
        props.shared_memory_per_block_optin, props.shared_memory_per_multiprocessor, reserved, bps
    )


# ----------------------------------------------------------------------------------------------
# (b) contribution score
# ----------------------------------------------------------------------------------------------


@torch.no_grad()
def contribution_scores_2d(
    means2d: Tensor,
    conics: Tensor,
    opacities: Tensor,
    radii: Tensor,
    depths: Tensor,
    width: int,
    height: int,
    tile_size: int = TILE_SIZE,
    *,
    chunk_elems: int = SCORE_CHUNK_ELEMS,
) -> Tensor:
    """Per view, the largest compositing weight ``alpha * T`` each Gaussian gets at any pixel, [C,N].

    Inputs as the rasterizers' ``info`` holds them: means2d [C,N,2], conics [C,N,3], opacities
    [C,N] (or [N]), radii [C,N] (0: culled), depths [C,N]. Same tile reach, depth order and
    alpha / skip / stop rules as the renderers (the reference rasterizer's block binning); the
    Gaussian that stops a pixel (would take T to <= 1e-4) gets the weight it would have had.
    """
    C, N = radii.shape
    device = means2d.device
    dtype = means2d.dtype if means2d.dtype in (torch.float32, torch.float64) else torch.float32
    means2d = means2d.detach().to(dtype)
    conics = conics.detach().to(dtype)
    opac = opacities.detach().to(dtype)
    if opac.dim() == 1:
        opac = opac.expand(C, -1)
    out = torch.zeros(C * N + 1, dtype=dtype, device=device)  # last slot: padding sink
    bs = _default_block_size(tile_size)
    P = bs * bs
    tw, th = tile_grid(width, height, tile_size)
    gw, gh = tile_grid(width, height, bs)
    rect = intersect_rects(
        tile_rects(means2d, radii, tile_size, tw, th) * (tile_size // bs), alpha_block_rects(means2d, conics, opac, bs)
    )
    rect = torch.where((radii > 0)[..., None], rect, torch.zeros_like(rect))
    bins = bin_rects(rect, depths.detach(), gw, gh)
    counts = bins.counts
    nonempty = torch.nonzero(counts > 0).squeeze(1)
    if nonempty.numel() == 0:
        return out[:-1].view(C, N)
    cnt_sorted, order = torch.sort(counts[nonempty], descending=True)
    cells = nonempty[order]
    cnt_list: List[int] = cnt_sorted.tolist()
    tab = torch.cat(
        [means2d, -0.5 * conics[..., :1], -conics[..., 1:2], -0.5 * conics[..., 2:], opac[..., None]], dim=-1
    ).reshape(C * N, 6)
    lp = torch.arange(P, device=device)
    lx = lp % bs
    ly = torch.div(lp, bs, rounding_mode="floor")
    for i, j in _plan_chunks(cnt_list, P, chunk_elems):
        K = cnt_list[i]
        cid = cells[i:j]
        ar = torch.arange(K, device=device)
        valid = ar[None, :] < cnt_sorted[i:j, None]
        pos = (bins.offsets[cid][:, None] + ar[None, :]).clamp_max(bins.flatten_ids.numel() - 1)
        gid = torch.where(valid, bins.flatten_ids[pos], torch.full_like(pos, C * N))
        bx = cid % gw
        by = torch.div(cid, gw, rounding_mode="floor").remainder(gh)
        ix = bx[:, None] * bs + lx[None, :]  # [B,P] integer pixel coordinates
        iy = by[:, None] * bs + ly[None, :]
        inside = (ix < width) & (iy < height)  # the last blocks may run past the image
        t = torch.where(valid[..., None], tab[gid.clamp_max(C * N - 1)], torch.zeros((), dtype=dtype, device=device))
        dx = t[..., 0:1] - (ix.to(dtype) + 0.5)[:, None, :]  # [B,K,P]
        dy = t[..., 1:2] - (iy.to(dtype) + 0.5)[:, None, :]
        nha, nb, nhc, o = (v.unsqueeze(-1) for v in t[..., 2:6].unbind(-1))
        nsigma = torch.addcmul(nha * dx, nb, dy) * dx + nhc * dy * dy
        alpha = torch.clamp_max(o * torch.exp(torch.clamp_min(nsigma, -20.0)), ALPHA_MAX)
        alpha = alpha * ((nsigma <= 0) & (alpha >= ALPHA_MIN) & inside[:, None, :])
        T_incl = torch.cumprod(1.0 - alpha, dim=1)
        T_excl = torch.cat([torch.ones_like(T_incl[:, :1]), T_incl[:, :-1]], dim=1)
        # pixels stop before the Gaussian that takes T to <= 1e-4: that one still counts (it hides
        # what is behind it), everything after it does not (T before it is already <= 1e-4)
        w = alpha * T_excl * (T_excl > T_MIN)
        out.scatter_reduce_(0, gid.reshape(-1), w.amax(-1).reshape(-1), reduce="amax")
    return out[:-1].view(C, N)


@torch.no_grad()
def contribution_scores(
    means: Tensor, quats: Tensor, scales: Tensor, opacities: Tensor, viewmats: Tensor, Ks: Tensor,
    width: int, height: int, *, eps2d: float = 0.3, near_plane: float = 0.01, far_plane: float = 1e10,
) -> Tensor:
    """:func:`contribution_scores_2d` from 3D Gaussians (activated scales/opacities), [C,N]."""
    from bytesplat_ns.raster.projection import project_gaussians

    pr = project_gaussians(means, quats, scales, viewmats, Ks, width, height, eps2d=eps2d,
                           near_plane=near_plane, far_plane=far_plane)
    return contribution_scores_2d(pr.means2d, pr.conics, opacities, pr.radii, pr.depths, width, height)


CONTRIBUTION_INFO_KEY = "contribution"  # [C,N] max alpha*T, when a rasterizer provides it


def scores_from_info(info: Dict[str, Any]) -> Tensor:
    """Per-Gaussian score [N] of the views of one rendered batch (max over its views).

    Uses ``info["contribution"]`` ([C,N], the same quantity) when the rasterizer computed it (the
    fused training step with ``contribution=True``: its backward kernels gather it); otherwise a
    no-grad pass of :func:`contribution_scores_2d` over the projected Gaussians of ``info``."""
    given = info.get(CONTRIBUTION_INFO_KEY)
    if isinstance(given, Tensor):
        return given.detach().reshape(-1, given.shape[-1]).amax(0)
    if info.get("gaussian_ids") is not None:
        raise ValueError("hardware-aware pruning needs unpacked rasterizer output (packed=False)")
    s = contribution_scores_2d(
        info["means2d"], info["conics"], info["opacities"], info["radii"], info["depths"],
        int(info["width"]), int(info["height"]), int(info.get("tile_size", TILE_SIZE)),
    )
    return s.amax(0)


# ----------------------------------------------------------------------------------------------
# tile lists
# ----------------------------------------------------------------------------------------------


@torch.no_grad()
def tile_entries(info: Dict[str, Any], tile_size: int = TILE_SIZE,
                 opacity_aware: bool = False) -> Tuple[Tensor, Tensor, int]:
    """The fused kernel's tile lists for the views in ``info`` as (tile key [M], Gaussian [M],
    number of tiles): entry m says Gaussian ``gaussian[m]`` (index into N) is in tile ``key[m]``
    (view-major). Same binning as the fused backend (``fused.bin_tiles``), into the projection's
    square radii or, with ``opacity_aware`` (the fused backend's ``fused.opacity_aware_tiles``), each
    Gaussian's opacity-aware reach (``raster.tile_reach``; ``info`` then holds conics and opacities)."""
    from bytesplat_ns.raster.fused import bin_tiles, tile_radii
    from bytesplat_ns.raster.options import FusedOptions

    radii = info["radii"]
    C, N = radii.shape
    W, H = int(info["width"]), int(info["height"])
    reach = tile_radii(radii, info.get("conics"), info.get("opacities"), FusedOptions(opacity_aware_tiles=opacity_aware))
    offsets, flatten_ids = bin_tiles(info["means2d"], reach, info["depths"], W, H, tile_size)
    offsets = offsets.long()
    n_tiles = offsets.numel() - 1
    counts = offsets[1:] - offsets[:-1]
    keys = torch.repeat_interleave(torch.arange(n_tiles, device=offsets.device), counts)
    return keys, flatten_ids.long() % N, n_tiles


def tile_counts(keys: Tensor, n_tiles: int, keep: Optional[Tensor] = None, gids: Optional[Tensor] = None) -> Tensor:
    """Gaussians per tile, optionally only those with ``keep[gid]``."""
    if keep is not None:
        assert gids is not None
        keys = keys[keep[gids]]
    return torch.bincount(keys, minlength=n_tiles)


# ----------------------------------------------------------------------------------------------
# (c) selection
# ----------------------------------------------------------------------------------------------


@torch.no_grad()
def select_prune_mask(
    scores: Tensor,
    tile_keys: Optional[Tensor],
    tile_gids: Optional[Tensor],
    capacity: Optional[int],
    *,
    min_contribution: float = 0.0,
    max_fraction: float = 0.05,
    prune_low_contribution: bool = True,
    n_tiles: Optional[int] = None,
) -> Tuple[Tensor, Dict[str, Any]]:
    """Which Gaussians to remove, as a boolean mask [N], and counts describing the choice.

    1. **Overflow**: for every tile (``tile_keys``/``tile_gids``: entries of the tile lists, see
       :func:`tile_entries`; several views just use distinct keys) holding more than ``capacity``
       Gaussians, its ``count - capacity`` lowest-scoring Gaussians (ties: lower index first). A
       Gaussian goes only if one of its tiles is over capacity; removing each over-capacity tile's
       excess lowest is exactly what removing Gaussians one by one in increasing score while any
       of their tiles is over capacity gives.
    2. **Low contribution**: Gaussians with ``score <= min_contribution`` (when
       ``prune_low_contribution``).
    3. At most ``floor(max_fraction * N)`` in all, stage 1 first (the cap is spent on the overflow,
       which is what the kernel needs), then stage 2, each lowest scores first. Without the cap
       the order does not matter: the low-contribution Gaussians of a crowded tile are its lowest,
       so the overflow takes them first. Tiles left over capacity take the kernel's streaming path.
    """
    N = scores.numel()
    device = scores.device
    budget = int(math.floor(max_fraction * N))
    mask = torch.zeros(N, dtype=torch.bool, device=device)
    stats: Dict[str, Any] = dict(gaussians=N, budget=budget, overflow=0, over_capacity=0, low_contribution=0,
                                 tiles=0, tiles_over_before=0, tiles_over_after=0,
                                 max_tile_before=0, max_tile_after=0, capacity=capacity)

    def lowest(cand: Tensor, limit: int) -> Tensor:
        """The ``limit`` lowest-scoring of the candidate mask (ties: lower index)."""
        idx = torch.nonzero(cand).squeeze(1)
        if idx.numel() <= limit:
            return cand
        order = torch.sort(scores[idx], stable=True).indices[:limit]  # idx is ascending: stable = index ties
        keep = torch.zeros_like(cand)
        keep[idx[order]] = True
        return keep

    crowded = capacity is not None and capacity > 0 and tile_keys is not None and tile_keys.numel() > 0
    if crowded:
        assert tile_gids is not None
        n_tiles = int(n_tiles if n_tiles is not None else int(tile_keys.max()) + 1)
        counts = torch.bincount(tile_keys, minlength=n_tiles)
        stats["tiles"] = n_tiles
        stats["tiles_over_before"] = int((counts > capacity).sum())
        stats["max_tile_before"] = int(counts.max())
        excess = counts - capacity
        over = excess[tile_keys] > 0
        k, g = tile_keys[over], tile_gids[over]
        if k.numel() > 0:
            # sort entries by (tile, score, index): stable sorts from the last key to the first
            o = torch.sort(g, stable=True).indices
            o = o[torch.sort(scores[g[o]], stable=True).indices]
            o = o[torch.sort(k[o], stable=True).indices]
            k, g = k[o], g[o]
            first = torch.searchsorted(k, k, right=False)
            rank = torch.arange(k.numel(), device=device) - first
            chosen = torch.zeros(N, dtype=torch.bool, device=device)
            chosen[g[rank < excess[k]]] = True
            stats["overflow"] = int(chosen.sum())
            chosen = lowest(chosen, budget)
            stats["over_capacity"] = int(chosen.sum())
            mask |= chosen

    left = budget - int(mask.sum())
    if prune_low_contribution and left > 0:
        low = lowest((scores <= min_contribution) & ~mask, left)
        stats["low_contribution"] = int(low.sum())
        mask |= low

    if crowded:
        after = tile_counts(tile_keys, n_tiles, ~mask, tile_gids)
        stats["tiles_over_after"] = int((after > capacity).sum())
        stats["max_tile_after"] = int(after.max())
    return mask, stats


# ----------------------------------------------------------------------------------------------
# (d) apply
# ----------------------------------------------------------------------------------------------


@torch.no_grad()
def apply_prune(params, optimizers: Dict[str, torch.optim.Optimizer], state: Dict[str, Any], mask: Tensor) -> int:
    """Remove the masked Gaussians from the parameters, the optimizers' state (Adam moments) and
    every per-Gaussian tensor of the strategy state, in place (gsplat's ``strategy.ops.remove``:
    parameters are replaced, optimizers re-pointed at them). Returns the number removed."""
    from gsplat.strategy.ops import remove

    n = int(mask.sum())
    if n:
        remove(params=params, optimizers=optimizers, state=state, mask=mask)
    return n


# ----------------------------------------------------------------------------------------------
# training-schedule integration
# ----------------------------------------------------------------------------------------------


@dataclass
class HWPruneSettings:
    """The model config's ``hw_prune*`` fields (see ``ByteSplatModelConfig``)."""

    mode: str = "auto"
    every_refines: int = 1
    max_fraction: float = 0.05
    min_contribution: float = 1.0 / 255.0
    window: int = 0
    tile_views: int = 4
    capacity: int = 0
    stop_iter: int = -1
    opacity_aware_tiles: bool = False  # the fused backend's tile reach: the lists whose capacity counts

    @classmethod
    def from_config(cls, config: Any) -> "HWPruneSettings":
        return cls(
            mode=getattr(config, "hw_prune", "off"),
            every_refines=int(getattr(config, "hw_prune_every_refines", cls.every_refines)),
            max_fraction=float(getattr(config, "hw_prune_max_fraction", cls.max_fraction)),
            min_contribution=float(getattr(config, "hw_prune_min_contribution", cls.min_contribution)),
            window=int(getattr(config, "hw_prune_window", cls.window)),
            tile_views=int(getattr(config, "hw_prune_tile_views", cls.tile_views)),
            capacity=int(getattr(config, "hw_prune_capacity", cls.capacity)),
            stop_iter=int(getattr(config, "hw_prune_stop_iter", cls.stop_iter)),
            opacity_aware_tiles=bool(getattr(getattr(config, "fused", None), "opacity_aware_tiles", False)),
        )


def _log(msg: str) -> None:
    try:
        from nerfstudio.utils.rich_utils import CONSOLE

        CONSOLE.log(msg)
    except Exception:  # pragma: no cover
        print(msg)


def configured_tile_capacity(configured: int, device: torch.device) -> Optional[int]:
    """The tile capacity to prune or measure against: ``configured`` (``--pipeline.model.hw-prune-capacity``)
    when set, else the fused kernel's on a CUDA ``device``, else None (CPU: no capacity)."""
    if configured > 0:
        return int(configured)
    return device_tile_capacity(device) if device.type == "cuda" else None


@torch.no_grad()
def follow_origin(keys: Tensor, gids: Tensor, origin: Tensor, n_before: int) -> Tuple[Tensor, Tensor]:
    """Tile-list entries (``keys``, ``gids``: indices before gsplat's refine step) carried to the
    Gaussians after it: ``origin[i]`` is the index before the step of Gaussian ``i`` after it (the
    strategy state's ``hw_origin``, which duplicate/split/remove carry like any per-Gaussian
    tensor). An entry is repeated for every descendant of its Gaussian and dropped when the
    Gaussian was removed. Exact for duplicates (same footprint); a split child is counted in its
    parent's tiles (its footprint is 1.6x smaller, around a sample of the parent)."""
    origin = origin.long()
    order = torch.argsort(origin, stable=True)  # new indices grouped by their origin
    per = torch.bincount(origin, minlength=n_before)  # descendants per old Gaussian
    start = torch.cumsum(per, 0) - per
    rep = per[gids]
    total = int(rep.sum())
    new_keys = torch.repeat_interleave(keys, rep, output_size=total)
    first = torch.repeat_interleave(torch.cumsum(rep, 0) - rep, rep, output_size=total)
    local = torch.arange(total, device=keys.device) - first
    new_gids = order[torch.repeat_interleave(start[gids], rep, output_size=total) + local]
    return new_keys, new_gids


class HardwarePruner:
    """The pruning strategy: runs (b)-(d) around gsplat ``DefaultStrategy``'s densification and holds
    their state (score columns, recorded tile lists, history). ``ByteSplatModel`` owns one
    (``model.pruning``) and calls :meth:`step_post_backward` from its own.

    **Prune steps**: the gsplat refine steps ``s`` (``s > refine_start``, ``s % refine_every == 0``,
    outside gsplat's pause after an opacity reset, ``s < refine_stop``) with
    ``s % period == 0``, ``period = every_refines * refine_every``, and ``s < stop`` (``stop_iter``,
    default gsplat's ``refine_stop_iter``). Pruning runs after gsplat's own step, on its result.

    **Score**: every training view from ``period * columns`` steps before the first prune step to
    the last one adds its contribution (the fused kernel's ``info["contribution"]``, else the torch
    pass) into ``state["hw_score"]`` [N, columns], a running max per period of ``period`` steps
    (column 0: the current one; columns rotate after each period's last step). So the score of a
    prune step covers the steps since the previous prune step and, when a window of ``window``
    views (default one per training image) is longer than that, as many periods before as it takes:
    ``columns = ceil(window / period)``. gsplat's duplicate/split/remove carry it (children inherit
    their parent's score).

    **Tile lists**: the last ``tile_views`` views before a prune step (at most ``refine_every``: all
    after the previous refine, so same Gaussian indices) record their tiles holding more than half
    the capacity (one refine step at most doubles a tile: the others cannot overflow after it).
    ``state["hw_origin"]`` then follows gsplat's step at ``s`` so the entries are carried to the
    refined Gaussians (:func:`follow_origin`).

    At ``s``, after gsplat's step: the overflow of the recorded tiles when the capacity is known
    (device or ``capacity``), then the low-contribution Gaussians when the score covers the whole
    window; at most ``max_fraction`` of all Gaussians (:func:`select_prune_mask`).
    """

    def __init__(self, settings: HWPruneSettings, strategy: Any, num_train_data: int, enabled: bool,
                 capacity: Optional[int]):
        self.settings = settings
        self.strategy = strategy
        self.enabled = enabled
        self.capacity = capacity
        self.period = max(1, settings.every_refines) * max(1, strategy.refine_every)
        self.window = settings.window if settings.window > 0 else max(1, num_train_data)
        self.columns = max(1, math.ceil(self.window / self.period))
        self.tile_views = max(0, min(settings.tile_views, max(1, strategy.refine_every)))
        self.stop = min(settings.stop_iter if settings.stop_iter > 0 else strategy.refine_stop_iter,
                        strategy.refine_stop_iter)
        self.first_prune = self.next_prune_step(0)
        self.last_prune = self._last_prune_step()
        # scoring starts so that the first prune step sees a full window
        self.first_score = None if self.first_prune is None else max(0, self.first_prune - self.columns * self.period + 1)
        self._column_views: List[int] = [0] * self.columns  # views scored into each column
        self._tiles: List[Tuple[Tensor, Tensor, int, int]] = []  # crowded-tile entries, n_tiles, max other tile
        self._tiles_owner: Optional[weakref.ref] = None
        self._origin_n = 0  # Gaussians before gsplat's step at the prune step (hw_origin's range)
        self.last_stats: Optional[Dict[str, Any]] = None
        self.history: List[Dict[str, Any]] = []

    @classmethod
    def from_model(cls, model: Any) -> "HardwarePruner":
        settings = HWPruneSettings.from_config(model.config)
        if settings.mode not in ("auto", "on", "off"):
            raise ValueError(f"hw_prune must be auto, on or off, got {settings.mode!r}")
        # auto is off until the GPU run of docs/pruning.md ("What the GPU run must measure") shows that
        # pruning after each refine step, scored by the fused kernel, pays for itself;
        # --pipeline.model.hw-prune on runs it.
        enabled = settings.mode == "on"
        dist = torch.distributed.is_available() and torch.distributed.is_initialized() and torch.distributed.get_world_size() > 1
        if enabled and dist:
            _log("bytesplat: hardware-aware pruning is not supported with sharded training yet; off")
            enabled = False
        capacity = configured_tile_capacity(settings.capacity, model.device) if enabled else (settings.capacity if settings.capacity > 0 else None)
        if enabled and capacity is None:
            _log("bytesplat: hw-prune on a CPU model without --pipeline.model.hw-prune-capacity: "
                 "only low-contribution pruning runs (no device capacity)")
        pruner = cls(settings, model.strategy, int(getattr(model, "num_train_data", 1) or 1), enabled, capacity)
        if enabled:
            _log(f"bytesplat: hardware-aware pruning on (tile capacity {capacity}, after gsplat's refine steps "
                 f"every {pruner.period} steps, score window {pruner.columns * pruner.period} views)")
        return pruner

    # -- schedule --
    def is_prune_step(self, step: int) -> bool:
        s = self.strategy
        return (
            self.enabled
            and step % self.period == 0
            and s.refine_start_iter < step < self.stop
            and step % s.refine_every == 0
            and step % s.reset_every >= s.pause_refine_after_reset
        )

    def next_prune_step(self, step: int) -> Optional[int]:
        """The first prune step at or after ``step`` (None: none left)."""
        b = -(-max(step, 0) // self.period) * self.period
        while b < self.stop:
            if self.is_prune_step(b):
                return b
            b += self.period
        return None

    def _last_prune_step(self) -> Optional[int]:
        b = ((self.stop - 1) // self.period) * self.period
        while b >= 0 and self.first_prune is not None and b >= self.first_prune:
            if self.is_prune_step(b):
                return b
            b -= self.period
        return None

    def scores_step(self, step: int) -> bool:
        """Whether the view of ``step`` is scored (the model then asks the fused kernel for it)."""
        return (self.enabled and self.first_score is not None and self.last_prune is not None
                and self.first_score <= step <= self.last_prune)

    def _scores(self, state: Dict[str, Any], n: int, device: torch.device) -> Tensor:
        score = state.get(SCORE_KEY)
        if not isinstance(score, Tensor) or score.dim() != 2 or score.shape != (n, self.columns):
            # first use, or the Gaussians changed behind gsplat's back (a loaded checkpoint): start over
            score = torch.zeros(n, self.columns, dtype=torch.float32, device=device)
            state[SCORE_KEY] = score
            self._column_views = [0] * self.columns
        return score

    # -- the model's hooks --
    def wants_contribution(self, step: int) -> bool:
        """Whether the render of ``step`` should carry ``info["contribution"]`` (the fused kernel
        gathers it in its backward only when asked)."""
        return self.scores_step(step)

    def step_post_backward(self, params, optimizers, state: Dict[str, Any], step: int, info: Optional[Dict[str, Any]],
                           refine: Callable[[int], None]) -> Optional[Dict[str, Any]]:
        """The densification step with pruning right after it: ``refine(step)`` is splatfacto's
        ``step_post_backward`` (gsplat's refine) on the same ``params``/``optimizers``/``state``.
        Returns the pruning stats of this step, or None."""
        if not self.enabled:
            refine(step)
            return None
        self.before_strategy(params, state, info or {}, step)
        refine(step)
        return self.after_strategy(params, optimizers, state, step)

    def before_strategy(self, params, state: Dict[str, Any], info: Dict[str, Any], step: int) -> None:
        """Score the step's views (and record tile lists); ``info`` is the render of ``params``."""
        if not self.scores_step(step) or not info:
            return
        n = params["means"].shape[0]
        if info["radii"].shape[-1] != n:  # not a render of the current Gaussians (crop, stale info)
            return
        score = self._scores(state, n, params["means"].device)
        score[:, 0] = torch.maximum(score[:, 0], scores_from_info(info).to(torch.float32))
        self._column_views[0] += int(info.get("n_cameras", 1))
        target = self.next_prune_step(step)
        if target is None:
            return
        owner = params["means"]
        if target - step < self.tile_views and self.capacity:
            if self._tiles_owner is None or self._tiles_owner() is not owner:
                self._tiles, self._tiles_owner = [], weakref.ref(owner)
            keys, gids, nt = tile_entries(info, opacity_aware=self.settings.opacity_aware_tiles)
            counts = torch.bincount(keys, minlength=nt)
            # only tiles that can overflow after gsplat's step (which at most doubles one) are kept
            kept = 2 * counts[keys] > self.capacity
            rest = counts[2 * counts <= self.capacity]
            self._tiles.append((keys[kept].to(torch.int32), gids[kept].to(torch.int32), nt,
                                int(rest.max()) if rest.numel() else 0))
        if target == step and self._tiles and self._tiles_owner() is owner:
            state[ORIGIN_KEY] = torch.arange(n, device=owner.device)
            self._origin_n = n

    def after_strategy(self, params, optimizers, state: Dict[str, Any], step: int) -> Optional[Dict[str, Any]]:
        """After gsplat's step: prune at a prune step; rotate the score columns at a period's end.
        Returns the pruning stats, or None."""
        origin = state.pop(ORIGIN_KEY, None)
        stats = None
        if self.is_prune_step(step):
            if isinstance(state.get(SCORE_KEY), Tensor):
                stats = self._prune(params, optimizers, state, step, origin)
            self._tiles, self._tiles_owner = [], None
        score = state.get(SCORE_KEY)
        if isinstance(score, Tensor) and self.last_prune is not None and step >= self.last_prune:
            state[SCORE_KEY] = None  # no pruning left: stop carrying it
        elif isinstance(score, Tensor) and step % self.period == 0:
            state[SCORE_KEY] = torch.cat([torch.zeros_like(score[:, :1]), score[:, :-1]], 1)
            self._column_views = [0] + self._column_views[:-1]
        return stats

    def _prune(self, params, optimizers, state: Dict[str, Any], step: int, origin: Optional[Tensor]) -> Dict[str, Any]:
        n = params["means"].shape[0]
        scores = state[SCORE_KEY]
        scores = scores.amax(1) if scores.dim() == 2 else scores
        keys = gids = None
        n_tiles = 0
        under_max = 0
        if self._tiles and origin is not None and origin.shape[0] == n:
            parts_k, parts_g = [], []
            for k, g, nt, umax in self._tiles:
                parts_k.append(k.long() + n_tiles)
                parts_g.append(g.long())
                n_tiles += nt
                under_max = max(under_max, umax)
            keys, gids = follow_origin(torch.cat(parts_k), torch.cat(parts_g), origin, self._origin_n)
        views = sum(self._column_views)
        full_window = views >= self.window
        mask, stats = select_prune_mask(
            scores, keys, gids, self.capacity,
            min_contribution=self.settings.min_contribution, max_fraction=self.settings.max_fraction,
            prune_low_contribution=full_window, n_tiles=n_tiles or None,
        )
        if n_tiles:
            # the recorded lists hold only the tiles more than half full; the others held at most under_max
            # (before gsplat's step, so within capacity after it)
            stats["tiles"] = n_tiles
            stats["max_tile_before"] = max(stats["max_tile_before"], under_max)
            stats["max_tile_after"] = max(stats["max_tile_after"], under_max)
        removed = apply_prune(params, optimizers, state, mask)
        stats.update(step=step, removed=removed, window_views=views, full_window=full_window,
                     gaussians_after=n - removed)
        self.last_stats = stats
        self.history.append(stats)
        tiles = max(1, stats["tiles"])
        _log(
            f"bytesplat hw-prune step {step}: removed {stats['over_capacity']} over-capacity (overflow "
            f"{stats['overflow']}) + {stats['low_contribution']} low-contribution Gaussians ({n} -> {n - removed}); "
            f"tiles over capacity {stats['tiles_over_before'] / tiles:.2%} -> {stats['tiles_over_after'] / tiles:.2%} "
            f"(capacity {self.capacity}, largest tile {stats['max_tile_before']} -> {stats['max_tile_after']})"
        )
        try:
            from nerfstudio.utils import writer

            writer.put_scalar("hw_prune/removed", removed, step)
            writer.put_scalar("hw_prune/over_capacity_tiles_before", stats["tiles_over_before"] / tiles, step)
            writer.put_scalar("hw_prune/over_capacity_tiles_after", stats["tiles_over_after"] / tiles, step)
        except Exception:  # pragma: no cover - logging must never break training
            pass
        return stats
