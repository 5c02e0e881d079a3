"""The ``pixel`` exchange (Splaxel; docs/design.md, "Distributed design"): ranks exchange partial images, not Gaussians.

Each rank holds the Gaussians of its spatial cells (``cells.KdCells``, one or more per rank). Per
step, for a batch of B views:

1. every rank renders each of its cells into a partial, premultiplied color ``C_k`` [B,H,W,D] and
   transmittance ``T_k = 1 - alpha_k`` [B,H,W] (no background), with the ``renderer``: ``reference``
   (PyTorch, autograd, any device) or ``fused`` (bytesplat's CUDA tile rasterizer: projection, tile
   binning, ``_RasterizeFused``, whose render without background IS the partial color and whose
   alpha is ``1 - T_k``; its backward takes ``dL/dC_k`` and ``dL/dalpha = -dL/dT_k``; CUDA, RGB only);
   ``auto``: fused on CUDA, reference elsewhere;
2. the partials go to the view's compositing rank (``schedule.schedule_views``), which composites
   them in the cells' visibility order for that camera (``KdCells.visibility_order``)::

       C = C_1 + T_1 C_2 + T_1 T_2 C_3 + ... ,   image = clamp(C + T_1 T_2 ... T_K bg, 0, 1)

   with the renderer's stop rule at cell granularity: a cell contributes to a pixel only while the
   transmittance in front of it, ``T_front = prod_{j<k} T_j``, is above ``T_MIN = 1e-4`` (the
   reference stops a pixel before the Gaussian that takes T to <= 1e-4). A cell that does not
   contribute leaves ``T_front`` unchanged;
3. the loss of each view is computed on its compositing rank; in the backward that rank sends
   ``dL/dC_k`` and ``dL/dT_k`` to each cell's rank, which backpropagates them through its local
   render. All of this runs inside one ``torch.autograd.Function`` (``_PixelExchange``) whose
   forward returns this rank's share of the batch loss, so a trainer's ``loss.backward()`` drives
   the backward exchange.

Exactness: when no Gaussian's footprint crosses a cell border, along every ray all Gaussians of a
cell come before all Gaussians of the next cell in visibility order and the composite equals one
process's render (up to float rounding, and up to the stop rule: where the transmittance of a
pixel crosses 1e-4 INSIDE a cell other than the first, one process stops inside that cell while
the composite stops after it). Where footprints cross borders, a Gaussian is blended with the other
cells' Gaussians in cell order instead of depth order: see docs/pixel_exchange.md for the tested
tolerance.

Exchange pruning (``PixelConfig``), each switchable:

- geometric visibility (``geometric``): a cell's partial is sent only inside its projected
  bounding rectangle: the 8 corners of the box bounding its Gaussians' footprints
  (mean +- 3.5 max scale) are projected into the view, widened by ``margin_px`` (the 2D blur),
  and clamped to the image (the whole image when a corner is behind the near plane). The rendered
  partial is checked against that prediction: pixels outside it that the cell does touch (a
  projection-linearisation corner case) are added to the rectangle and counted as ``leaked_pixels``,
  so the pruning never changes the image. Each message carries its rectangle (4 int32).
- transmittance prediction (``transmittance``): the compositing rank first receives the ``T_k``
  rectangles only, computes ``T_front`` for every cell in visibility order, and returns a bit mask
  per (view, cell) of the pixels where the cell still contributes (``T_front > threshold``); the
  cells then send ``C_k`` only there, and the backward returns gradients only there. With
  ``threshold = T_MIN`` this drops exactly the pixels the composite's stop rule ignores, so the
  image and gradients are bit-identical to the unpruned exchange; a larger threshold also drops
  pixels with ``T_front`` in (1e-4, threshold], changing each by at most ``threshold`` times the
  color behind.

Devices: every tensor of the step stays on the device of the rank's Gaussians (the CPU with gloo,
``cuda:LOCAL_RANK`` with NCCL); the messages of the exchange are moved to the process group's
device (``exchange.comm_device``: the GPU for NCCL, the CPU for gloo) and back. The collectives
used are NCCL-safe: ``all_reduce`` (cell bounds, batch loss), ``all_gather`` (message sizes) and
``batch_isend_irecv`` (the exchange; gloo gets a loop of isend/irecv).

Bytes (``PixelStats``, what THIS rank put on the wire to other ranks): ``forward_bytes``
(rectangles, partials, and the masks it returns as a compositing rank), ``backward_bytes``
(gradients it returns as a compositing rank), ``meta_bytes`` (size exchanges, the cells' bounds);
``unpruned_bytes`` is what the same exchange would send with no pruning (full images of C and T
both ways), ``saved_geometric_bytes``/``saved_transmittance_bytes`` what each pruning saved.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import asdict, dataclass, field
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor

from bytesplat_ns.distributed.cells import KdCells, content_bounds, gaussian_extent
from bytesplat_ns.distributed.exchange import ExchangeStats, all_reduce_, comm_device, exchange, nbytes, pack, rank_and_world, unpack
from bytesplat_ns.distributed.schedule import ScheduleReport, schedule_views
from bytesplat_ns.distributed.step import (
    Views,
    _step_optimizers,
    assign_views,
    gaussian_colors,
    splatfacto_loss,
)
from bytesplat_ns.raster.options import DEFAULT_OPTIONS, FusedOptions
from bytesplat_ns.raster.projection import camera_centers
from bytesplat_ns.errors import BytesplatError
from bytesplat_ns.raster.reference import T_MIN

LossFn = Callable[[Tensor, Tensor], Tensor]
LOG = logging.getLogger("bytesplat.pixel")
RECT_DTYPE = torch.int32
RECT_BYTES = 4 * 4
EMPTY = (0, 0, 0, 0)
RENDERERS = ("reference", "fused")


def resolve_renderer(name: str, device: torch.device) -> str:
    """``auto`` -> ``fused`` on CUDA, ``reference`` elsewhere; checks that the choice runs on ``device``."""
    if name == "auto":
        return "fused" if device.type == "cuda" else "reference"
    if name not in RENDERERS:
        raise BytesplatError(f"Unknown pixel-exchange cell renderer '{name}'; choose auto, {', '.join(RENDERERS)}.")
    if name == "fused" and device.type != "cuda":
        raise BytesplatError(
            f"The fused cell renderer needs CUDA tensors, but the Gaussians are on '{device}'.",
            hint="Use --pipeline.compositor reference (or auto) on the CPU.",
        )
    return name


@dataclass
class PixelConfig:
    geometric: bool = True
    """Send only the pixels inside each cell's projected bounding rectangle."""
    transmittance: bool = False
    """Send colors and gradients only where the transmittance in front of the cell is above ``threshold``."""
    threshold: float = T_MIN
    """Transmittance-prediction threshold (>= 1e-4, the renderer's own stop)."""
    margin_px: float = 2.0
    """Widening of the projected rectangle in pixels (covers the 0.3 px^2 2D blur)."""
    schedule: bool = True
    """Balanced, locality-aware view-to-rank assignment (``schedule.py``); False: contiguous blocks."""
    fused: FusedOptions = DEFAULT_OPTIONS
    """The fused renderer's switches (the model's ``fused`` config)."""
    measure_time: bool = True
    """Measure render and idle seconds (``PixelStats``), which waits for the device around the
    render and each exchange; the pipeline asks for it on the steps it logs only."""


@dataclass
class PixelStats:
    forward_bytes: int = 0
    backward_bytes: int = 0
    meta_bytes: int = 0
    unpruned_bytes: int = 0
    geometric_bytes: int = 0  # what the exchange would send with geometric pruning only
    saved_geometric_bytes: int = 0
    saved_transmittance_bytes: int = 0
    leaked_pixels: int = 0
    sent_pixels: int = 0  # remote (view, cell) pixels whose color went on the wire
    render_s: float = 0.0
    composite_s: float = 0.0
    wait_s: float = 0.0  # seconds blocked in exchanges (forward + backward): this rank's idle time

    def as_dict(self) -> Dict[str, float]:
        return asdict(self)

    def log_line(self, rank: int) -> str:
        return (
            f"pixel rank {rank}: sent fwd {self.forward_bytes} B bwd {self.backward_bytes} B meta {self.meta_bytes} B; "
            f"unpruned {self.unpruned_bytes} B, saved geometric {self.saved_geometric_bytes} B, "
            f"saved transmittance {self.saved_transmittance_bytes} B; leaked px {self.leaked_pixels}; "
            f"render {self.render_s:.3f}s composite {self.composite_s:.3f}s idle (waiting) {self.wait_s:.3f}s"
        )


@dataclass
class CellState:
    """What a rank holds about the cells: the shared tree, each cell's rank, its own rows' cells."""

    tree: KdCells
    ranks_of_cells: List[int]
    cell_of: Tensor  # [n_local] cell id of each local Gaussian

    def my_cells(self, rank: int) -> List[int]:
        return [c for c, r in enumerate(self.ranks_of_cells) if r == rank]


# ---------------------------------------------------------------------------------------------
# Geometry


def project_box_rect(lo: Sequence[float], hi: Sequence[float], viewmat: Tensor, K: Tensor, width: int, height: int,
                     margin_px: float, near_plane: float = 0.01) -> Tuple[int, int, int, int]:
    """Pixel rectangle (x0, y0, x1, y1), max exclusive, covering the projection of box [lo, hi]."""
    if any(not math.isfinite(float(v)) for v in list(lo) + list(hi)) or any(float(a) > float(b) for a, b in zip(lo, hi)):
        return EMPTY
    lo_t = torch.tensor([float(v) for v in lo], dtype=torch.float64)
    hi_t = torch.tensor([float(v) for v in hi], dtype=torch.float64)
    sel = torch.tensor([[i >> 2 & 1, i >> 1 & 1, i & 1] for i in range(8)], dtype=torch.bool)
    corners = torch.where(sel, hi_t, lo_t)  # [8,3]
    Vm = viewmat.detach().to(torch.float64).cpu()
    Km = K.detach().to(torch.float64).cpu()
    cam = corners @ Vm[:3, :3].T + Vm[:3, 3]
    z = cam[:, 2]
    if bool((z <= near_plane).any()):
        if bool((z <= near_plane).all()):
            return EMPTY
        return (0, 0, width, height)
    u = Km[0, 0] * cam[:, 0] / z + Km[0, 2]
    v = Km[1, 1] * cam[:, 1] / z + Km[1, 2]
    x0 = max(0, int(math.floor(float(u.min()) - margin_px)))
    x1 = min(width, int(math.ceil(float(u.max()) + margin_px)))
    y0 = max(0, int(math.floor(float(v.min()) - margin_px)))
    y1 = min(height, int(math.ceil(float(v.max()) + margin_px)))
    if x1 <= x0 or y1 <= y0:
        return EMPTY
    return (x0, y0, x1, y1)


def _area(r: Tuple[int, int, int, int]) -> int:
    return max(0, r[2] - r[0]) * max(0, r[3] - r[1])


def _union(a: Tuple[int, int, int, int], b: Tuple[int, int, int, int]) -> Tuple[int, int, int, int]:
    if _area(a) == 0:
        return b
    if _area(b) == 0:
        return a
    return (min(a[0], b[0]), min(a[1], b[1]), max(a[2], b[2]), max(a[3], b[3]))


def _nonzero_rect(C: Tensor, T: Tensor) -> Tuple[int, int, int, int]:
    """Bounding rectangle of the pixels a partial render touches (C != 0 or T != 1)."""
    nz = (T != 1.0) | (C != 0).any(-1)
    if not bool(nz.any()):
        return EMPTY
    rows = torch.nonzero(nz.any(1)).squeeze(1)
    cols = torch.nonzero(nz.any(0)).squeeze(1)
    return (int(cols[0]), int(rows[0]), int(cols[-1]) + 1, int(rows[-1]) + 1)


def _count_outside(C: Tensor, T: Tensor, r: Tuple[int, int, int, int]) -> int:
    nz = (T != 1.0) | (C != 0).any(-1)
    total = int(nz.sum())
    if _area(r) == 0:
        return total
    return total - int(nz[r[1] : r[3], r[0] : r[2]].sum())


def _empty_msg(device: torch.device) -> Tensor:
    return torch.empty(0, dtype=torch.uint8, device=device)


def pack_bits(mask: Tensor) -> Tensor:
    """[n] bool -> [ceil(n/8)] uint8 (little bit order)."""
    n = mask.numel()
    pad = (-n) % 8
    m = torch.cat([mask.reshape(-1).to(torch.uint8), torch.zeros(pad, dtype=torch.uint8, device=mask.device)])
    w = torch.tensor([1, 2, 4, 8, 16, 32, 64, 128], dtype=torch.uint8, device=mask.device)
    return (m.reshape(-1, 8) * w).sum(1).to(torch.uint8)


def unpack_bits(bits: Tensor, n: int) -> Tensor:
    w = torch.tensor([1, 2, 4, 8, 16, 32, 64, 128], dtype=torch.uint8, device=bits.device)
    return ((bits[:, None] & w) != 0).reshape(-1)[:n]


# ---------------------------------------------------------------------------------------------
# The exchange as an autograd Function


@dataclass
class _Runner:
    views: Views
    cells: CellState
    config: PixelConfig
    loss_fn: LossFn
    stats: PixelStats
    views_of_rank: List[List[int]]
    my_cells: List[int]
    rects: Dict[Tuple[int, int], Tuple[int, int, int, int]]  # (view, my cell) -> rect sent
    orders: List[List[int]]  # visibility order per view
    group: object = None
    num_channels: int = 3
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))  # the rank's compute device
    # filled by forward (compositing side)
    leaves: Dict[Tuple[int, int], Dict] = field(default_factory=dict)  # (view, cell) -> {rect, T, C, kidx}
    masks_mine: Dict[Tuple[int, int], Optional[Tensor]] = field(default_factory=dict)  # (view, my cell) -> kept idx (T mode)
    masks: Dict[Tuple[int, int], Tensor] = field(default_factory=dict)  # (view, cell) -> contributing pixels (compositing side)
    local_loss: Optional[Tensor] = None
    renders: Dict[int, Tensor] = field(default_factory=dict)


def _wire_device(runner: _Runner) -> torch.device:
    """Where messages live for the exchange: the process group's device (cuda for NCCL, the CPU for
    gloo); with one process nothing moves."""
    _, world = rank_and_world(runner.group)
    return runner.device if world == 1 else comm_device(runner.group)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timed_exchange(runner: _Runner, send, sizes, phase: str, counter: str) -> List[Tensor]:
    ex = ExchangeStats()
    wire = _wire_device(runner)
    send = [m.to(wire) for m in send]
    # Waiting is measured on the host: queued GPU work (the render) is finished before the clock starts,
    # and NCCL's asynchronous waits are finished before it stops (the exchange itself is stream-ordered).
    timed = runner.config.measure_time
    if timed:
        _sync(runner.device)
        _sync(wire)
    t0 = time.perf_counter()
    out = exchange(send, sizes, runner.group, ex, phase=phase)
    if timed:
        _sync(wire)
        runner.stats.wait_s += time.perf_counter() - t0
    out = [m.to(runner.device) for m in out]
    setattr(runner.stats, counter, getattr(runner.stats, counter) + ex.payload_bytes)
    runner.stats.meta_bytes += ex.meta_bytes
    return out


class _PixelExchange(torch.autograd.Function):
    @staticmethod
    def forward(ctx, runner: _Runner, anchor, *partials):  # type: ignore[override]
        rank, world = rank_and_world(runner.group)
        views, cfg, st = runner.views, runner.config, runner.stats
        H, W = views.height, views.width
        D = runner.num_channels
        ranks_of = runner.cells.ranks_of_cells
        mine = runner.my_cells
        dev = runner.device
        C_in = {c: partials[2 * i].detach() for i, c in enumerate(mine)}
        T_in = {c: partials[2 * i + 1].detach() for i, c in enumerate(mine)}
        dtype = anchor.dtype
        item = nbytes(dtype)
        cells_of = [[c for c, r in enumerate(ranks_of) if r == s] for s in range(world)]
        tmode = cfg.transmittance
        thr = max(float(cfg.threshold), T_MIN) if tmode else T_MIN

        def crop(x: Tensor, r) -> Tensor:
            return x[r[1] : r[3], r[0] : r[2]]

        # ---- phase 1: rectangles + T (+ C unless transmittance prediction) to compositing ranks
        send = []
        for d in range(world):
            heads, bodies = [], []
            for v in runner.views_of_rank[d]:
                for c in mine:
                    r = runner.rects[(v, c)]
                    heads.append(list(r))
                    if not tmode:
                        bodies.append(crop(C_in[c][v], r).reshape(-1))
                    bodies.append(crop(T_in[c][v], r).reshape(-1))
            send.append(pack([torch.tensor(heads, dtype=RECT_DTYPE, device=dev)] + bodies) if heads else _empty_msg(dev))
        recv = _timed_exchange(runner, send, None, "pixel exchange: partial images", "forward_bytes")
        runner.leaves = {}
        for s in range(world):
            msg = recv[s]
            nvc = len(runner.views_of_rank[rank]) * len(cells_of[s])
            if nvc == 0:
                continue
            (heads,) = unpack(msg[: nvc * RECT_BYTES], [(RECT_DTYPE, (nvc, 4))])
            rects = [tuple(int(x) for x in h) for h in heads.tolist()]
            specs = []
            for r in rects:
                a = _area(r)
                h, w = r[3] - r[1], r[2] - r[0]
                if not tmode:
                    specs.append((dtype, (max(h, 0), max(w, 0), D) if a else (0, 0, D)))
                specs.append((dtype, (max(h, 0), max(w, 0)) if a else (0, 0)))
            body = unpack(msg[nvc * RECT_BYTES :], specs)
            i = j = 0
            for v in runner.views_of_rank[rank]:
                for c in cells_of[s]:
                    entry = {"rect": rects[i]}
                    if not tmode:
                        entry["C"] = body[j].detach().clone().requires_grad_(True)
                        j += 1
                    entry["T"] = body[j].detach().clone().requires_grad_(True)
                    j += 1
                    runner.leaves[(v, c)] = entry
                    i += 1

        # ---- masks: where each cell still contributes (T_front above the threshold)
        t0 = time.perf_counter()
        masks: Dict[Tuple[int, int], Tensor] = {}
        with torch.no_grad():
            for v in runner.views_of_rank[rank]:
                Tf = torch.ones(H, W, dtype=dtype, device=dev)
                for c in runner.orders[v]:
                    e = runner.leaves[(v, c)]
                    r = e["rect"]
                    if _area(r) == 0:
                        continue
                    tf = crop(Tf, r)
                    m = tf > thr
                    masks[(v, c)] = m
                    Tf[r[1] : r[3], r[0] : r[2]] = tf * torch.where(m, e["T"].detach(), torch.ones_like(tf))
        st.composite_s += time.perf_counter() - t0

        if tmode:
            # ---- phase 2: masks back to the cells' ranks; phase 3: colors where kept
            send = []
            for d in range(world):
                bits = [pack_bits(masks[(v, c)]) for v in runner.views_of_rank[rank] for c in cells_of[d] if (v, c) in masks]
                send.append(pack(bits) if bits else _empty_msg(dev))
            sizes = []
            for s in range(world):
                sizes.append(sum((_area(runner.rects[(v, c)]) + 7) // 8 for v in runner.views_of_rank[s] for c in mine))
            recv = _timed_exchange(runner, send, sizes, "pixel exchange: transmittance masks", "forward_bytes")
            runner.masks_mine = {}
            for s in range(world):
                off = 0
                for v in runner.views_of_rank[s]:
                    for c in mine:
                        a = _area(runner.rects[(v, c)])
                        if a == 0:
                            runner.masks_mine[(v, c)] = None
                            continue
                        nb = (a + 7) // 8
                        runner.masks_mine[(v, c)] = torch.nonzero(unpack_bits(recv[s][off : off + nb], a)).squeeze(1)
                        off += nb
            send = []
            for d in range(world):
                bodies = []
                for v in runner.views_of_rank[d]:
                    for c in mine:
                        k = runner.masks_mine[(v, c)]
                        if k is None:
                            continue
                        bodies.append(crop(C_in[c][v], runner.rects[(v, c)]).reshape(-1, D).index_select(0, k).reshape(-1))
                send.append(pack(bodies) if bodies else _empty_msg(dev))
            kept = {key: int(m.sum()) for key, m in masks.items()}  # read once: the sizes and the sent-pixel count
            sizes = []
            for s in range(world):
                sizes.append(sum(kept[(v, c)] * D * item for v in runner.views_of_rank[rank] for c in cells_of[s] if (v, c) in masks))
            recv = _timed_exchange(runner, send, sizes, "pixel exchange: kept colors", "forward_bytes")
            for s in range(world):
                specs, keys = [], []
                for v in runner.views_of_rank[rank]:
                    for c in cells_of[s]:
                        if (v, c) in masks:
                            kidx = torch.nonzero(masks[(v, c)].reshape(-1)).squeeze(1)
                            runner.leaves[(v, c)]["kidx"] = kidx
                            specs.append((dtype, (int(kidx.numel()), D)))
                            keys.append((v, c))
                for (v, c), t in zip(keys, unpack(recv[s], specs)):
                    runner.leaves[(v, c)]["C"] = t.detach().clone().requires_grad_(True)

        # ---- differentiable composite and loss of this rank's views
        t0 = time.perf_counter()
        B = views.num_views
        with torch.enable_grad():
            loss = anchor.new_zeros(())
            for v in runner.views_of_rank[rank]:
                Cacc = torch.zeros(H, W, D, dtype=dtype, device=dev)
                Tf = torch.ones(H, W, 1, dtype=dtype, device=dev)
                for c in runner.orders[v]:
                    e = runner.leaves[(v, c)]
                    r = e["rect"]
                    if _area(r) == 0:
                        continue
                    h, w = r[3] - r[1], r[2] - r[0]
                    if tmode:
                        Ck = torch.zeros(h * w, D, dtype=dtype, device=dev).index_copy(0, e["kidx"], e["C"]).reshape(h, w, D)
                    else:
                        Ck = e["C"]
                    pad = (r[0], W - r[2], r[1], H - r[3])
                    m = F.pad(masks[(v, c)].to(dtype)[None], pad, value=0.0)[0][..., None]
                    Tk = F.pad(e["T"][None], pad, value=1.0)[0][..., None]
                    Ck = F.pad(Ck.permute(2, 0, 1), pad, value=0.0).permute(1, 2, 0)
                    Cacc = Cacc + Tf * Ck * m
                    Tf = Tf * (m * Tk + (1.0 - m))
                rgb = torch.clamp(Cacc + Tf * views.backgrounds[v].to(Cacc), 0.0, 1.0)
                runner.renders[v] = rgb.detach()
                loss = loss + runner.loss_fn(rgb, views.images[v].to(rgb)) / B
        st.composite_s += time.perf_counter() - t0
        runner.local_loss = loss
        runner.masks = masks
        ctx.runner = runner
        ctx.shapes = [(tuple(p.shape), p.dtype) for p in partials]
        ctx.dtype = dtype

        # ---- accounting (bytes this rank sends, remote only)
        full = H * W * (D + 1) * item
        for d in range(world):
            if d == rank:
                continue
            for v in runner.views_of_rank[d]:
                for c in mine:  # forward as a cell's rank
                    a = _area(runner.rects[(v, c)])
                    st.unpruned_bytes += full + RECT_BYTES
                    st.geometric_bytes += a * (D + 1) * item + RECT_BYTES
            for v in runner.views_of_rank[rank]:
                for c in cells_of[d]:  # backward as the compositing rank
                    a = _area(runner.leaves[(v, c)]["rect"])
                    st.unpruned_bytes += full
                    st.geometric_bytes += a * (D + 1) * item
                    if tmode and (v, c) in masks:
                        st.sent_pixels += kept[(v, c)]
                    elif not tmode:
                        st.sent_pixels += a
        return loss.detach()

    @staticmethod
    def backward(ctx, grad_out):  # type: ignore[override]
        runner: _Runner = ctx.runner
        rank, world = rank_and_world(runner.group)
        cfg, st = runner.config, runner.stats
        tmode = cfg.transmittance
        D = runner.num_channels
        ranks_of = runner.cells.ranks_of_cells
        cells_of = [[c for c, r in enumerate(ranks_of) if r == s] for s in range(world)]
        mine = runner.my_cells
        keys = [k for k in runner.leaves]
        tensors = []
        for k in keys:
            e = runner.leaves[k]
            if _area(e["rect"]):
                tensors += [e["C"], e["T"]]
        loss = runner.local_loss
        grads: Dict[int, Optional[Tensor]] = {}
        if tensors and loss is not None and loss.requires_grad:
            with torch.enable_grad():
                got = torch.autograd.grad(loss, tensors, grad_outputs=grad_out, allow_unused=True)
            for t, g in zip(tensors, got):
                grads[id(t)] = g

        def g_of(t: Tensor) -> Tensor:
            g = grads.get(id(t))
            return torch.zeros_like(t) if g is None else g

        # compositing side: gradients back to each cell's rank
        send = []
        for d in range(world):
            bodies = []
            for v in runner.views_of_rank[rank]:
                for c in cells_of[d]:
                    e = runner.leaves[(v, c)]
                    if _area(e["rect"]) == 0:
                        continue
                    gC, gT = g_of(e["C"]), g_of(e["T"])
                    if tmode:
                        bodies += [gC.reshape(-1), gT.reshape(-1).index_select(0, e["kidx"])]
                    else:
                        bodies += [gC.reshape(-1), gT.reshape(-1)]
            send.append(pack(bodies) if bodies else _empty_msg(runner.device))
        dtype = ctx.dtype
        item = nbytes(dtype)
        sizes = []
        for s in range(world):
            n = 0
            for v in runner.views_of_rank[s]:
                for c in mine:
                    a = _area(runner.rects[(v, c)])
                    if a == 0:
                        continue
                    k = int(runner.masks_mine[(v, c)].numel()) if tmode else a
                    n += k * (D + 1) * item
            sizes.append(n)
        recv = _timed_exchange(runner, send, sizes, "pixel exchange: partial-image gradients", "backward_bytes")
        # cell side: scatter into full-size gradients of this rank's partials
        out: List[Optional[Tensor]] = [None, None]
        gdev = runner.device
        gfull = {c: (torch.zeros(ctx.shapes[2 * i][0], dtype=dtype, device=gdev), torch.zeros(ctx.shapes[2 * i + 1][0], dtype=dtype, device=gdev))
                 for i, c in enumerate(mine)}
        for s in range(world):
            specs, slots = [], []
            for v in runner.views_of_rank[s]:
                for c in mine:
                    r = runner.rects[(v, c)]
                    a = _area(r)
                    if a == 0:
                        continue
                    k = int(runner.masks_mine[(v, c)].numel()) if tmode else a
                    specs += [(dtype, (k, D)), (dtype, (k,))]
                    slots.append((v, c, r))
            parts = unpack(recv[s], specs)
            for i, (v, c, r) in enumerate(slots):
                gC, gT = parts[2 * i], parts[2 * i + 1]
                h, w = r[3] - r[1], r[2] - r[0]
                Cv = gfull[c][0][v, r[1] : r[3], r[0] : r[2]].reshape(h * w, D)
                Tv = gfull[c][1][v, r[1] : r[3], r[0] : r[2]].reshape(h * w)
                if tmode:
                    idx = runner.masks_mine[(v, c)]
                    Cv = Cv.index_copy(0, idx, gC)
                    Tv = Tv.index_copy(0, idx, gT)
                else:
                    Cv, Tv = gC, gT
                gfull[c][0][v, r[1] : r[3], r[0] : r[2]] = Cv.reshape(h, w, D)
                gfull[c][1][v, r[1] : r[3], r[0] : r[2]] = Tv.reshape(h, w)
        for c in mine:
            out += [gfull[c][0], gfull[c][1]]
        # accounting of what the pruning saved (now that the backward is known)
        if cfg.geometric:
            st.saved_geometric_bytes = st.unpruned_bytes - st.geometric_bytes
        base = st.geometric_bytes if cfg.geometric else st.unpruned_bytes
        if tmode:
            st.saved_transmittance_bytes = base - (st.forward_bytes + st.backward_bytes)
        runner.leaves, runner.local_loss = {}, None
        return tuple(out)


# ---------------------------------------------------------------------------------------------
# Public entry points


@dataclass
class PixelForward:
    local_loss: Tensor  # this rank's share of the batch loss (backward() runs the exchange)
    renders: Dict[int, Tensor]  # composited images of this rank's views
    stats: PixelStats
    schedule: ScheduleReport
    rects: Dict[Tuple[int, int], Tuple[int, int, int, int]]
    masks: Dict[Tuple[int, int], Tensor] = field(default_factory=dict)
    infos: Dict[int, Dict] = field(default_factory=dict)
    """Per cell of this rank: the renderer's info of its partial render (``means2d`` [B,n_cell,2]
    retains its gradient, ``radii`` [B,n_cell]), rows in the cell's order (``rows``): what
    gsplat's densification strategy reads."""


def render_cell(params: Mapping[str, Tensor], rows: Tensor, views: Views, sh_degree: Optional[int],
                absgrad: bool = False, with_info: bool = False, renderer: str = "reference",
                fused_options: FusedOptions = DEFAULT_OPTIONS):
    """Partial render of the Gaussians ``rows`` of ``params``: (C [B,H,W,D] premultiplied, T [B,H,W]),
    and with ``with_info`` the renderer's info dict (``means2d`` retains its gradient).

    ``renderer``: ``reference`` (``rasterize_reference``, autograd, any device) or ``fused`` (CUDA:
    ``fused.project`` with gsplat's CUDA projection when importable, else the torch one; ``bin_tiles``;
    ``_RasterizeFused`` without background, whose outputs are exactly (C_k, 1 - T_k) and whose backward
    takes dL/dC_k and dL/dalpha_k = -dL/dT_k). Same projection settings (near 0.01, far 1e10, 2D blur
    0.3) and the same per-pixel rules (gsplat's) in both. ``fused_options``: the fused renderer's switches."""
    B, H, W = views.num_views, views.height, views.width
    dev = params["means"].device
    renderer = resolve_renderer(renderer, dev)
    rows = rows.to(dev)
    sub = {k: v.index_select(0, rows) for k, v in params.items()}
    colors = gaussian_colors(sub, sh_degree)
    args = (sub["means"], sub["quats"], torch.exp(sub["scales"]), torch.sigmoid(sub["opacities"]).squeeze(-1), colors,
            views.viewmats.to(dev), views.Ks.to(dev), W, H)
    if renderer == "fused" and colors.shape[-1] != 3:
        raise BytesplatError(f"The fused cell renderer renders RGB only, got {colors.shape[-1]} color channels.",
                             hint="Use --pipeline.compositor reference.")
    from bytesplat_ns.raster import rasterize

    render, alpha, info = rasterize(*args, backend=renderer, sh_degree=sh_degree, absgrad=absgrad,
                                    fused_options=fused_options)
    if not with_info:
        return render, 1.0 - alpha[..., 0]
    if info["means2d"].requires_grad:
        info["means2d"].retain_grad()
    info["n_cameras"] = B
    info["rows"] = rows
    return render, 1.0 - alpha[..., 0], info


def pixel_render_loss(
    params: Mapping[str, Tensor],
    cells: CellState,
    views: Views,
    sh_degree: Optional[int],
    config: Optional[PixelConfig] = None,
    loss_fn: LossFn = splatfacto_loss,
    group=None,
    absgrad: bool = False,
    renderer: str = "auto",
) -> PixelForward:
    """Forward of one pixel-exchange step (collective); ``.local_loss.backward()`` runs the rest.

    ``renderer`` renders the cells (``render_cell``): ``reference``, ``fused`` (CUDA) or ``auto``
    (fused when the Gaussians are on a CUDA device). Every rank must pass the same choice: the
    partials' dtype on the wire follows it (float32 with ``fused``)."""
    cfg = config or PixelConfig()
    if cfg.transmittance and cfg.threshold < T_MIN:
        raise ValueError(f"transmittance threshold {cfg.threshold} is below the renderer's stop {T_MIN}")
    rank, world = rank_and_world(group)
    st = PixelStats()
    B, H, W = views.num_views, views.height, views.width
    n_cells = cells.tree.num_cells
    mine = cells.my_cells(rank)
    means = params["means"]
    dev = means.device
    renderer = resolve_renderer(renderer, dev)
    dtype = torch.float32 if renderer == "fused" else means.dtype  # the partials' dtype (and the wire's)
    cell_of = cells.cell_of.to(dev)

    # Cells' content bounds, known to every rank (one small all_reduce): each cell's row comes from its rank.
    lo, hi, has = content_bounds(means, gaussian_extent(torch.exp(params["scales"])), cell_of, n_cells)
    table = torch.zeros(n_cells, 7, dtype=torch.float64)
    for c in mine:
        if bool(has[c]):
            table[c, :3], table[c, 3:6], table[c, 6] = lo[c].cpu(), hi[c].cpu(), 1.0
    ex = ExchangeStats()
    table = all_reduce_(table.to(comm_device(group)), group=group, stats=ex, phase="pixel exchange: cell bounds").cpu()
    st.meta_bytes += ex.meta_bytes
    pred: Dict[Tuple[int, int], Tuple[int, int, int, int]] = {}
    viewmats_cpu, Ks_cpu = views.viewmats.detach().cpu(), views.Ks.detach().cpu()
    for v in range(B):
        for c in range(n_cells):
            if table[c, 6] <= 0:
                pred[(v, c)] = EMPTY
            elif not cfg.geometric:
                pred[(v, c)] = (0, 0, W, H)
            else:
                pred[(v, c)] = project_box_rect(table[c, :3].tolist(), table[c, 3:6].tolist(), viewmats_cpu[v], Ks_cpu[v], W, H, cfg.margin_px)

    # Which rank composites which view.
    pixels = [[float(sum(_area(pred[(v, c)]) for c in range(n_cells) if cells.ranks_of_cells[c] == r)) for r in range(world)] for v in range(B)]
    if cfg.schedule:
        report = schedule_views(pixels, world)
    else:
        vo = assign_views(B, world)
        report = ScheduleReport(vo, [sum(sum(pixels[v]) for v in vs) for vs in vo], sum(sum(pixels[v]) - pixels[v][r] for r, vs in enumerate(vo) for v in vs))

    # Render this rank's cells.
    t0 = time.perf_counter()
    partials: List[Tensor] = []
    rects: Dict[Tuple[int, int], Tuple[int, int, int, int]] = {}
    infos: Dict[int, Dict] = {}
    D = None
    for c in mine:
        rows = torch.nonzero(cell_of == c).squeeze(1)
        if rows.numel() == 0:
            D = D or (3 if sh_degree is not None else params["features_dc"].shape[-1])
            Cc = torch.zeros(B, H, W, D, dtype=dtype, device=dev)
            Tc = torch.ones(B, H, W, dtype=dtype, device=dev)
        else:
            Cc, Tc, infos[c] = render_cell(params, rows, views, sh_degree, absgrad=absgrad, with_info=True, renderer=renderer,
                                           fused_options=cfg.fused)
            Cc, Tc = Cc.to(dtype), Tc.to(dtype)
            D = Cc.shape[-1]
        partials += [Cc, Tc]
        for v in range(B):
            r = pred[(v, c)]
            if cfg.geometric:
                leak = _count_outside(Cc[v].detach(), Tc[v].detach(), r)
                if leak:
                    st.leaked_pixels += leak
                    r = _union(r, _nonzero_rect(Cc[v].detach(), Tc[v].detach()))
            rects[(v, c)] = r
    if cfg.measure_time:
        _sync(dev)  # render_s is the render's time, not its launch time
        st.render_s += time.perf_counter() - t0
    if D is None:  # a rank without cells still takes part in the exchange
        D = 3 if sh_degree is not None else params["features_dc"].shape[-1]

    orders = [cells.tree.visibility_order(cc.tolist()) for cc in camera_centers(views.viewmats.to(torch.float64))]
    runner = _Runner(views, cells, cfg, loss_fn, st, report.views_of_rank, mine, rects, orders, group, int(D), device=dev)
    # The anchor makes the output require grad on every rank (also one without Gaussians), so every
    # rank's backward takes part in the gradient exchange.
    anchor = torch.zeros((), dtype=dtype, device=dev, requires_grad=True)
    local_loss = _PixelExchange.apply(runner, anchor, *partials)
    return PixelForward(local_loss, runner.renders, st, report, rects, runner.masks, infos)


@dataclass
class PixelStepResult:
    loss: float
    stats: PixelStats
    schedule: ScheduleReport
    renders: Dict[int, Tensor]


def pixel_step(
    params: Mapping[str, Tensor],
    optimizers: Mapping[str, torch.optim.Optimizer],
    cells: CellState,
    views: Views,
    sh_degree: Optional[int],
    config: Optional[PixelConfig] = None,
    loss_fn: LossFn = splatfacto_loss,
    group=None,
    renderer: str = "auto",
) -> PixelStepResult:
    """One pixel-exchange training step (collective): forward, backward, optimizer step, batch loss.

    Logs (logger ``bytesplat.pixel``, INFO) this rank's bytes, bytes saved by each pruning and its
    measured idle time, and on rank 0 the view schedule with its predicted idle shares."""
    fwd = pixel_render_loss(params, cells, views, sh_degree, config, loss_fn, group, renderer=renderer)
    fwd.local_loss.backward()
    _step_optimizers(params, optimizers)
    total = fwd.local_loss.detach().clone().reshape(1).to(comm_device(group), torch.float64)
    ex = ExchangeStats()
    all_reduce_(total, group=group, stats=ex, phase="summing the batch loss")
    fwd.stats.meta_bytes += ex.meta_bytes
    rank, _ = rank_and_world(group)
    LOG.info(fwd.stats.log_line(rank))
    if rank == 0:
        LOG.info(fwd.schedule.log_line())
    return PixelStepResult(float(total.item()), fwd.stats, fwd.schedule, fwd.renders)
