"""One distributed training step with sharded Gaussians (docs/design.md, "One training step", "Distributed design").

A batch of B views is spread evenly over R ranks (``assign_views``: contiguous blocks whose sizes
differ by at most one). Every rank

1. projects ITS Gaussians into EVERY view of the batch (projection + SH -> color, with autograd),
2. culls (radius 0) and sends each view's surviving 2D records (means2d, conics, colors, opacity,
   depth, radius, global id) to the rank rendering that view (``Communicator.send_records``),
3. renders its own views by compositing the gathered records (``composite_records``, the reference
   backend's compositing; ties in depth are broken by global id exactly as in one process) and
   computes the loss,
4. in the backward, returns the 2D gradients of the received records to their owners
   (``Communicator.return_gradients``: dense or sparse-grad), which continue the backward through
   their own projection,
5. steps its own optimizers on its own shard.

The renderer side runs inside a ``torch.autograd.Function`` (``sharded_render_loss``) whose
forward returns this rank's share of the batch loss and whose backward does steps 3-4's backward,
so the owner's projection, SH and the optimizers need no change and nerfstudio's trainer can call
``loss.backward()`` itself.

Loss: the batch loss is the MEAN over the B views of the per-view loss (splatfacto's
``0.8 L1 + 0.2 (1 - SSIM)`` by default); each rank's share is the sum over its views divided by B,
so the shares add up to the batch loss and the gradients equal the single-process ones.

Batch-size scaling of Adam (``scale_adam_for_batch``): one step on a batch of B views replaces B
single-view steps. With independent per-view gradients the mean gradient's variance drops by B,
so the learning rate is multiplied by sqrt(B) to keep the per-view update's diffusion, and Adam's
moment decays are raised to the power B (beta1**B, beta2**B) so the moments keep the same memory
measured in views. B=1 leaves everything unchanged. (The rule of "On Scaling Up 3D Gaussian
Splatting Training", Zhao et al. 2024; our own implementation.)
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import torch
from torch import Tensor

from bytesplat_ns.distributed.communicators import (
    CommStats,
    Communicator,
    Records,
    grad_columns,
)
from bytesplat_ns.distributed.exchange import DistributedError, ExchangeStats, all_reduce_, rank_and_world
from bytesplat_ns.distributed.sharding import ShardLayout, gather_layout_and_view_counts
from bytesplat_ns.raster.fused import project, resolve_projection
from bytesplat_ns.raster.loss import splatfacto_loss
from bytesplat_ns.raster.options import DEFAULT_OPTIONS, FusedOptions
from bytesplat_ns.raster.reference import rasterize_to_pixels_reference

LossFn = Callable[[Tensor, Tensor], Tensor]
PARAM_NAMES = ("means", "scales", "quats", "features_dc", "features_rest", "opacities")


# ---------------------------------------------------------------------------------------------
# Batch bookkeeping


@dataclass
class Views:
    """A batch of B pinhole views (OpenCV world-to-camera ``viewmats``), the same on every rank.

    ``images[b]`` (ground truth [H,W,3] in [0,1]) is only read on the rank that renders view b;
    ``backgrounds`` [B,3] is the color composited behind each view.
    """

    viewmats: Tensor  # [B,4,4]
    Ks: Tensor  # [B,3,3]
    width: int
    height: int
    images: Sequence[Tensor]  # [B] of [H,W,3] (a [B,H,W,3] tensor works too)
    backgrounds: Tensor  # [B,3]

    @property
    def num_views(self) -> int:
        return int(self.viewmats.shape[0])


def assign_views(num_views: int, world_size: int) -> List[List[int]]:
    """Views rendered by each rank: contiguous blocks, sizes differing by at most one."""
    base, extra = divmod(num_views, world_size)
    out, start = [], 0
    for r in range(world_size):
        n = base + (1 if r < extra else 0)
        out.append(list(range(start, start + n)))
        start += n
    return out


def scale_adam_for_batch(lr: float, betas: Tuple[float, float], batch_size: int) -> Tuple[float, Tuple[float, float]]:
    """(lr * sqrt(B), (beta1**B, beta2**B)): see the module docstring for the rule."""
    if batch_size < 1:
        raise ValueError(f"batch size must be >= 1, got {batch_size}")
    return lr * math.sqrt(batch_size), (betas[0] ** batch_size, betas[1] ** batch_size)


# ---------------------------------------------------------------------------------------------
# Pieces shared by the single-process oracle and the sharded step


def gaussian_colors(params: Mapping[str, Tensor], sh_degree: Optional[int]) -> Tensor:
    """splatfacto's color inputs: SH coefficients [N,K,3] (``sh_degree`` given) or sigmoid RGB [N,3]."""
    coeffs = torch.cat((params["features_dc"][:, None, :], params["features_rest"]), dim=1)
    if sh_degree is None:
        return torch.sigmoid(coeffs).squeeze(1)
    return coeffs


def rgb_with_background(render: Tensor, alpha: Tensor, background: Tensor) -> Tensor:
    """The model's training image: ``clamp(render + (1 - alpha) * background, 0, 1)``."""
    return torch.clamp(render + (1.0 - alpha) * background, 0.0, 1.0)


def splatfacto_lambda(loss_fn: LossFn) -> Optional[float]:
    """The SSIM weight when ``loss_fn`` is splatfacto's loss (``splatfacto_loss`` itself or a
    ``functools.partial`` of it), else None: only then may the fused kernel compute the loss."""
    if loss_fn is splatfacto_loss:
        return 0.2
    if isinstance(loss_fn, functools.partial) and loss_fn.func is splatfacto_loss and not loss_fn.args:
        if set(loss_fn.keywords) <= {"ssim_lambda"}:
            return float(loss_fn.keywords.get("ssim_lambda", 0.2))
    return None


@dataclass
class ShardProjection:
    """Projection of one shard into all B views (graph tensors; culled entries are zero)."""

    means2d: Tensor  # [B,n,2]
    conics: Tensor  # [B,n,3]
    colors: Tensor  # [B,n,D]
    opacities: Tensor  # [B,n]
    depths: Tensor  # [B,n]
    radii: Tensor  # [B,n] int32


def project_shard(
    params: Mapping[str, Tensor],
    views: Views,
    sh_degree: Optional[int],
    *,
    eps2d: float = 0.3,
    near_plane: float = 0.01,
    far_plane: float = 1e10,
    projection: Optional[str] = None,
) -> ShardProjection:
    """Project this rank's Gaussians into every view, as ``rasterize(backend="reference")`` does.

    ``projection``: ``torch`` (``raster.projection``/``raster.sh``, any device) or ``gsplat``
    (gsplat's CUDA projection and SH kernels, same math); None or ``auto`` picks gsplat for CUDA
    tensors when its extension is importable, torch otherwise.
    """
    B = views.num_views
    means = params["means"]
    projection = resolve_projection(projection, means.device)
    radii, means2d, depths, conics, cols, _ = project(
        means, params["quats"], torch.exp(params["scales"]), params["opacities"].squeeze(-1),
        gaussian_colors(params, sh_degree), views.viewmats, views.Ks, views.width, views.height,
        sh_degree=sh_degree, near_plane=near_plane, far_plane=far_plane, eps2d=eps2d, projection=projection,
    )
    if projection == "gsplat":
        # gsplat leaves culled entries uninitialised (and its SH gives them 0.5); the contract is zeros
        seen = radii > 0
        means2d = torch.where(seen[..., None], means2d, 0.0)
        conics = torch.where(seen[..., None], conics, 0.0)
        depths = torch.where(seen, depths, 0.0)
        if sh_degree is not None:
            cols = torch.where(seen[..., None], cols, 0.0)
        radii = radii.to(torch.int32)
    opacities = torch.sigmoid(params["opacities"]).squeeze(-1).expand(B, -1)
    return ShardProjection(means2d, conics, cols, opacities, depths, radii)


def _nonzero_of_known_count(mask: Tensor, count: int) -> Tensor:
    """Indices of the True entries of 1-D ``mask``, whose number the host already knows: sized
    up front, so the device is not waited on (``torch.nonzero`` must read the count back)."""
    try:
        return torch.nonzero_static(mask, size=count).squeeze(1)
    except NotImplementedError:  # a build without the kernel for this device
        return torch.nonzero(mask).squeeze(1)


def _out_of_gid_order(gids: Tensor, said_sorted: bool = False) -> bool:
    """Whether records with these global ids are out of order (reads the device); records
    ``said_sorted`` that are not raise instead."""
    g = gids.to(torch.int64)
    unsorted = g.numel() > 1 and bool((g[1:] < g[:-1]).any())
    if unsorted and said_sorted:
        raise AssertionError("records said to be in global-id order are not")
    return unsorted


def _records_in_gid_order(means2d, conics, colors, opacities, depths, radii, gids, sorted_by_gid=False):
    """Put records in global-id order (a stable depth sort then breaks ties by global id, exactly
    as one process holding all Gaussians). Returns the permuted tensors and the order (or None).
    ``sorted_by_gid``: the caller's records already are (the record exchange's are), so the check,
    a device read per view, is skipped on the GPU; on the CPU, where it costs no wait, it is asserted."""
    g = gids.to(torch.int64)
    order = None
    unsorted = (not sorted_by_gid or not g.is_cuda) and _out_of_gid_order(g, sorted_by_gid)
    if unsorted:
        order = torch.argsort(g, stable=True)
        means2d, conics, colors = means2d[order], conics[order], colors[order]
        opacities, depths, radii = opacities[order], depths[order], radii[order]
    return (means2d, conics, colors, opacities, depths, radii), order


def _collect_absgrad(m: Tensor, orders: Sequence[Optional[Tensor]], sinks: Sequence[List[Tensor]],
                     rows: Sequence[int]) -> None:
    """After the backward has published ``m.absgrad`` ([C,M,2], view j's records in gid order in its
    first ``rows[j]`` rows), append view j's to ``sinks[j]`` in the caller's record order
    (``orders[j]``, None: already)."""

    def _collect(grad: Tensor) -> None:
        for j, (order, sink) in enumerate(zip(orders, sinks)):
            a = m.absgrad[j, : rows[j]]
            if order is not None:
                a = torch.empty_like(a).index_copy_(0, order, a)
            sink.append(a)
        # The hook lives in m's autograd node and holds m: a cycle through C++ that the garbage
        # collector cannot see. It keeps m alive until the backward; removing it then frees m.
        handle.remove()

    handle = m.register_hook(_collect)


def composite_records(
    means2d: Tensor,
    conics: Tensor,
    colors: Tensor,
    opacities: Tensor,
    depths: Tensor,
    radii: Tensor,
    gids: Tensor,
    width: int,
    height: int,
    tile_size: int = 16,
    absgrad_sink: Optional[List[Tensor]] = None,
    compositor: str = "reference",
    sorted_by_gid: bool = False,
    options: FusedOptions = DEFAULT_OPTIONS,
) -> Tuple[Tensor, Tensor]:
    """Composite gathered 2D records of ONE view: [M,2], [M,3], [M,D], [M], [M], [M] int, [M] ids.

    ``compositor``: ``reference`` (the PyTorch reference rasterizer, any device) or ``fused``
    (bytesplat's CUDA tile rasterizer, ``bytesplat_ns.raster.fused``: forward and backward kernels,
    RGB float32 on the GPU; the same front-to-back order: tiles sorted by depth, ties in record
    order, i.e. by global id).

    Returns (render [H,W,D], alpha [H,W,1]) without background. With ``absgrad_sink`` (a list),
    the backward appends the per-record sum over pixels of |d loss / d mean2d| ([M,2], in the
    order of the inputs) to it. ``sorted_by_gid``: see ``_records_in_gid_order``. ``options``: the
    fused compositor's binning, warp culling and backward reduction.
    """
    (means2d, conics, colors, opacities, depths, radii), order = _records_in_gid_order(
        means2d, conics, colors, opacities, depths, radii, gids, sorted_by_gid)
    m = means2d[None]
    absgrad = absgrad_sink is not None and m.requires_grad
    if compositor == "fused" and means2d.shape[0] > 0:
        from bytesplat_ns.raster.fused import _RasterizeFused, plain_kernel_switches, tile_lists

        if not means2d.is_cuda or colors.shape[-1] != 3:
            raise ValueError("the fused compositor needs CUDA tensors and RGB colors")
        offsets, flatten_ids = tile_lists(m, radii[None], depths[None], conics[None], opacities[None], width, height,
                                          tile_size, options)
        render, alpha = _RasterizeFused.apply(
            m, conics[None], colors[None], opacities[None], None, offsets, flatten_ids, width, height, absgrad,
            *plain_kernel_switches(options, offsets, width, height, tile_size),
        )
    elif compositor in ("reference", "fused"):
        render, alpha = rasterize_to_pixels_reference(
            m, conics[None], colors[None], opacities[None], radii[None], depths[None], width, height, tile_size, absgrad=absgrad
        )
    else:
        raise ValueError(f"Unknown compositor '{compositor}' (reference or fused)")
    if absgrad:
        assert absgrad_sink is not None
        _collect_absgrad(m, [order], [absgrad_sink], [m.shape[1]])  # after the rasterizer's hook set m.absgrad
    return render[0], alpha[0]


def composite_views_fused_loss(
    records: Sequence[Tuple[Tensor, ...]],
    width: int,
    height: int,
    gts: Tensor,
    backgrounds: Tensor,
    ssim_lambda: float = 0.2,
    tile_size: int = 16,
    absgrad_sinks: Optional[Sequence[List[Tensor]]] = None,
    sorted_by_gid: bool = False,
    known_intersections: Optional[int] = None,
    options: FusedOptions = DEFAULT_OPTIONS,
) -> Tuple[Tensor, Tensor]:
    """C views' records composited AND scored in ONE call of the fused kernels
    (``raster.fused._FusedLoss``): splatfacto's loss ``(1-l) L1 + l (1 - SSIM)`` of
    ``clamp(render + T bg, 0, 1)`` against ``gts`` [C,H,W,3] (``backgrounds`` [C,3]), with its 2D
    gradients computed in the kernels. ``records[j]`` is view j's (means2d [M_j,2], conics, colors,
    opacities, depths, radii, gids). The views are padded with zero rows to the longest (radius 0:
    in no tile's list) and binned together, so a rank's views cost one binning and one launch of
    each kernel instead of one per view. Returns (the SUM of the views' losses, rgb
    [C,H,W,3] detached); the loss is differentiable wrt the records. ``absgrad_sinks[j]`` gets view
    j's per-record sum over pixels of |d loss / d mean2d| ([M_j,2], in the order of its inputs).
    ``known_intersections``: the views' tiles reached in all (``bin_tiles``' ``known_total``), when
    the caller has it: then nothing here waits on the device."""
    C = len(records)
    ordered, orders = [], []
    for rec in records:
        fields, order = _records_in_gid_order(*rec, sorted_by_gid)
        ordered.append(fields)
        orders.append(order)
    rows = [f[0].shape[0] for f in ordered]
    M = max(rows)

    def stacked(i: int) -> Tensor:  # field i of every view, zero rows appended up to M: [C, M, ...]
        pieces = []  # one cat, so the views' records are copied once (as one view's were before)
        for f in ordered:
            pieces.append(f[i])
            if f[i].shape[0] < M:
                pieces.append(f[i].new_zeros((M - f[i].shape[0],) + tuple(f[i].shape[1:])))
        return torch.cat(pieces).view((C, M) + tuple(ordered[0][i].shape[1:]))

    padded = tuple(stacked(i) for i in range(6))
    return _score_padded_views(padded, rows, orders, width, height, gts, backgrounds, ssim_lambda, tile_size,
                               absgrad_sinks, known_intersections, options)


def _score_padded_views(
    padded: Tuple[Tensor, ...],
    rows: Sequence[int],
    orders: Sequence[Optional[Tensor]],
    width: int,
    height: int,
    gts: Tensor,
    backgrounds: Tensor,
    ssim_lambda: float,
    tile_size: int,
    absgrad_sinks: Optional[Sequence[List[Tensor]]],
    known_intersections: Optional[int],
    options: FusedOptions = DEFAULT_OPTIONS,
) -> Tuple[Tensor, Tensor]:
    """The one fused call of :func:`composite_views_fused_loss` on the views' padded fields
    (means2d [C,M,2], conics, colors, opacities, depths, radii; view j's records in its first
    ``rows[j]`` rows, ``orders[j]`` their permutation from the caller's order or None)."""
    from bytesplat_ns.raster.fused import _check, _FusedLoss, loss_tile_order, tile_lists

    m, conics, colors, opacities, depths, radii = padded
    C = m.shape[0]
    _check(width, height, tile_size, m.device)
    absgrad = absgrad_sinks is not None and m.requires_grad
    offsets, flatten_ids = tile_lists(m, radii, depths, conics, opacities, width, height, tile_size, options,
                                      known_intersections)
    # _FusedLoss scores the mean over the C views (they share the image size), so C x that is the sum
    loss, rgb, _, _, _ = _FusedLoss.apply(
        m, conics, colors, opacities, backgrounds.reshape(C, 3).detach().float(),
        gts.detach().float().contiguous(), offsets, flatten_ids, width, height, ssim_lambda, absgrad,
        None, 2, options.schedule, options.butterfly, options.cull_mode, False, options.fast_exp,
        options.bwd_pixels_per_thread, loss_tile_order(options, offsets, width, height, tile_size),
    )
    if absgrad:
        assert absgrad_sinks is not None
        _collect_absgrad(m, orders, absgrad_sinks, rows)
    return loss * C, rgb


Span = Tuple[int, int, int]  # (source rank, first row in its record table, rows)


class _PaddedViewFields(torch.autograd.Function):
    """A group of a rank's views' records, straight from the per-source record tables the exchange
    delivered ([m_s, F] rows: means2d 2, conics 3, colors D, opacity, depth), as the fused call's
    padded fields: means2d [C,M,2], conics [C,M,3], colors [C,M,D], opacities [C,M], depths [C,M]
    (not differentiable). View j is ``spans[j]``: its rows in each source's table, sources in rank
    order (so in global-id order), then zero rows up to M. One batched cat of whole rows and one
    copy per field, and one cat per source in the backward: the per-view cats and per-field pads it
    replaces were about 36 launches for four views, between the step's one host read and its first
    render, where the GPU waits for the host (the 1M two-GPU step; commit 8757b9f, docs/benchmarks.md)."""

    @staticmethod
    def forward(ctx, spans: Sequence[Sequence[Span]], D: int, *tables: Tensor):  # type: ignore[override]
        full = _padded_rows(tables, spans)
        C, M, F = full.shape
        ctx.spans, ctx.shape, ctx.table_rows = spans, (C, M, F, D), [t.shape[0] for t in tables]
        depths = full[..., 6 + D].contiguous()
        ctx.mark_non_differentiable(depths)
        return (full[..., 0:2].contiguous(), full[..., 2:5].contiguous(), full[..., 5 : 5 + D].contiguous(),
                full[..., 5 + D].contiguous(), depths)

    @staticmethod
    def backward(ctx, g_means2d, g_conics, g_colors, g_opacities, _g_depths):  # type: ignore[override]
        C, M, F, D = ctx.shape
        like = next((g for g in (g_means2d, g_conics, g_colors, g_opacities) if g is not None), None)
        if like is None:
            return (None, None, *(None for _ in ctx.table_rows))
        cols = [(g_means2d, 2), (g_conics, 3), (g_colors, D), (None if g_opacities is None else g_opacities[..., None], 1),
                (None, 1)]
        full = torch.cat([g if g is not None else like.new_zeros((C, M, w)) for g, w in cols], dim=-1).view(C * M, F)
        # each source's rows, in view order (its table is view-major), and where the group's start
        pieces: List[List[Tensor]] = [[] for _ in ctx.table_rows]
        first: List[int] = [0] * len(ctx.table_rows)
        for j, sp in enumerate(ctx.spans):
            row = j * M
            for s, a, c in sp:
                if c:
                    if not pieces[s]:
                        first[s] = a
                    pieces[s].append(full[row : row + c])
                row += c
        grads = []
        for s, n_rows in enumerate(ctx.table_rows):
            got = torch.cat(pieces[s]) if pieces[s] else full.new_zeros((0, F))
            if got.shape[0] == n_rows:
                grads.append(got)
            else:  # this group holds part of the source's rows (its views in consecutive order)
                grads.append(torch.nn.functional.pad(got, (0, 0, first[s], n_rows - first[s] - got.shape[0])))
        return (None, None, *grads)


def _padded_rows(tables: Sequence[Tensor], spans: Sequence[Sequence[Span]]) -> Tensor:
    """[C, M, ...]: view j's rows ``spans[j]`` of the per-source ``tables``, then zero rows up to the
    longest view's M (one zero block shared by every view, one cat)."""
    rows = [sum(c for _, _, c in sp) for sp in spans]
    M = max(rows)
    pad = tables[0].new_zeros((M - min(rows),) + tuple(tables[0].shape[1:]))
    pieces = []
    for j, sp in enumerate(spans):
        pieces += [tables[s][a : a + c] for s, a, c in sp if c]
        if rows[j] < M:
            pieces.append(pad[: M - rows[j]])
    return torch.cat(pieces).view((len(spans), M) + tuple(tables[0].shape[1:]))


def padded_view_fields(tables: Sequence[Tensor], radii: Sequence[Tensor], gids: Sequence[Tensor],
                       spans: Sequence[Sequence[Span]], num_channels: int) -> Tuple[Tuple[Tensor, ...], List[int]]:
    """The fused call's padded fields (``_PaddedViewFields``, differentiable wrt ``tables``) plus
    radii [C,M] (0 in the padding: in no tile's list) for the views ``spans``; and their row counts.
    Off the GPU the records' global-id order is asserted, as ``_records_in_gid_order`` does."""
    if not tables[0].is_cuda:
        for sp in spans:
            _out_of_gid_order(torch.cat([gids[s][a : a + c] for s, a, c in sp]), said_sorted=True)
    fields = _PaddedViewFields.apply(spans, num_channels, *tables)
    return (*fields, _padded_rows(radii, spans)), [sum(c for _, _, c in sp) for sp in spans]


def composite_records_fused_loss(
    means2d: Tensor,
    conics: Tensor,
    colors: Tensor,
    opacities: Tensor,
    depths: Tensor,
    radii: Tensor,
    gids: Tensor,
    width: int,
    height: int,
    gt: Tensor,
    background: Tensor,
    ssim_lambda: float = 0.2,
    tile_size: int = 16,
    absgrad_sink: Optional[List[Tensor]] = None,
    sorted_by_gid: bool = False,
    options: FusedOptions = DEFAULT_OPTIONS,
) -> Tuple[Tensor, Tensor]:
    """ONE view's records composited AND scored by the fused kernel: :func:`composite_views_fused_loss`
    of that view alone (``gt`` [H,W,3], ``background`` [3]). Returns (loss, rgb [H,W,3] detached); what
    ``splatfacto_loss`` of ``composite_records`` gives, with the same order and ``absgrad_sink``
    contract."""
    loss, rgb = composite_views_fused_loss(
        [(means2d, conics, colors, opacities, depths, radii, gids)], width, height, gt[None], background.reshape(1, 3),
        ssim_lambda, tile_size, None if absgrad_sink is None else [absgrad_sink], sorted_by_gid, options=options)
    return loss, rgb[0]


# ---------------------------------------------------------------------------------------------
# Single-process oracle: all Gaussians, all views, the public reference rasterizer


def single_process_loss(
    params: Mapping[str, Tensor],
    views: Views,
    sh_degree: Optional[int],
    loss_fn: LossFn = splatfacto_loss,
) -> Tuple[Tensor, Dict]:
    """Batch loss (mean over views) of one process holding every Gaussian, through
    ``bytesplat_ns.raster.rasterize(backend="reference")`` (independent of the sharded path)."""
    from bytesplat_ns.raster import rasterize

    render, alpha, info = rasterize(
        params["means"],
        params["quats"],
        torch.exp(params["scales"]),
        torch.sigmoid(params["opacities"]).squeeze(-1),
        gaussian_colors(params, sh_degree),
        views.viewmats,
        views.Ks,
        views.width,
        views.height,
        backend="reference",
        sh_degree=sh_degree,
    )
    B = views.num_views
    loss = render.new_zeros(())
    for b in range(B):
        rgb = rgb_with_background(render[b], alpha[b], views.backgrounds[b])
        loss = loss + loss_fn(rgb, views.images[b].to(rgb)) / B
    return loss, info


def single_process_step(
    params: Mapping[str, Tensor],
    optimizers: Mapping[str, torch.optim.Optimizer],
    views: Views,
    sh_degree: Optional[int],
    loss_fn: LossFn = splatfacto_loss,
) -> float:
    loss, _ = single_process_loss(params, views, sh_degree, loss_fn)
    loss.backward()
    _step_optimizers(params, optimizers)
    return float(loss.item())


def _step_optimizers(params: Mapping[str, Tensor], optimizers: Mapping[str, torch.optim.Optimizer]) -> None:
    for name, p in params.items():
        if p.grad is None:
            # Every Gaussian tensor takes part in the single-process graph, so it always has a
            # gradient (possibly all zero) and Adam advances its moments; keep that for empty work.
            p.grad = torch.zeros_like(p)
    for opt in optimizers.values():
        opt.step()
        opt.zero_grad(set_to_none=True)


# ---------------------------------------------------------------------------------------------
# The sharded step


# Binning all of a rank's views in one call holds every view's (Gaussian, tile) pairs at once: about
# 24 bytes each (keys and values, sorted copies). Above this share of the GPU's memory the views are
# scored in groups. On an H200 (11.5 GB): one group for the benchmarked 1M-16M Gaussians at 8 views
# (16M on one GPU: ~400M pairs, 9.6 GB), two for 62.5M Gaussians and 4 views (~19 GB at once,
# 4x one view's) and for 125M on two GPUs.
JOINT_BINNING_MEMORY_SHARE = 0.08
BINNING_BYTES_PER_INTERSECTION = 24


def joint_binning_budget(device: torch.device) -> Optional[int]:
    """Tile intersections one fused call may bin on ``device`` (None: no limit, off the GPU)."""
    if device.type != "cuda":
        return None
    total = torch.cuda.get_device_properties(device).total_memory
    return int(JOINT_BINNING_MEMORY_SHARE * total) // BINNING_BYTES_PER_INTERSECTION


def _view_groups(tiles: Optional[Sequence[int]], num_views: int, device: torch.device) -> List[List[int]]:
    """A rank's ``num_views`` views (by position) in consecutive groups whose tile intersections
    ``tiles`` add up to at most :func:`joint_binning_budget` (a group always takes at least one
    view); all in one group when the counts or the budget are unknown."""
    budget = None if tiles is None else joint_binning_budget(device)
    if budget is None:
        return [list(range(num_views))]
    groups: List[List[int]] = []
    total = 0
    for j, t in enumerate(tiles):
        if groups and total + t <= budget:
            groups[-1].append(j)
            total += t
        else:
            groups.append([j])
            total = t
    return groups


@dataclass
class _Runner:
    """Non-tensor state of one sharded forward/backward (held by the autograd Function)."""

    views: Views
    communicator: Communicator
    layout: ShardLayout
    loss_fn: LossFn
    stats: CommStats
    tile_size: int = 16
    absgrad: bool = False
    compositor: str = "reference"
    options: FusedOptions = DEFAULT_OPTIONS  # the fused compositor's switches
    # filled by forward
    sent_index: List[Tensor] = field(default_factory=list)
    leaves: List[Tensor] = field(default_factory=list)
    local_loss: Optional[Tensor] = None
    renders: Dict[int, Tensor] = field(default_factory=dict)
    num_channels: int = 3
    absgrad_slots: List[Tuple[List[Tuple[int, int, int]], List[Tensor]]] = field(default_factory=list)
    means2d_ref: Optional[Tensor] = None
    view_counts: List[List[int]] = field(default_factory=list)  # [rank][view]: records each rank sends per view
    view_tiles: Optional[List[List[int]]] = None  # [rank][view]: tiles those records reach (fused compositor)
    visible: Optional[Tensor] = None  # [B, n] bool: this rank's radius > 0, the mask view_counts counted


class _ShardedRenderLoss(torch.autograd.Function):
    @staticmethod
    def forward(ctx, runner: _Runner, means2d, conics, colors, opacities, depths, radii):  # type: ignore[override]
        group = runner.communicator.group
        rank, world = rank_and_world(group)
        views = runner.views
        B, n = radii.shape
        D = colors.shape[-1]
        runner.num_channels = D
        dtype = means2d.dtype
        offset = runner.layout.offsets[rank]
        if runner.layout.total >= 2**31:
            raise DistributedError(f"{runner.layout.total} Gaussians exceed the int32 global ids of the wire format.")
        owners_views = assign_views(B, world)

        # [B*n, F] table of detached records; culled entries are never sent.
        table = torch.cat([means2d, conics, colors, opacities[..., None], depths[..., None]], dim=-1).reshape(B * n, -1)
        # Every rank's records per view are known on the host (sharded_render_loss's one gather), so
        # the visible rows come from one nonzero of known size (no device read), view-major; each
        # rank's views are a contiguous block, so its rows are the next slice (one gather of rows,
        # radii and ids for every destination).
        sent_per_view = runner.view_counts[rank]
        flat_all = _nonzero_of_known_count(runner.visible.reshape(-1), sum(sent_per_view))
        rows_all = table.index_select(0, flat_all)
        radii_all = radii.reshape(-1).index_select(0, flat_all)
        gids_all = (flat_all % n + offset).to(torch.int32) if n > 0 else flat_all.to(torch.int32)
        outgoing: List[Records] = []
        runner.sent_index = []
        start = 0
        for d in range(world):
            stop = start + sum(sent_per_view[v] for v in owners_views[d])
            runner.sent_index.append(flat_all[start:stop])
            outgoing.append(Records(rows_all[start:stop], radii_all[start:stop], gids_all[start:stop]))
            start = stop
        mine = owners_views[rank]
        counts = [[runner.view_counts[s][v] for v in mine] for s in range(world)]  # [source][my view]
        received = runner.communicator.send_records(outgoing, D, counts, dtype, runner.stats)

        G = grad_columns(D)
        runner.leaves = [r.floats.detach().requires_grad_(True) for r in received]
        # view j's records: (source, first row, rows) in each source's table (view-major there)
        starts = [0] * world
        spans: List[List[Span]] = []
        for j in range(len(mine)):
            spans.append([(s, starts[s], counts[s][j]) for s in range(world)])
            starts = [a + counts[s][j] for s, a in enumerate(starts)]
        sinks: List[Optional[List[Tensor]]] = [[] if runner.absgrad else None for _ in mine]
        # (spans, sink) per view, to route absgrad back to the owners
        runner.absgrad_slots = [(sp, sk) for sp, sk in zip(spans, sinks)] if runner.absgrad else []
        radii_in = [r.radii for r in received]
        gids_in = [r.gids for r in received]
        with torch.enable_grad():
            loss = means2d.new_zeros(())
            lam = splatfacto_lambda(runner.loss_fn)
            fused_loss = runner.compositor == "fused" and lam is not None and D == 3
            tiles = None if runner.view_tiles is None else [sum(runner.view_tiles[s][v] for s in range(world)) for v in mine]
            for group in _view_groups(tiles if fused_loss else None, len(mine), means2d.device):
                if fused_loss and any(c for j in group for _, _, c in spans[j]):
                    # splatfacto's loss and its gradients inside the fused kernels (no image-sized
                    # intermediates, no pytorch_msssim graph), the group's views in one call
                    group_views = [mine[j] for j in group]
                    padded, rows = padded_view_fields(runner.leaves, radii_in, gids_in, [spans[j] for j in group], D)
                    loss_sum, rgb = _score_padded_views(
                        padded, rows, [None] * len(group), views.width, views.height,
                        torch.stack([views.images[v].to(padded[0]) for v in group_views]),
                        torch.stack([views.backgrounds[v].to(padded[0]) for v in group_views]), lam,
                        runner.tile_size, [sinks[j] for j in group] if runner.absgrad else None,
                        None if tiles is None else sum(tiles[j] for j in group), runner.options,
                    )
                    runner.renders.update(zip(group_views, rgb.unbind(0)))
                    loss = loss + loss_sum / B
                    continue
                for j in group:
                    v = mine[j]
                    rec = torch.cat([runner.leaves[s][a : a + c] for s, a, c in spans[j]], 0)
                    fields = (rec[:, 0:2], rec[:, 2:5], rec[:, 5 : 5 + D], rec[:, 5 + D], rec[:, 6 + D].detach(),
                              torch.cat([radii_in[s][a : a + c] for s, a, c in spans[j]]),
                              torch.cat([gids_in[s][a : a + c] for s, a, c in spans[j]]))
                    render, alpha = composite_records(*fields, views.width, views.height, runner.tile_size,
                                                      absgrad_sink=sinks[j], compositor=runner.compositor, sorted_by_gid=True,
                                                      options=runner.options)
                    rgb = rgb_with_background(render, alpha, views.backgrounds[v].to(render))
                    runner.renders[v] = rgb.detach()
                    loss = loss + runner.loss_fn(rgb, views.images[v].to(rgb)) / B
        runner.local_loss = loss
        ctx.runner = runner
        ctx.shape = (B, n, D, G)
        ctx.meta = (means2d.dtype, means2d.device)
        return loss.detach()

    @staticmethod
    def backward(ctx, grad_out):  # type: ignore[override]
        runner: _Runner = ctx.runner
        B, n, D, G = ctx.shape
        dtype, device = ctx.meta
        loss = runner.local_loss
        leaves = runner.leaves
        grads: List[Tensor] = []
        if loss is not None and loss.requires_grad:
            with torch.enable_grad():
                got = torch.autograd.grad(loss, leaves, grad_outputs=grad_out, allow_unused=True)
        else:
            got = [None] * len(leaves)
        width = G + 2 if runner.absgrad else G
        for leaf, g in zip(leaves, got):
            row = torch.zeros(leaf.shape[0], width, dtype=dtype, device=device)
            if g is not None:
                row[:, :G] = g[:, :G]
            grads.append(row)
        if runner.absgrad:
            # Two extra columns G, G+1 carry |dL/dmean2d| summed over pixels.
            for spans, sink in runner.absgrad_slots:
                if not sink:
                    continue
                a = sink[0]
                for s, first, count in spans:
                    grads[s][first : first + count, G:] += a[:count].to(dtype)
                    a = a[count:]
        buffer = torch.zeros(B * n, width, dtype=dtype, device=device)
        runner.communicator.return_gradients(grads, runner.sent_index, buffer, runner.stats)
        runner.leaves, runner.local_loss, runner.absgrad_slots = [], None, []  # free the renderer graph
        buffer = buffer.reshape(B, n, width)
        if runner.absgrad and runner.means2d_ref is not None:
            runner.means2d_ref.absgrad = buffer[..., G:].clone()
        return (
            None,
            buffer[..., 0:2],
            buffer[..., 2:5],
            buffer[..., 5 : 5 + D],
            buffer[..., 5 + D],
            None,
            None,
        )


@dataclass
class ShardedForward:
    """What ``sharded_render_loss`` returns: this rank's loss share (backward-able), the info dict
    ``DefaultStrategy`` reads (``means2d`` retains its gradient), the rendered views and stats."""

    local_loss: Tensor
    info: Dict
    renders: Dict[int, Tensor]
    stats: CommStats
    layout: ShardLayout


def sharded_render_loss(
    params: Mapping[str, Tensor],
    views: Views,
    communicator: Communicator,
    sh_degree: Optional[int],
    loss_fn: LossFn = splatfacto_loss,
    *,
    tile_size: int = 16,
    absgrad: bool = False,
    compositor: str = "reference",
    options: FusedOptions = DEFAULT_OPTIONS,
) -> ShardedForward:
    """Forward of one sharded step (collective). ``.local_loss.backward()`` runs the exchange of
    gradients and the owner's backward; the caller then steps its optimizers. With ``absgrad``
    the backward also sets ``info["means2d"].absgrad`` [B,n,2] (gsplat's densification statistic),
    carried back in two extra gradient columns of the wire format. ``compositor``: see
    ``composite_records``; ``options``: the fused rasterizer's switches (projection included)."""
    stats = CommStats()
    meta = ExchangeStats()
    proj = project_shard(params, views, sh_degree, projection=options.projection)
    proj.means2d.retain_grad()
    visible = proj.radii > 0
    tiles = None
    if compositor == "fused" and proj.means2d.dtype == torch.float32:
        # the renderers' binning sizes ride on the one gather (records travel bit for bit, so the
        # renderer's binning counts what the sender counted)
        from bytesplat_ns.raster.fused import tile_intersections, tile_radii

        # the renderers bin the records they receive with the same reach (tile_radii of the same values)
        tiles = tile_intersections(proj.means2d, tile_radii(proj.radii, proj.conics, proj.opacities, options),
                                   views.width, views.height, tile_size, options.binning)
    layout, view_counts, view_tiles = gather_layout_and_view_counts(visible, communicator.group, meta, tiles)
    stats.meta_bytes += meta.meta_bytes
    runner = _Runner(views, communicator, layout, loss_fn, stats, tile_size, absgrad, compositor, options)
    runner.means2d_ref = proj.means2d
    runner.view_counts, runner.view_tiles, runner.visible = view_counts, view_tiles, visible
    local_loss = _ShardedRenderLoss.apply(runner, proj.means2d, proj.conics, proj.colors, proj.opacities, proj.depths, proj.radii)
    info = {
        "means2d": proj.means2d,
        "radii": proj.radii,
        "depths": proj.depths,
        "conics": proj.conics,
        "width": views.width,
        "height": views.height,
        "n_cameras": views.num_views,
        "tile_size": tile_size,
        "camera_ids": None,
        "gaussian_ids": None,
    }
    return ShardedForward(local_loss, info, runner.renders, stats, layout)


@dataclass
class StepResult:
    loss: float  # the batch loss (all ranks' shares summed)
    stats: CommStats
    info: Dict
    layout: ShardLayout


def distributed_step(
    params: Mapping[str, Tensor],
    optimizers: Mapping[str, torch.optim.Optimizer],
    views: Views,
    communicator: Communicator,
    sh_degree: Optional[int],
    loss_fn: LossFn = splatfacto_loss,
) -> StepResult:
    """One full sharded training step (collective): forward, backward, optimizer step."""
    fwd = sharded_render_loss(params, views, communicator, sh_degree, loss_fn)
    fwd.local_loss.backward()
    _step_optimizers(params, optimizers)
    total = fwd.local_loss.detach().clone().reshape(1).to(torch.float64)
    meta = ExchangeStats()
    all_reduce_(total, group=communicator.group, stats=meta, phase="summing the batch loss")
    fwd.stats.meta_bytes += meta.meta_bytes
    return StepResult(float(total.item()), fwd.stats, fwd.info, fwd.layout)


# splatfacto's initial learning rates per parameter (means: its final-scene-scale value), for the
# sharded steps driven outside nerfstudio's trainer (benchmarks, tests).
SPLATFACTO_LRS = {
    "means": 1.6e-4,
    "features_dc": 0.0025,
    "features_rest": 0.0025 / 20,
    "opacities": 0.05,
    "scales": 0.005,
    "quats": 0.001,
}


def make_adam_optimizers(
    params: Mapping[str, Tensor],
    lrs: Mapping[str, float],
    batch_size: int,
    betas: Tuple[float, float] = (0.9, 0.999),
    eps: float = 1e-15,
) -> Dict[str, torch.optim.Optimizer]:
    """One Adam per parameter (nerfstudio's layout), learning rates and betas scaled for the batch;
    on the GPU optim.DeviceAdam's kernel (also no parameter-sized temporaries, which count at 100M)."""
    from bytesplat_ns.optim import DeviceAdam

    out = {}
    for name, p in params.items():
        lr, b = scale_adam_for_batch(lrs[name], betas, batch_size)
        out[name] = DeviceAdam([p], lr=lr, betas=b, eps=eps)
    return out
