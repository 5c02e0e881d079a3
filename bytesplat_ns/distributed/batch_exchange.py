"""How the ranks of ``ShardedPipeline`` share one batch: the record exchange and the pixel exchange.

Both are a :class:`BatchExchange`, the one interface the pipeline drives, so it never asks which one
it holds:

- ``views_to_load``: the batch views whose ground-truth images this rank needs;
- ``render_loss``: render + splatfacto's loss of this rank's share of the batch (``BatchRender``:
  the loss share, the ``info`` the densification strategy reads, the scene's Gaussian count);
- ``after_step``: between steps (collective): keep the ownership of the Gaussians balanced, moving
  their Adam state and densification statistics with them; ``after_load`` after a checkpoint load;
- ``add_meta_bytes`` / ``step_stats``: what this rank sent in the last step (``CommStats``, plus exchange-specific
  scalars), for the pipeline's ``communication/*`` log.

``RecordExchange`` (``dense``, ``sparse-grad``): contiguous shards; each rank projects its shard
into every view and the 2D records travel to the view's rank (``step.sharded_render_loss``), the
gradients come back. ``PixelExchange`` (``pixel``): one kd cell of Gaussians per rank; each rank
renders its cell into every view and the partial images travel (``pixel.pixel_render_loss``);
docs/pixel_exchange.md. ``make_batch_exchange`` builds the one a communicator name asks for
(``auto`` is resolved by the pipeline before, from ``auto.choose``).
"""

from __future__ import annotations

import functools
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Tuple

import torch
from nerfstudio.utils.rich_utils import CONSOLE
from torch import Tensor

from bytesplat_ns.distributed.cells import build_global, cell_ranks, rebalance_cells
from bytesplat_ns.distributed.communicators import CommStats, make_communicator
from bytesplat_ns.distributed.exchange import ExchangeStats, all_gather_ints
from bytesplat_ns.distributed.pixel import CellState, PixelConfig, pixel_render_loss
from bytesplat_ns.distributed.sharding import rebalance
from bytesplat_ns.distributed.step import Views, assign_views, sharded_render_loss, splatfacto_loss

STRATEGY_ROW_KEYS = ("grad2d", "count", "radii")  # densification statistics with one row per Gaussian


@dataclass
class BatchRender:
    """One rank's part of a batch's render and loss."""

    local_loss: Tensor  # this rank's share of the batch loss (its gradient runs the exchange's backward)
    info: Dict[str, Any]  # what the densification strategy reads (means2d with its grads, radii, ...)
    total_gaussians: int  # the scene's, summed over the ranks
    local_gaussians: int
    meta: ExchangeStats  # bytes of the control messages this call sent


class BatchExchange(ABC):
    """The part of a sharded step that depends on how the ranks split the work (module docstring)."""

    name: str

    def __init__(self, name: str, model, config, rank: int, world_size: int):
        self.name = name
        self.model = model
        self.config = config  # the ShardedPipelineConfig
        self.rank = rank
        self.world_size = world_size

    def start(self) -> None:
        """After the initial shards are in place, before the optimizers exist (collective)."""

    @abstractmethod
    def views_to_load(self, num_views: int) -> List[int]:
        """Indices (into the batch) of the views whose images this rank needs."""

    @abstractmethod
    def render_loss(self, views: Views, sh_degree: Optional[int], ssim_lambda: float, absgrad: bool,
                    compositor: str, logged: bool = True) -> BatchRender:
        """Render and score this rank's share of the batch (collective). ``logged``: the pipeline logs
        this step's statistics (work only they need may be skipped on other steps)."""

    @abstractmethod
    def after_step(self, step: int, optimizers: Mapping[str, torch.optim.Optimizer]) -> bool:
        """Between steps (collective): rebalance the ownership of the Gaussians with their Adam state
        (``optimizers``: the Gaussian parameters' ones) and densification statistics. Returns whether
        the parameters were replaced (the caller re-points nerfstudio's optimizer bookkeeping)."""

    def after_load(self, optimizers: Mapping[str, torch.optim.Optimizer]) -> None:
        """After a checkpoint's even slices were loaded (collective)."""

    @abstractmethod
    def add_meta_bytes(self, meta: int) -> None:
        """Count ``meta`` bytes of control messages this step sent outside the exchange (the loss sum)."""

    @abstractmethod
    def step_stats(self) -> Tuple[CommStats, Dict[str, float]]:
        """What this rank sent in the last step, and exchange-specific scalars (consumed: a second
        call before the next step returns empty statistics)."""


class RecordExchange(BatchExchange):
    """``dense`` / ``sparse-grad``: 2D Gaussian records forward, their gradients back."""

    def __init__(self, name: str, model, config, rank: int, world_size: int):
        super().__init__(name, model, config, rank, world_size)
        self.communicator = make_communicator(name, sparse_kernels=config.sparse_kernels)
        self._pending: Optional[CommStats] = None

    def views_to_load(self, num_views: int) -> List[int]:
        return assign_views(num_views, self.world_size)[self.rank]

    def render_loss(self, views, sh_degree, ssim_lambda, absgrad, compositor, logged=True) -> BatchRender:
        fwd = sharded_render_loss(
            self.model.gauss_params,
            views,
            self.communicator,
            sh_degree,
            functools.partial(splatfacto_loss, ssim_lambda=ssim_lambda),  # recognised by the fused compositor
            absgrad=absgrad,
            compositor=compositor,
            options=self.model.config.fused.options(),
        )
        self._pending = fwd.stats  # the backward adds the gradient bytes to the same object
        return BatchRender(fwd.local_loss, fwd.info, fwd.layout.total, int(fwd.layout.counts[self.rank]), ExchangeStats())

    def add_meta_bytes(self, meta: int) -> None:
        if self._pending is not None:
            self._pending.meta_bytes += meta

    def after_step(self, step, optimizers) -> bool:
        if not self.model.strategy.refines_at(step):
            return False  # no rank's shard changed size: no shard-size gather (host work only sharded runs pay)
        state = self.model.strategy_state
        rows = {k: state.get(k) for k in STRATEGY_ROW_KEYS if isinstance(state.get(k), torch.Tensor)}
        moved, layout = rebalance(self.model.gauss_params, dict(optimizers), self.config.rebalance_threshold, extra=rows)
        if moved:
            state.update(rows)
            CONSOLE.log(f"bytesplat: step {step}: shards rebalanced to {layout.counts}")
        return bool(moved)

    def step_stats(self):
        stats, self._pending = self._pending or CommStats(), None
        return stats, {}


class PixelExchange(BatchExchange):
    """``pixel``: ownership by kd cell (one per rank), partial images forward and back."""

    def __init__(self, name: str, model, config, rank: int, world_size: int):
        super().__init__(name, model, config, rank, world_size)
        self.cells: Optional[CellState] = None
        self._pending = None  # (pixel.PixelStats, meta bytes) of the last step
        self._meta = 0
        self._migration_bytes = 0
        self._total = 0  # the scene's Gaussian count, from the last partition's size gather

    @property
    def my_cell(self) -> int:
        return self.rank  # one cell per rank (cell_ranks(world, world))

    def start(self) -> None:
        self.partition(None, force=True)

    def views_to_load(self, num_views: int) -> List[int]:
        # The view schedule is decided inside the step (from the cells' bounds), so every rank has
        # every image of the batch at hand.
        return list(range(num_views))

    def render_loss(self, views, sh_degree, ssim_lambda, absgrad, compositor, logged=True) -> BatchRender:
        params = self.model.gauss_params
        n = int(params["means"].shape[0])
        # Every local Gaussian belongs to this rank's cell until the next migration moves it (also
        # one that wandered out of the cell: the composite's order is then approximate for it).
        self.cells.cell_of = torch.full((n,), self.my_cell, dtype=torch.int64, device=params["means"].device)
        cfg = PixelConfig(geometric=self.config.pixel_geometric, transmittance=self.config.pixel_transmittance,
                          fused=self.model.config.fused.options(), measure_time=logged)
        fwd = pixel_render_loss(
            params, self.cells, views, sh_degree, cfg, functools.partial(splatfacto_loss, ssim_lambda=ssim_lambda),
            absgrad=absgrad, renderer=compositor,
        )
        info = fwd.infos.get(self.my_cell)
        if info is None or n == 0:
            info = _empty_info(views, n, params["means"].device)
        # Filled in by the backward (bytes sent back, bytes saved): read after the iteration.
        self._pending, self._meta = fwd.stats, 0  # the pipeline adds meta's bytes with the loss's
        # The scene's count is the last partition's (its migration keeps the total, and nothing
        # changes a count between it and this step): no gather of its own.
        return BatchRender(fwd.local_loss, info, self._total, n, ExchangeStats())

    def add_meta_bytes(self, meta: int) -> None:
        self._meta += meta

    def after_step(self, step, optimizers) -> bool:
        self._migration_bytes, rebuilt = self.partition(dict(optimizers))
        if rebuilt:
            CONSOLE.log(f"bytesplat: step {step}: kd cells rebuilt and Gaussians migrated")
        return True  # the migration replaces the parameters every step

    def after_load(self, optimizers) -> None:
        # Re-partition the loaded Gaussians (any rank count) into this run's kd cells, with their
        # Adam state: the even slices are only the starting point of the migration.
        self.partition(dict(optimizers), force=True)

    def partition(self, optimizers: Optional[Dict[str, torch.optim.Optimizer]], force: bool = False) -> Tuple[int, bool]:
        """Collective: rebuild the kd cells when the ranks' counts drift more than
        ``rebalance_threshold`` (or ``force``), and migrate every Gaussian that is not on its cell's
        rank, with its Adam state (``optimizers``, or None before they exist) and densification
        statistics. Returns (bytes this rank sent, whether the cells were rebuilt)."""
        params = self.model.gauss_params
        ex = ExchangeStats()
        ranks_of_cells = cell_ranks(self.world_size, self.world_size)
        tree = self.cells.tree if self.cells is not None else None
        if tree is None:
            tree = build_global(params["means"], self.world_size, stats=ex)
            force = False
        counts, rows = self._sizes_and_strategy_rows(ex)
        self._total = sum(counts)
        tree, cell_of, rebuilt, _ = rebalance_cells(
            params, optimizers, tree, ranks_of_cells, self.config.rebalance_threshold, force=force, stats=ex, extra=rows,
            counts=counts,
        )
        self.model.strategy_state.update(rows)
        self.cells = CellState(tree, ranks_of_cells, cell_of)
        return int(ex.payload_bytes + ex.meta_bytes), bool(rebuilt)

    def _sizes_and_strategy_rows(self, stats: ExchangeStats) -> Tuple[List[int], Dict[str, Tensor]]:
        """Collective, one all_gather: every rank's Gaussian count (the cells' balance) and which
        densification statistics with one row per local Gaussian every rank has (the migration's
        wire format needs the same entries everywhere); the others are reset to None. Returns
        (counts per rank, the agreed statistics)."""
        state = self.model.strategy_state
        n = int(self.model.gauss_params["means"].shape[0])
        keys = [k for k in STRATEGY_ROW_KEYS if k in state]
        have = [int(isinstance(state.get(k), Tensor) and state[k].dim() > 0 and state[k].shape[0] == n) for k in keys]
        table = all_gather_ints([n] + have, None, stats, phase="cell sizes and densification statistics").tolist()
        counts = [int(row[0]) for row in table]
        rows = {}
        for j, k in enumerate(keys):
            if min(row[1 + j] for row in table) > 0:
                rows[k] = state[k]
            elif isinstance(state.get(k), Tensor):
                state[k] = None  # the strategy re-creates it (zeros) at its next step
        return counts, rows

    def step_stats(self):
        got, self._pending = self._pending, None
        if got is None:
            return CommStats(meta_bytes=self._migration_bytes), {}
        st = got
        stats = CommStats(
            forward_bytes=int(st.forward_bytes),
            backward_bytes=int(st.backward_bytes),
            forward_records=int(st.sent_pixels),  # pixel: remote (view, cell) pixels whose color was sent
            backward_records=int(st.sent_pixels),
            meta_bytes=int(st.meta_bytes) + self._meta,
        )
        extra = {
            "unpruned_bytes": float(st.unpruned_bytes),
            "saved_geometric_bytes": float(st.saved_geometric_bytes),
            "saved_transmittance_bytes": float(st.saved_transmittance_bytes),
            "migration_bytes": float(self._migration_bytes),
            "leaked_pixels": float(st.leaked_pixels),
        }
        for r in range(self.world_size):
            extra[f"idle_seconds_rank{r}"] = float(st.wait_s) if r == self.rank else 0.0
        return stats, extra


def _empty_info(views: Views, n: int, device: torch.device) -> Dict[str, Any]:
    """The strategy's ``info`` for a rank whose cell reached no view: zero gradients, nothing visible."""
    B = views.num_views
    means2d = torch.zeros(B, n, 2, device=device, requires_grad=True)
    means2d.grad = torch.zeros_like(means2d)
    means2d.absgrad = torch.zeros_like(means2d)  # type: ignore[attr-defined]
    return {"means2d": means2d, "radii": torch.zeros(B, n, dtype=torch.int32, device=device), "width": views.width,
            "height": views.height, "n_cameras": B, "camera_ids": None, "gaussian_ids": None}


EXCHANGES = {"dense": RecordExchange, "sparse-grad": RecordExchange, "pixel": PixelExchange}


def make_batch_exchange(name: str, model, config, rank: int, world_size: int) -> BatchExchange:
    """The exchange of a resolved communicator name (dense, sparse-grad or pixel)."""
    try:
        cls = EXCHANGES[name]
    except KeyError:
        raise ValueError(f"Unknown communicator '{name}'; choose one of {', '.join(EXCHANGES)} (or auto).") from None
    return cls(name, model, config, rank, world_size)
