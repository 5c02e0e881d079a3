"""Spatial cells for pixel-exchange training (Splaxel; docs/design.md, "Distributed design"): a kd-tree over the Gaussians.

The kd-tree partitions ALL of space (the outermost cells are unbounded) into axis-aligned, hence
convex, cells. It is built on the Gaussians' means, balanced by count: a node holding ``k`` cells
splits along the axis of largest extent so that ``floor(k/2)`` cells' worth of Gaussians fall on
the left (``x < split``) and the rest on the right. Every rank holds the same tree (it is built
deterministically from the same points), so every rank can locate a point, order the cells for a
camera and find each cell's rank without communication.

Cells -> ranks: ``cells_per_rank`` consecutive leaves (in tree order, i.e. spatially adjacent
subtrees) per rank (``cell_ranks``).

Visibility order (``KdCells.visibility_order``): for a camera at ``c`` the cells are ordered front
to back by walking the tree and visiting, at every split, the side that contains ``c`` first. For
two cells separated by a split plane with the camera on side A, every ray from the camera meets A
before it crosses into B, so this order is a correct front-to-back order for every pixel at once
(the classic BSP order; it needs only convexity, which axis-aligned kd cells have). A camera exactly
on a plane counts as on its left side; both orders are correct there.

Migration (``migrate``): after optimizer steps a Gaussian's mean may leave its cell; at rebalancing
every rank locates its Gaussians in the (possibly rebuilt, ``build_global``) tree and sends the
rows that now belong to another rank's cell to that rank, parameters AND their Adam state, through
the gloo-safe ``exchange``; parameters are replaced in place of the old ones in their optimizers,
as ``sharding.rebalance`` does.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Dict, List, Mapping, MutableMapping, Optional, Sequence, Tuple

import torch
import torch.distributed as dist
from torch import Tensor

from bytesplat_ns.distributed.exchange import (
    ExchangeStats,
    all_gather_ints,
    all_reduce_,
    comm_device,
    exchange,
    pack,
    rank_and_world,
    unpack,
)
from bytesplat_ns.distributed.sharding import ROW_STATE_KEYS, _param_optimizer, _replace_param

# Gaussians' extent used for cell content bounds: alpha >= 1/255 needs sigma-distance
# <= sqrt(2 ln 255) = 3.33; 3.5 leaves a margin.
EXTENT_SIGMAS = 3.5


@dataclass
class KdCells:
    """A kd-tree whose leaves are the cells. Node 0 is the root.

    ``axis[i]``/``split[i]``/``left[i]``/``right[i]`` describe internal node i; ``leaf[i]`` is the
    cell id of leaf node i (-1 for internal nodes). Cell ids number the leaves left to right.
    """

    axis: List[int] = field(default_factory=list)
    split: List[float] = field(default_factory=list)
    left: List[int] = field(default_factory=list)
    right: List[int] = field(default_factory=list)
    leaf: List[int] = field(default_factory=list)
    num_cells: int = 0

    # ---- construction ----
    @staticmethod
    def build(means: Tensor, num_cells: int) -> "KdCells":
        """Balanced-by-count kd-tree with ``num_cells`` leaves over ``means`` [N,3] (deterministic)."""
        if num_cells < 1:
            raise ValueError(f"need at least one cell, got {num_cells}")
        pts = means.detach().to(torch.float64).cpu()
        tree = KdCells()

        def new_node() -> int:
            for lst, v in ((tree.axis, -1), (tree.split, 0.0), (tree.left, -1), (tree.right, -1), (tree.leaf, -1)):
                lst.append(v)
            return len(tree.axis) - 1

        def rec(idx: Tensor, k: int) -> int:
            node = new_node()
            if k == 1:
                tree.leaf[node] = tree.num_cells
                tree.num_cells += 1
                return node
            p = pts[idx]
            if p.shape[0] >= 2:
                ext = p.max(0).values - p.min(0).values
                ax = int(torch.argmax(ext).item())
            else:
                ax = 0
            kl = k // 2
            if p.shape[0] == 0:
                s = 0.0
                li, ri = idx, idx
            else:
                vals = p[:, ax]
                order = torch.argsort(vals, stable=True)
                m = int(round(p.shape[0] * kl / k))
                sv = vals[order]
                if m <= 0:
                    s = float(sv[0].item()) - 1.0
                elif m >= p.shape[0]:
                    s = float(sv[-1].item()) + 1.0
                else:
                    s = 0.5 * (float(sv[m - 1].item()) + float(sv[m].item()))
                li = idx[vals < s]
                ri = idx[vals >= s]
            tree.axis[node] = ax
            tree.split[node] = s
            l = rec(li, kl)
            r = rec(ri, k - kl)
            tree.left[node], tree.right[node] = l, r
            return node

        rec(torch.arange(pts.shape[0]), num_cells)
        return tree

    # ---- queries ----
    def locate(self, points: Tensor) -> Tensor:
        """Cell id of each point [N,3] -> [N] int64 on the points' device (``x < split`` goes left).

        Runs where the points are: migration locates every Gaussian twice per pixel step, and the
        host round trip it replaces (a float64 copy of all means, then CPU kernels competing with the
        other ranks' threads) was one of the two changes that took the pixel step under nerfstudio's
        launcher from 180-360 to 25-34 ms (commit 8757b9f, docs/benchmarks.md, "Training quality on two GPUs"). A fixed number of levels (the tree's
        depth) instead of "until every point is in a leaf" reads nothing back; float64 keeps the
        comparisons with the (float64) splits exact."""
        dev = points.device
        p = points.detach().to(torch.float64)
        node = torch.zeros(p.shape[0], dtype=torch.int64, device=dev)
        axis = torch.tensor(self.axis, dtype=torch.int64, device=dev).clamp_min(0)
        split = torch.tensor(self.split, dtype=torch.float64, device=dev)
        left = torch.tensor(self.left, dtype=torch.int64, device=dev)
        right = torch.tensor(self.right, dtype=torch.int64, device=dev)
        leaf = torch.tensor(self.leaf, dtype=torch.int64, device=dev)
        if p.shape[0] == 0:
            return node
        for _ in range(self.depth()):
            v = p.gather(1, axis[node][:, None]).squeeze(1)
            nxt = torch.where(v < split[node], left[node], right[node])
            node = torch.where(leaf[node] < 0, nxt, node)  # points already in a leaf stay there
        return leaf[node]

    def depth(self) -> int:
        """Edges on the longest root-to-leaf path (0 for a single cell)."""
        deepest, stack = 0, [(0, 0)]
        while stack:
            node, d = stack.pop()
            if self.leaf[node] >= 0:
                deepest = max(deepest, d)
            else:
                stack += [(self.left[node], d + 1), (self.right[node], d + 1)]
        return deepest

    def visibility_order(self, camera_center: Sequence[float]) -> List[int]:
        """Cell ids front to back for a camera at ``camera_center`` (world space)."""
        c = [float(x) for x in camera_center]
        out: List[int] = []
        stack = [0]
        while stack:
            node = stack.pop()
            if self.leaf[node] >= 0:
                out.append(self.leaf[node])
                continue
            near, far = (self.left[node], self.right[node]) if c[self.axis[node]] < self.split[node] else (self.right[node], self.left[node])
            stack.append(far)
            stack.append(near)
        return out

    def cell_boxes(self) -> Tuple[Tensor, Tensor]:
        """Each cell's region (lo, hi) [num_cells,3] float64; unbounded sides are +-inf."""
        lo = torch.full((self.num_cells, 3), -math.inf, dtype=torch.float64)
        hi = torch.full((self.num_cells, 3), math.inf, dtype=torch.float64)

        def rec(node: int, blo: List[float], bhi: List[float]) -> None:
            if self.leaf[node] >= 0:
                lo[self.leaf[node]] = torch.tensor(blo, dtype=torch.float64)
                hi[self.leaf[node]] = torch.tensor(bhi, dtype=torch.float64)
                return
            ax, s = self.axis[node], self.split[node]
            h = list(bhi)
            h[ax] = min(h[ax], s)
            rec(self.left[node], blo, h)
            l = list(blo)
            l[ax] = max(l[ax], s)
            rec(self.right[node], l, bhi)

        rec(0, [-math.inf] * 3, [math.inf] * 3)
        return lo, hi

    def as_dict(self) -> Dict:
        return {"axis": self.axis, "split": self.split, "left": self.left, "right": self.right, "leaf": self.leaf, "num_cells": self.num_cells}


def cell_ranks(num_cells: int, world: int) -> List[int]:
    """Rank of each cell: consecutive leaves (spatial neighbours) in blocks, sizes differing by <= 1."""
    base, extra = divmod(num_cells, world)
    out: List[int] = []
    for r in range(world):
        out += [r] * (base + (1 if r < extra else 0))
    return out


def gaussian_extent(scales: Tensor) -> Tensor:
    """Half extent [N] of each Gaussian's footprint box: EXTENT_SIGMAS * max(scale) (``scales`` linear)."""
    return EXTENT_SIGMAS * scales.detach().max(dim=-1).values


def content_bounds(means: Tensor, extent: Tensor, cell_of: Tensor, num_cells: int) -> Tuple[Tensor, Tensor, Tensor]:
    """Per cell: box (lo, hi) [num_cells,3] of its Gaussians' footprints (mean +- extent) and a
    [num_cells] bool 'has Gaussians'. Empty cells get lo=+inf, hi=-inf."""
    m = means.detach().to(torch.float64)
    e = extent.detach().to(torch.float64)[:, None]
    idx = cell_of.to(torch.int64)[:, None].expand(-1, 3)
    lo = torch.full((num_cells, 3), math.inf, dtype=torch.float64, device=m.device)
    hi = torch.full((num_cells, 3), -math.inf, dtype=torch.float64, device=m.device)
    if m.shape[0]:
        lo = lo.scatter_reduce(0, idx, m - e, reduce="amin")
        hi = hi.scatter_reduce(0, idx, m + e, reduce="amax")
    has = torch.zeros(num_cells, dtype=torch.bool, device=m.device)
    if m.shape[0]:
        has[cell_of.to(torch.int64)] = True
    return lo, hi, has


def crossing_mask(tree: KdCells, means: Tensor, extent: Tensor, cell_of: Optional[Tensor] = None) -> Tensor:
    """[N] bool: Gaussians whose footprint box (mean +- extent) leaves their cell's region."""
    if cell_of is None:
        cell_of = tree.locate(means)
    lo, hi = tree.cell_boxes()
    c = cell_of.to(torch.int64).cpu()
    m = means.detach().to(torch.float64).cpu()
    e = extent.detach().to(torch.float64).cpu()[:, None]
    return (((m - e) < lo[c]) | ((m + e) > hi[c])).any(dim=1).to(means.device)


def build_global(means_local: Tensor, num_cells: int, group=None, max_samples: int = 1 << 20,
                 stats: Optional[ExchangeStats] = None) -> KdCells:
    """The same kd-tree on every rank from every rank's means (collective).

    Each rank contributes at most ``max_samples / world`` of its means (an evenly strided subset),
    so the tree is built from a bounded sample at any scale; with fewer Gaussians, from all of them.
    """
    rank, world = rank_and_world(group)
    m = means_local.detach().to(torch.float64)
    cap = max(1, max_samples // world)
    if m.shape[0] > cap:
        m = m[torch.linspace(0, m.shape[0] - 1, cap).round().long()]
    if world == 1:
        return KdCells.build(m.cpu(), num_cells)
    counts = all_gather_ints([int(m.shape[0])], group, stats, phase="kd-tree sample sizes")[:, 0].tolist()
    dev = comm_device(group)
    mx = max(counts)
    buf = torch.zeros(mx, 3, dtype=torch.float64, device=dev)
    buf[: m.shape[0]] = m.to(dev)
    out = [torch.empty_like(buf) for _ in range(world)]
    dist.all_gather(out, buf, group=group)
    if stats is not None:
        stats.meta_bytes += buf.numel() * buf.element_size()
    allm = torch.cat([o[:c].cpu() for o, c in zip(out, counts)], 0)
    return KdCells.build(allm, num_cells)


def migrate(
    params: MutableMapping[str, Tensor],
    optimizers: Optional[Mapping[str, torch.optim.Optimizer]],
    tree: KdCells,
    ranks_of_cells: Sequence[int],
    group=None,
    stats: Optional[ExchangeStats] = None,
    extra: Optional[MutableMapping[str, Tensor]] = None,
) -> Tuple[Tensor, int]:
    """Send every Gaussian whose mean lies in another rank's cell to that rank (collective).

    ``params`` (name -> [n, ...]) and the Adam state of their optimizers travel together; ``extra``
    (e.g. global ids, densification statistics: name -> [n, ...]) travels with them. Rows kept
    stay first in their order, received rows follow in source-rank order. Returns (the new local
    cell id of every row [n'], the number of rows this rank sent away).
    """
    rank, world = rank_and_world(group)
    names = list(params.keys())
    means = params["means"].detach()
    cell = tree.locate(means)
    dest = torch.tensor(list(ranks_of_cells), dtype=torch.int64, device=cell.device)[cell]
    opts = {n: _param_optimizer(optimizers, n, params[n]) for n in names}
    # Agree on which Adam rows exist (a rank that never stepped has none) and on the step count.
    flags, steps = [], []
    wire = comm_device(group)
    for n in names:
        st = opts[n].state.get(params[n], {}) if opts[n] is not None else {}
        flags += [1.0 if isinstance(st.get(k), Tensor) and st[k].shape == params[n].shape else 0.0 for k in ROW_STATE_KEYS]
        s = st.get("step", 0.0)
        # fused Adam keeps its step count on the GPU: gathered there, read once with the flags below
        steps.append(s.detach().reshape(()).to(wire, torch.float64) if isinstance(s, Tensor)
                     else torch.tensor(float(s), dtype=torch.float64, device=wire))
    agree = torch.cat([torch.tensor(flags, dtype=torch.float64, device=wire), torch.stack(steps)])
    all_reduce_(agree, dist.ReduceOp.MAX, group, stats, phase="migration (optimizer state)")
    agree = agree.cpu().tolist()
    K = len(ROW_STATE_KEYS)
    keys = {n: [k for j, k in enumerate(ROW_STATE_KEYS) if agree[i * K + j] > 0] for i, n in enumerate(names)}
    max_steps = {n: agree[len(names) * K + i] for i, n in enumerate(names)}
    tables: List[Tuple[str, str, Tensor]] = []  # (name, role, [n, ...])
    for n in names:
        p = params[n].detach()
        tables.append((n, "param", p))
        st = opts[n].state.get(params[n], {}) if opts[n] is not None else {}
        for k in keys[n]:
            tables.append((n, k, st[k] if k in st else torch.zeros_like(p)))
    for k, v in (extra or {}).items():
        tables.append((k, "extra", v.detach()))
    specs = [(t.dtype, tuple(t.shape[1:])) for _, _, t in tables]
    row_bytes = sum(torch.empty((), dtype=dt).element_size() * math.prod(s) for dt, s in specs)
    rows_to = [torch.nonzero(dest == d).squeeze(1) for d in range(world)]
    send = []
    for d in range(world):
        if d == rank or rows_to[d].numel() == 0:
            send.append(torch.empty(0, dtype=torch.uint8, device=means.device))
        else:
            send.append(pack([t.index_select(0, rows_to[d]) for _, _, t in tables]))
    ex = stats if stats is not None else ExchangeStats()
    received = exchange(send, None, group, ex, phase="migrating Gaussians between cells")
    parts: List[List[Tensor]] = [[t.index_select(0, rows_to[rank])] for _, _, t in tables]
    for s in range(world):
        if s == rank or received[s].numel() == 0:
            continue
        cnt = received[s].numel() // row_bytes
        got = unpack(received[s], [(dt, (cnt,) + sh) for dt, sh in specs])
        for j, g in enumerate(got):
            parts[j].append(g.clone())
    new = [torch.cat(p, 0) for p in parts]
    j = 0
    for n in names:
        data = new[j]
        j += 1
        state: Dict[str, Tensor] = {}
        for k in keys[n]:
            state[k] = new[j]
            j += 1
        opt = opts[n]
        if opt is not None and (keys[n] or max_steps[n] > 0):
            old = opt.state.get(params[n], {}).get("step")
            step = torch.tensor(max_steps[n], dtype=old.dtype if isinstance(old, Tensor) else torch.float32)
            state["step"] = step.to(old.device) if isinstance(old, Tensor) else step
        _replace_param(params, n, data, opt, state)
    for k in (extra or {}):
        extra[k] = new[j]  # type: ignore[index]
        j += 1
    sent = int(sum(rows_to[d].numel() for d in range(world) if d != rank))
    return tree.locate(params["means"].detach()), sent


def rank_imbalance(counts_per_rank: Sequence[int]) -> float:
    """max over ranks of |count - mean| / mean (0 for an empty scene)."""
    mean = sum(counts_per_rank) / max(len(counts_per_rank), 1)
    return 0.0 if mean == 0 else max(abs(c - mean) for c in counts_per_rank) / mean


def rebalance_cells(
    params: MutableMapping[str, Tensor],
    optimizers: Optional[Mapping[str, torch.optim.Optimizer]],
    tree: KdCells,
    ranks_of_cells: Sequence[int],
    threshold: float = 0.1,
    force: bool = False,
    group=None,
    stats: Optional[ExchangeStats] = None,
    extra: Optional[MutableMapping[str, Tensor]] = None,
    max_samples: int = 1 << 20,
    counts: Optional[Sequence[int]] = None,
) -> Tuple[KdCells, Tensor, bool, int]:
    """Rebalancing of the cells (collective): when the ranks' Gaussian counts differ from their mean
    by more than ``threshold`` (or ``force``), rebuild a balanced tree from every rank's means
    (``build_global``, same number of cells); then migrate every Gaussian that is not on its cell's
    rank (this also moves Gaussians that left their cell under the old tree).

    ``counts``: every rank's Gaussian count, where the caller gathered them already (else gathered here).
    Returns (the tree now in use, the local cell id of every row, whether the tree was rebuilt, the
    number of rows this rank sent away)."""
    if counts is None:
        counts = all_gather_ints([int(params["means"].shape[0])], group, stats, phase="cell sizes")[:, 0].tolist()
    rebuilt = force or rank_imbalance(counts) > threshold
    if rebuilt:
        tree = build_global(params["means"], tree.num_cells, group, max_samples, stats)
    cell_of, sent = migrate(params, optimizers, tree, ranks_of_cells, group, stats, extra)
    return tree, cell_of, rebuilt, sent
