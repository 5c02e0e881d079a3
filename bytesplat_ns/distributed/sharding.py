"""Which rank owns which Gaussians: contiguous shards of one global order, and rebalancing.

Rank ``r`` owns global ids ``[offsets[r], offsets[r] + counts[r])``: concatenating the shards in
rank order gives the global order (the order a single process would hold them in). Global ids are
derived from the current counts every step (``gather_layout``; the sharded step gets them from
``gather_layout_and_view_counts``, with its records per view), so shards may grow and shrink
(densification, pruning) between steps without bookkeeping.

Rebalancing (``rebalance``): when a shard's size differs from the mean by more than ``threshold``
(10% by default), the shards are re-cut evenly along the same global order. Each rank sends the
rows of its old range that fall into another rank's new range, parameters AND their optimizer
state (Adam's ``exp_avg``/``exp_avg_sq``, ``max_exp_avg_sq`` with amsgrad; ``step`` is the same on
all ranks), and replaces its parameters and their optimizer entries in place of the old ones.
The global order is unchanged, so training continues exactly as without the move.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Dict, List, Mapping, MutableMapping, Optional, Tuple

import torch
import torch.distributed as dist
from torch import Tensor

from bytesplat_ns.distributed.exchange import (
    ExchangeStats,
    all_gather_ints,
    all_gather_rows,
    all_reduce_,
    comm_device,
    exchange,
    pack,
    rank_and_world,
    unpack,
)

ROW_STATE_KEYS = ("exp_avg", "exp_avg_sq", "max_exp_avg_sq")


@dataclass(frozen=True)
class ShardLayout:
    counts: Tuple[int, ...]

    @property
    def world_size(self) -> int:
        return len(self.counts)

    @property
    def total(self) -> int:
        return sum(self.counts)

    @property
    def offsets(self) -> Tuple[int, ...]:
        out, acc = [], 0
        for c in self.counts:
            out.append(acc)
            acc += c
        return tuple(out)

    def range(self, rank: int) -> Tuple[int, int]:
        start = self.offsets[rank]
        return start, start + self.counts[rank]

    def owner_of(self, gids: Tensor) -> Tensor:
        bounds = torch.tensor(self.offsets[1:], dtype=torch.int64, device=gids.device)
        return torch.bucketize(gids.to(torch.int64), bounds, right=True)

    @staticmethod
    def even(total: int, world_size: int) -> "ShardLayout":
        """Contiguous shards whose sizes differ by at most one (the first ranks get the extra)."""
        base, extra = divmod(total, world_size)
        return ShardLayout(tuple(base + (1 if r < extra else 0) for r in range(world_size)))

    def imbalance(self) -> float:
        """max over ranks of |count - mean| / mean (0 for an empty scene)."""
        mean = self.total / self.world_size
        if mean == 0:
            return 0.0
        return max(abs(c - mean) for c in self.counts) / mean

    def needs_rebalance(self, threshold: float = 0.1) -> bool:
        return self.imbalance() > threshold


def gather_layout(num_local: int, group=None, stats: Optional[ExchangeStats] = None) -> ShardLayout:
    """Every rank's shard size (a collective: all ranks must call it)."""
    counts = all_gather_ints([num_local], group, stats, phase="gathering shard sizes")
    return ShardLayout(tuple(int(c) for c in counts[:, 0].tolist()))


def gather_layout_and_view_counts(
    visible: Tensor, group=None, stats: Optional[ExchangeStats] = None, intersections: Optional[Tensor] = None,
) -> Tuple[ShardLayout, List[List[int]], Optional[List[List[int]]]]:
    """A sharded step's bookkeeping in one collective and one host read: every rank's shard size
    (the global-id layout) and how many of its Gaussians each view sees. ``visible`` [B, n] bool
    (radius > 0) is this rank's projection. Returns (layout, counts, tiles) with ``counts[rank][view]``:
    from it every record message's size and every view's rows in it follow, so the exchange needs
    no size round of its own and the renderer no read of the received records. ``intersections``
    [B] int64 (optional, the same on every rank): the tiles this rank's visible records reach per
    view (``raster.fused.tile_intersections``); gathered into ``tiles[rank][view]``, they give
    every renderer its binning's size, so the binning reads nothing back either (None without)."""
    B, n = visible.shape
    parts = [torch.full((1,), n, dtype=torch.int64, device=visible.device), visible.sum(1, dtype=torch.int64)]
    if intersections is not None:
        parts.append(intersections.to(torch.int64).reshape(B))
    table = all_gather_rows(torch.cat(parts), group, stats, phase="gathering shard sizes and records per view").tolist()
    counts = [[int(c) for c in row[1 : 1 + B]] for row in table]
    tiles = [[int(c) for c in row[1 + B :]] for row in table] if intersections is not None else None
    return ShardLayout(tuple(int(row[0]) for row in table)), counts, tiles


def shard_of(tensors: Mapping[str, Tensor], layout: ShardLayout, rank: int) -> Dict[str, Tensor]:
    """Rank ``rank``'s rows of full (all-Gaussian) tensors under ``layout`` (copies)."""
    start, end = layout.range(rank)
    return {name: t[start:end].detach().clone() for name, t in tensors.items()}


def _overlap(a: Tuple[int, int], b: Tuple[int, int]) -> Tuple[int, int]:
    lo, hi = max(a[0], b[0]), min(a[1], b[1])
    return (lo, hi) if hi > lo else (lo, lo)


def _param_optimizer(optimizers: Optional[Mapping[str, torch.optim.Optimizer]], name: str, param: Tensor):
    """The optimizer holding ``param`` (nerfstudio layout: one optimizer per parameter name)."""
    if optimizers is None or name not in optimizers:
        return None
    opt = optimizers[name]
    for group in opt.param_groups:
        for p in group["params"]:
            if p is param:
                return opt
    raise ValueError(f"optimizer '{name}' does not hold the current '{name}' parameter")


def _replace_param(
    params: MutableMapping[str, Tensor],
    name: str,
    new_data: Tensor,
    optimizer: Optional[torch.optim.Optimizer],
    new_state: Dict[str, Tensor],
) -> None:
    old = params[name]
    new = torch.nn.Parameter(new_data, requires_grad=old.requires_grad)
    params[name] = new
    if optimizer is None:
        return
    for group in optimizer.param_groups:
        for i, p in enumerate(group["params"]):
            if p is old:
                group["params"][i] = new
    optimizer.state.pop(old, None)
    if new_state:
        step = new_state.get("step")
        if isinstance(step, Tensor) and any(g.get("fused") or g.get("capturable") for g in optimizer.param_groups):
            # fused Adam keeps its step count on the parameter's device (a rank that had no state
            # before builds it on the host)
            new_state["step"] = step.to(device=new.device, dtype=torch.float32)
        optimizer.state[new] = new_state


def rebalance(
    params: MutableMapping[str, Tensor],
    optimizers: Optional[Mapping[str, torch.optim.Optimizer]] = None,
    threshold: float = 0.1,
    group=None,
    stats: Optional[ExchangeStats] = None,
    force: bool = False,
    extra: Optional[MutableMapping[str, Optional[Tensor]]] = None,
) -> Tuple[bool, ShardLayout]:
    """Re-cut the shards evenly if their sizes drifted more than ``threshold`` (collective).

    ``params``: this rank's Gaussian parameters, all with the same number of rows (a dict or
    nerfstudio's ``ParameterDict``); ``optimizers``: name -> optimizer holding that parameter;
    ``extra``: other per-Gaussian tensors that move with their rows (e.g. densification
    statistics; None entries are skipped, and must be None on every rank). Returns (moved, the
    layout after the call); ``params``, the optimizers and ``extra`` are updated in place.
    """
    rank, world = rank_and_world(group)
    if extra:
        extra_names = [k for k, v in extra.items() if v is not None]
        if extra_names:
            carried = {f"__extra__{k}": extra[k] for k in extra_names}
            both: Dict[str, Tensor] = dict(params.items())
            both.update(carried)
            moved, layout = rebalance(both, optimizers, threshold, group, stats, force)
            for name in params.keys():
                params[name] = both[name]
            for k in extra_names:
                extra[k] = both[f"__extra__{k}"].detach() if moved else extra[k]
            return moved, layout
    names = list(params.keys())
    n_local = int(params[names[0]].shape[0])
    for name in names:
        if int(params[name].shape[0]) != n_local:
            raise ValueError(f"parameter '{name}' has {params[name].shape[0]} rows, expected {n_local}")
    layout = gather_layout(n_local, group, stats)
    if world == 1 or not (force or layout.needs_rebalance(threshold)):
        return False, layout
    target = ShardLayout.even(layout.total, world)
    old_range = layout.range(rank)

    # Which optimizer state rows travel: agreed on by all ranks (a rank that never stepped has none).
    opts = {name: _param_optimizer(optimizers, name, params[name]) for name in names}
    keys_flags = []
    steps = []
    for name in names:
        state = opts[name].state.get(params[name], {}) if opts[name] is not None else {}
        keys_flags += [1.0 if isinstance(state.get(k), Tensor) and state[k].shape == params[name].shape else 0.0 for k in ROW_STATE_KEYS]
        step = state.get("step", 0.0)
        steps.append(float(step.item() if isinstance(step, Tensor) else step))
    dev = comm_device(group)
    agree = torch.tensor(keys_flags + steps, dtype=torch.float64, device=dev)
    all_reduce_(agree, dist.ReduceOp.MAX, group, stats, phase="rebalancing (optimizer state)")
    agree = agree.cpu().tolist()
    moved_keys = {name: [k for j, k in enumerate(ROW_STATE_KEYS) if agree[i * len(ROW_STATE_KEYS) + j] > 0] for i, name in enumerate(names)}
    max_steps = {name: agree[len(names) * len(ROW_STATE_KEYS) + i] for i, name in enumerate(names)}

    def rows(name: str) -> List[Tensor]:
        p = params[name].detach()
        out = [p]
        state = opts[name].state.get(params[name], {}) if opts[name] is not None else {}
        for k in moved_keys[name]:
            out.append(state[k] if k in state else torch.zeros_like(p))
        return out

    tables = {name: rows(name) for name in names}
    specs_row = [(t.dtype, tuple(t.shape[1:])) for name in names for t in tables[name]]

    def slice_message(lo: int, hi: int) -> Tensor:
        return pack([t[lo:hi] for name in names for t in tables[name]])

    send, recv_sizes, incoming = [], [], []
    rb = sum(torch.empty((), dtype=dt).element_size() * math.prod(shape) for dt, shape in specs_row)
    for d in range(world):
        lo, hi = _overlap(old_range, target.range(d))
        send.append(slice_message(lo - old_range[0], hi - old_range[0]) if d != rank else torch.empty(0, dtype=torch.uint8, device=params[names[0]].device))
        slo, shi = _overlap(layout.range(d), target.range(rank))
        incoming.append(shi - slo)
        recv_sizes.append((shi - slo) * rb if d != rank else 0)
    ex = stats if stats is not None else ExchangeStats()
    received = exchange(send, recv_sizes, group, ex, phase="rebalancing shards")

    pieces: Dict[str, List[List[Tensor]]] = {name: [] for name in names}
    for s in range(world):
        if incoming[s] == 0:
            continue
        if s == rank:
            lo, hi = _overlap(old_range, target.range(rank))
            parts = [t[lo - old_range[0] : hi - old_range[0]] for name in names for t in tables[name]]
        else:
            parts = unpack(received[s], [(dt, (incoming[s],) + shape) for dt, shape in specs_row])
        i = 0
        for name in names:
            n_t = len(tables[name])
            pieces[name].append(parts[i : i + n_t])
            i += n_t

    for name in names:
        cols = list(zip(*pieces[name])) if pieces[name] else [[] for _ in tables[name]]
        new_tabs = []
        for j, t in enumerate(tables[name]):
            parts = list(cols[j]) if pieces[name] else []
            new_tabs.append(torch.cat(parts, 0).clone() if parts else t[:0].clone())
        state: Dict[str, Tensor] = {}
        opt = opts[name]
        if opt is not None and (moved_keys[name] or max_steps[name] > 0):
            old_state = opt.state.get(params[name], {})
            step_old = old_state.get("step")
            step = torch.tensor(max_steps[name], dtype=step_old.dtype if isinstance(step_old, Tensor) else torch.float32)
            if isinstance(step_old, Tensor):
                step = step.to(step_old.device)
            state["step"] = step
            for j, k in enumerate(moved_keys[name]):
                state[k] = new_tabs[1 + j]
        _replace_param(params, name, new_tabs[0], opt, state)
    return True, target


def gather_to_rank0(tensors: Mapping[str, Tensor], group=None, stats: Optional[ExchangeStats] = None) -> Optional[Dict[str, Tensor]]:
    """Concatenate every rank's rows (in rank = global order) on rank 0 (collective).

    Returns the full tensors on rank 0 and None elsewhere. Used to gather Gaussians (and optimizer
    state) before a checkpoint is written by rank 0 alone.
    """
    rank, world = rank_and_world(group)
    names = list(tensors.keys())
    if world == 1:
        return {name: t.detach().clone() for name, t in tensors.items()}
    n_local = int(tensors[names[0]].shape[0]) if names else 0
    layout = gather_layout(n_local, group, stats)
    specs = [(tensors[n].dtype, tuple(tensors[n].shape[1:])) for n in names]
    rb = sum(torch.empty((), dtype=dt).element_size() * math.prod(shape) for dt, shape in specs)
    device = tensors[names[0]].device
    send = [torch.empty(0, dtype=torch.uint8, device=device) for _ in range(world)]
    if rank != 0:
        send[0] = pack([tensors[n].detach() for n in names])
    recv_sizes = [layout.counts[s] * rb if (rank == 0 and s != 0) else 0 for s in range(world)]
    received = exchange(send, recv_sizes, group, stats, phase="gathering Gaussians on rank 0")
    if rank != 0:
        return None
    out: Dict[str, List[Tensor]] = {n: [tensors[n].detach().clone()] for n in names}
    for s in range(1, world):
        parts = unpack(received[s], [(dt, (layout.counts[s],) + shape) for dt, shape in specs])
        for n, p in zip(names, parts):
            out[n].append(p.clone())
    return {n: torch.cat(v, 0) for n, v in out.items()}
