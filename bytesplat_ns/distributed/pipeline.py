"""nerfstudio integration of the sharded step: a pipeline without DDP and a trainer that checkpoints it.

``ShardedPipeline`` (a ``VanillaPipeline``) never wraps the model in DDP. After the model is built
(the same initial Gaussians on every rank: rank 0's are broadcast), each rank keeps only its
contiguous shard of the Gaussians; the trainer then builds the optimizers from the shard, so each
rank also owns only its shard's optimizer state. A training step:

- every rank draws the SAME batch of ``views_per_step`` training views (a per-epoch permutation
  seeded by ``--machine.seed`` and the epoch: no communication), spread over the ranks
  (``step.assign_views``);
- ``get_train_loss_dict`` runs ``step.sharded_render_loss`` (projection of the shard into every
  view, exchange of 2D records, compositing and splatfacto's loss on the rank's own views); the
  returned ``main_loss`` is this rank's share plus the detached rest of the batch loss, so its
  value is the batch loss and its gradient is this rank's share: nerfstudio's ``loss.backward()``
  runs the gradient exchange and the shard's own backward;
- callbacks after the iteration (after the model's densification, which runs per shard on the
  statistics the owner received from every renderer): log the bytes every communicator sent this
  step (summed over ranks) to nerfstudio's writer under ``communication/*``, rebalance the shards
  when they drift more than ``rebalance_threshold`` (parameters, Adam state and densification
  statistics move together), and before a checkpoint gather every rank's Gaussians and Adam state
  on rank 0 (a collective in a callback: nerfstudio saves on rank 0 only, so ``state_dict`` never
  runs a collective).

``ShardedTrainer`` scales the Gaussian learning rates for the batch (``step.scale_adam_for_batch``:
lr and the scheduler's final lr times sqrt(B), Adam betas to the power B), writes checkpoints on
rank 0 only from the gathered copy (the same format as ``ns-train bytesplat``, so ``ns-viewer``,
``ns-export gaussian-splat`` and ``ns-eval`` load them in one process), and loads a checkpoint of
any rank count by slicing the full Gaussians and their Adam state into this run's shards.

The viewer and evaluation during training (DESIGN "Distributed": never a collective from the viewer
thread or inside ``state_dict``): rank 0 keeps a FULL copy of the Gaussians (``full_model()``, a
second model object that is not registered in the pipeline, so checkpoints do not carry it),
refreshed by the after-iteration callback (a gather from every rank, under nerfstudio's train lock):
every ``--pipeline.full-copy-steps`` steps while a viewer runs, before every step with an
evaluation, and from the gather of every checkpoint. The viewer renders from it (``ShardedTrainer``
points the viewer's ``get_model`` at it), and ``get_eval_*`` render from it on rank 0; the other
ranks skip evaluation (nerfstudio's writer only records rank 0) and wait for rank 0 at the next
step's first collective (the wait is bounded by the process-group timeout, not by the step
watchdog: a barrier before the next step's watchdog is armed). With one process the model itself
is the full copy.

``--pipeline.communicator pixel`` (docs/pixel_exchange.md, "In the nerfstudio pipeline"): ownership
by kd cell (one per rank) instead of a contiguous shard; the step exchanges partial images
(``pixel.pixel_render_loss``); after every iteration the cells are rebalanced and Gaussians that left
their rank's cell migrate with their Adam state and densification statistics; checkpoints are
gathered as above (rank order) and re-partitioned on load. ``auto`` picks ``sparse-grad`` or
``pixel`` at start (``auto.choose``; rank 0 prints the reason). With ``pixel`` the compositor
(``--pipeline.compositor``, auto: fused on CUDA, reference elsewhere) picks the renderer of each
rank's cell (``pixel.render_cell``); it runs on CPU with gloo and on GPUs with NCCL.

Not supported yet in sharded mode (a clear error at start): camera pose optimisation, the
bilateral grid, masks, training views of different resolutions in one batch.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Literal, Mapping, Optional, Type

import torch
import torch.distributed as dist
from nerfstudio.engine.callbacks import TrainingCallback, TrainingCallbackAttributes, TrainingCallbackLocation
from nerfstudio.pipelines.base_pipeline import VanillaPipeline, VanillaPipelineConfig
from nerfstudio.utils import writer
from nerfstudio.utils.decorators import check_main_thread
from nerfstudio.utils.misc import step_check
from nerfstudio.utils.rich_utils import CONSOLE

from bytesplat_ns.distributed.communicators import CommStats, make_communicator
from bytesplat_ns.distributed.pixel import CellState, PixelConfig, pixel_render_loss, resolve_renderer
from bytesplat_ns.distributed.exchange import ExchangeStats, all_reduce_, comm_device, rank_and_world, wrap_failure
from bytesplat_ns.distributed.runtime import StepWatchdog, share_cpu_threads
from bytesplat_ns.distributed.sharding import ShardLayout, gather_layout, gather_to_rank0, rebalance
from bytesplat_ns.distributed.step import (
    PARAM_NAMES,
    Views,
    assign_views,
    scale_adam_for_batch,
    sharded_render_loss,
    splatfacto_loss,
)
from bytesplat_ns.errors import BytesplatError
from bytesplat_ns.trainer import (
    ByteSplatTrainer,
    ByteSplatTrainerConfig,
    resume_pipeline,
)

ADAM_ROW_KEYS = ("exp_avg", "exp_avg_sq", "max_exp_avg_sq")
STRATEGY_ROW_KEYS = ("grad2d", "count", "radii")


@dataclass
class ShardedPipelineConfig(VanillaPipelineConfig):
    """A pipeline whose Gaussians are sharded over the ranks (no DDP)."""

    _target: Type = field(default_factory=lambda: ShardedPipeline)
    communicator: Literal["dense", "sparse-grad", "pixel", "auto"] = "sparse-grad"
    """How ranks share the work of a view: dense / sparse-grad move 2D Gaussian records (all gradients back /
    non-zero only); pixel (Splaxel) gives each rank a kd cell of Gaussians and moves partial images; auto picks
    sparse-grad or pixel at start from a cost model of bytes per step (auto.py; the reason is logged)."""
    pixel_geometric: bool = True
    """pixel: send each cell's partial only inside its projected bounding rectangle (exact)."""
    pixel_transmittance: bool = False
    """pixel: send colors and gradients only where the transmittance in front of the cell is above 1e-4."""
    views_per_step: int = 0
    """Training views per step (the batch), spread over the ranks; 0 means one per rank."""
    rebalance_threshold: float = 0.1
    """Re-cut the shards evenly when a shard's size differs from the mean by more than this fraction."""
    step_timeout: float = 0.0
    """Seconds after which a rank stuck in one training step ends itself with a clear error (0: off)."""
    compositor: Literal["auto", "reference", "fused"] = "auto"
    """How a rank composites (and scores) the gathered 2D records of its views: reference (PyTorch, any
    device) or fused (bytesplat's CUDA kernels: the fused loss kernel per view, GPU and RGB only);
    auto: fused on CUDA, reference otherwise. With --pipeline.communicator pixel it picks how each rank
    renders its cell into partial color and transmittance: reference (PyTorch, any device) or fused
    (bytesplat's CUDA tile rasterizer, GPU and RGB only); the partials are composited in PyTorch."""
    full_copy_steps: int = 100
    """While a viewer runs, gather every rank's Gaussians into rank 0's full copy (what the viewer renders)
    every this many steps (0: never for the viewer). The copy is always refreshed before an evaluation
    step and at checkpoints."""


def _strip_module(state: Mapping[str, Any]) -> Dict[str, Any]:
    return {(k[len("module.") :] if k.startswith("module.") else k): v for k, v in state.items()}


class ShardedPipeline(VanillaPipeline):
    config: ShardedPipelineConfig

    def __init__(
        self,
        config: ShardedPipelineConfig,
        device: str,
        test_mode: Literal["test", "val", "inference"] = "val",
        world_size: int = 1,
        local_rank: int = 0,
        grad_scaler=None,
    ):
        rank, world = rank_and_world()
        if str(device).startswith("cuda") and ":" in str(device):
            torch.cuda.set_device(torch.device(device))  # NCCL collectives use the current device
        share_cpu_threads(int(os.environ.get("LOCAL_WORLD_SIZE", world)))
        if world != world_size:
            raise BytesplatError(
                f"The trainer was set up for {world_size} processes but the process group has {world}.",
                hint="Launch with `torchrun --nproc-per-node N -m bytesplat_ns.train ...`.",
            )
        # Rank 0 first: it may generate/cache the built-in scene; the others then read the cache.
        if rank != 0:
            _barrier("waiting for rank 0 to prepare the data")
        super().__init__(config, device, test_mode, world_size=1, local_rank=local_rank, grad_scaler=grad_scaler)
        if rank == 0 and world > 1:
            _barrier("data prepared on rank 0")
        self.world_size = world
        self.rank = rank
        self.views_per_step = config.views_per_step or world
        self.comm_name = config.communicator
        self.auto_decision = None
        self.cells: Optional[CellState] = None
        self._pending_pixel_stats = None
        self._cells_rebuilt = False
        self._migration_bytes = 0
        self._check_supported()
        self.last_stats = CommStats()
        self._pending_stats: Optional[CommStats] = None
        self._checkpoint: Optional[Dict[str, Any]] = None
        self._sampler_epoch = -1
        self._sampler_order: List[int] = []
        self._watchdog = StepWatchdog(config.step_timeout) if config.step_timeout > 0 else None
        # Rank 0's full copy of the Gaussians (viewer, evaluation). Kept out of the module tree
        # (plain __dict__ entry) so that state_dict(), .to() and .train()/.eval() ignore it.
        self.__dict__["_full_copy"] = None
        self.full_copy_step: Optional[int] = None
        self._eval_ran = False
        self._share_initial_gaussians()
        self.communicator = make_communicator(self.comm_name) if self.comm_name != "pixel" else None
        if self.comm_name == "pixel":
            # The cells are rendered by the compositor's renderer (pixel.render_cell): fused on CUDA
            # (the fused-on-CPU case was refused in _check_supported), reference elsewhere.
            self.partition_cells(None, force=True)

    # ---- setup ----
    def _check_supported(self) -> None:
        from bytesplat_ns.model import ByteSplatModel

        model = self.model
        if not isinstance(model, ByteSplatModel):
            raise BytesplatError(f"Sharded training needs the bytesplat model, got {type(model).__name__}.")
        if model.config.camera_optimizer.mode != "off":
            raise BytesplatError(
                "Camera pose optimisation is not supported with sharded Gaussians yet.",
                hint="Add --pipeline.model.camera-optimizer.mode off.",
            )
        if getattr(model.config, "use_bilateral_grid", False):
            raise BytesplatError("The bilateral grid is not supported with sharded Gaussians yet.")
        if self.config.compositor == "fused" and not self._on_cuda():
            raise BytesplatError(
                "--pipeline.compositor fused needs CUDA GPUs.", hint="Use --pipeline.compositor reference on the CPU."
            )

    def _on_cuda(self) -> bool:
        return str(self.device).startswith("cuda")

    @property
    def compositor(self) -> str:
        """The compositor in use: ``auto`` resolved against this rank's device (the pixel exchange's
        cell-renderer rule, which is the same: fused on CUDA, reference elsewhere)."""
        return resolve_renderer(self.config.compositor, torch.device(self.device))

    def _share_initial_gaussians(self) -> None:
        """Broadcast rank 0's Gaussians (ranks seed their RNGs differently), keep this rank's shard."""
        params = self.model.gauss_params
        dev = comm_device()
        total = int(params["means"].shape[0])
        if self.world_size > 1:
            counts = gather_layout(total).counts
            if len(set(counts)) != 1:
                raise BytesplatError(f"Ranks built different initial models (Gaussian counts {counts}).")
            for name in list(params.keys()):
                buf = params[name].detach().to(dev).contiguous()
                try:
                    dist.broadcast(buf, src=0)
                except Exception as error:  # noqa: BLE001
                    raise wrap_failure("broadcasting the initial Gaussians", 0, error) from error
                params[name] = torch.nn.Parameter(buf.to(params[name].device))
        if self.world_size > 1 and self.rank == 0:
            # The model still holds every Gaussian: the first full copy is a deep copy of it.
            full = copy.deepcopy(self._model)
            full.requires_grad_(False)
            self.__dict__["_full_copy"] = full
            self.full_copy_step = -1
        if self.config.communicator == "auto":
            self._choose_communicator(params)
        layout = ShardLayout.even(total, self.world_size)
        start, end = layout.range(self.rank)
        for name in list(params.keys()):
            params[name] = torch.nn.Parameter(params[name].detach()[start:end].clone())

    def _choose_communicator(self, params) -> None:
        """``auto``: the cost model of auto.py on the (identical, just broadcast) initial Gaussians and
        the first batch's cameras; every rank computes the same answer, rank 0 logs the reason."""
        from bytesplat_ns.distributed.auto import choose

        views = self._camera_views(self._sample_views(0), self.datamanager.train_dataset.cameras)
        means = params["means"].detach().cpu()
        scales = torch.exp(params["scales"].detach().cpu())
        decision = choose(means, scales, views, self.world_size)
        self.auto_decision = decision
        self.comm_name = decision.choice
        if self.rank == 0:
            # One plain line (not wrapped by the console's width), so logs can be grepped.
            print(f"bytesplat: {decision.log_line()}", flush=True)

    # ---- pixel: ownership by kd cells ----
    def _my_cell(self) -> int:
        return self.rank  # one cell per rank (cell_ranks(world, world))

    def _strategy_rows(self) -> Dict[str, torch.Tensor]:
        """Densification statistics with one row per local Gaussian, agreed on by every rank (the
        migration's wire format needs the same entries everywhere); others are reset to None."""
        state = self.model.strategy_state
        n = int(self.model.gauss_params["means"].shape[0])
        keys = [k for k in STRATEGY_ROW_KEYS if k in state]
        have = [1.0 if isinstance(state.get(k), torch.Tensor) and state[k].dim() > 0 and state[k].shape[0] == n else 0.0 for k in keys]
        if self.world_size > 1 and keys:
            flags = torch.tensor(have, dtype=torch.float64, device=comm_device())
            all_reduce_(flags, dist.ReduceOp.MIN, phase="agreeing on densification statistics")
            have = flags.cpu().tolist()
        rows = {}
        for k, h in zip(keys, have):
            if h > 0:
                rows[k] = state[k]
            elif isinstance(state.get(k), torch.Tensor):
                state[k] = None  # the strategy re-creates it (zeros) at its next step
        return rows

    def partition_cells(self, optimizers, force: bool = False) -> int:
        """pixel (collective): rebuild the kd cells when the ranks' counts drift more than
        ``rebalance_threshold`` (or ``force``), and migrate every Gaussian that is not on its cell's
        rank, with its Adam state (``optimizers``: name -> optimizer, or None before they exist) and
        densification statistics. Returns the bytes this rank sent."""
        from bytesplat_ns.distributed.cells import build_global, cell_ranks, rebalance_cells

        params = self.model.gauss_params
        ex = ExchangeStats()
        ranks_of_cells = cell_ranks(self.world_size, self.world_size)
        tree = self.cells.tree if self.cells is not None else None
        if tree is None:
            tree = build_global(params["means"], self.world_size, stats=ex)
            force = False
        rows = self._strategy_rows()
        tree, cell_of, rebuilt, sent = rebalance_cells(
            params, optimizers, tree, ranks_of_cells, self.config.rebalance_threshold, force=force, stats=ex, extra=rows
        )
        self.model.strategy_state.update(rows)
        self.cells = CellState(tree, ranks_of_cells, cell_of)
        self._cells_rebuilt = bool(rebuilt)
        return int(ex.payload_bytes + ex.meta_bytes)

    # ---- rank 0's full copy (viewer, evaluation) ----
    def full_model(self):
        """The model holding EVERY Gaussian, to render the whole scene: rank 0's full copy when sharded
        over several ranks (None on the other ranks), the model itself in one process. Never runs a
        collective (the viewer thread calls it)."""
        if self.world_size == 1:
            return self.model
        return self.__dict__["_full_copy"]

    def _set_full_copy(self, params: Mapping[str, torch.Tensor], step: int) -> None:
        full = self.__dict__["_full_copy"]
        if full is None:
            return
        device = next(iter(self.model.gauss_params.values())).device
        for n in PARAM_NAMES:
            full.gauss_params[n] = torch.nn.Parameter(params[n].detach().to(device), requires_grad=False)
        full.step = int(step)
        self.full_copy_step = int(step)

    def refresh_full_copy(self, step: int) -> None:
        """Collective (every rank calls it between steps): gather all shards into rank 0's full copy."""
        if self.world_size == 1:
            return
        full = gather_to_rank0({n: self.model.gauss_params[n].detach() for n in PARAM_NAMES})
        if full is not None:
            self._set_full_copy(full, step)

    def _full_copy_due(self, step: int, trainer) -> bool:
        """Whether the copy is refreshed after ``step`` (the same answer on every rank: config only)."""
        cfg = trainer.config
        if self._evaluates(step, cfg):
            return True
        viewer = cfg.is_viewer_enabled() or cfg.is_viewer_legacy_enabled()
        k = self.config.full_copy_steps
        return viewer and k > 0 and step_check(step, k, run_at_zero=True)

    @staticmethod
    def _evaluates(step: int, cfg) -> bool:
        """nerfstudio's Trainer.eval_iteration runs an evaluation after ``step``."""
        if not (cfg.is_wandb_enabled() or cfg.is_tensorboard_enabled() or cfg.is_comet_enabled()):
            return False
        return any(step_check(step, n) for n in (cfg.steps_per_eval_batch, cfg.steps_per_eval_image, cfg.steps_per_eval_all_images))

    @contextlib.contextmanager
    def _rendering_full_copy(self):
        """Rank 0: ``self.model`` is the full copy inside the block (evaluation runs on the main
        thread under the train lock, like the viewer's renders, so nobody sees the swap)."""
        full = self.full_model()
        if self.world_size == 1 or full is None:
            yield
            return
        training_model = self._modules["_model"]
        self._modules["_model"] = full
        try:
            yield
        finally:
            self._modules["_model"] = training_model

    def _skips_eval(self) -> bool:
        """Ranks other than 0 do not evaluate (only rank 0 writes; it renders the full copy)."""
        return self.world_size > 1 and self.rank != 0

    def get_eval_loss_dict(self, step: int):
        if self._skips_eval():
            self._eval_ran = True
            return {}, {"main_loss": torch.zeros((), device=self.device)}, {}
        self._eval_ran = True
        with self._rendering_full_copy():
            return super().get_eval_loss_dict(step)

    def get_eval_image_metrics_and_images(self, step: int):
        self._eval_ran = True
        if self._skips_eval():
            time.sleep(1e-3)  # the trainer divides num_rays by this call's duration
            return {"num_rays": 1}, {}
        with self._rendering_full_copy():
            return super().get_eval_image_metrics_and_images(step)

    def get_average_eval_image_metrics(self, step: Optional[int] = None, output_path: Optional[Path] = None, get_std: bool = False):
        self._eval_ran = True
        if self._skips_eval():
            return {}
        with self._rendering_full_copy():
            return super().get_average_eval_image_metrics(step, output_path, get_std)

    # ---- the training step ----
    def _sample_views(self, step: int) -> List[int]:
        """The same B training views on every rank: a per-epoch permutation seeded by the epoch."""
        n = len(self.datamanager.train_dataset)
        B = self.views_per_step
        seed = int(getattr(self.datamanager.config, "seed", 0) or 0)
        out: List[int] = []
        position = step * B
        while len(out) < B:
            epoch, offset = divmod(position, n)
            if epoch != self._sampler_epoch:
                gen = torch.Generator().manual_seed(1_000_003 * epoch + seed + 12345)
                self._sampler_order = torch.randperm(n, generator=gen).tolist()
                self._sampler_epoch = epoch
            out.append(self._sampler_order[offset])
            position += 1
        return out

    def _camera_views(self, indices: List[int], cams) -> Views:
        """The batch's cameras as ``Views`` (no images yet)."""
        from bytesplat_ns.model import viewmat_from_camera_to_world

        model = self.model
        # rescaled and read on the host, then two copies to the device (not one blocking copy per
        # camera field, plus the size read-back)
        cameras = cams[torch.tensor(indices, dtype=torch.long)].to("cpu")
        scale = model._get_downscale_factor()
        cameras.rescale_output_resolution(1 / scale)
        widths = {int(w) for w in cameras.width.reshape(-1).tolist()}
        heights = {int(h) for h in cameras.height.reshape(-1).tolist()}
        if len(widths) != 1 or len(heights) != 1:
            raise BytesplatError("Sharded training needs training views of one resolution per batch.")
        Ks = cameras.get_intrinsics_matrices().to(self.device)
        viewmats = viewmat_from_camera_to_world(cameras.camera_to_worlds.to(self.device))
        B = len(indices)
        return Views(viewmats, Ks, widths.pop(), heights.pop(), [None] * B, torch.zeros(B, 3, device=self.device))

    def _batch(self, step: int) -> Views:
        model = self.model
        indices = self._sample_views(step)
        cached = self.datamanager.cached_train  # loads (and undistorts) images, sets train_cameras
        views = self._camera_views(indices, self.datamanager.train_cameras)
        B = len(indices)
        # pixel: the view schedule is decided inside the step (from the cells' bounds), so every
        # rank has every image of the batch at hand.
        mine = list(range(B)) if self.comm_name == "pixel" else assign_views(B, self.world_size)[self.rank]
        images: List[Optional[torch.Tensor]] = list(views.images)
        backgrounds = views.backgrounds
        for v in mine:
            data = cached[indices[v]]
            if "mask" in data:
                raise BytesplatError("Masks are not supported with sharded Gaussians yet.")
            background = model._get_background_color()
            backgrounds[v] = background
            gt = model.get_gt_img(data["image"].to(self.device))
            images[v] = model.composite_with_background(gt, background)
        return Views(views.viewmats, views.Ks, views.width, views.height, images, backgrounds)  # type: ignore[arg-type]

    def _sh_degree(self) -> Optional[int]:
        cfg = self.model.config
        if cfg.sh_degree > 0:
            return min(self.model.step // cfg.sh_degree_interval, cfg.sh_degree)
        return None

    def get_train_loss_dict(self, step: int):
        if self._watchdog is not None:
            self._watchdog.arm(f"training step {step}")
        self._step_started = time.perf_counter()
        model = self.model
        views = self._batch(step)
        lam = model.config.ssim_lambda
        if self.comm_name == "pixel":
            return self._pixel_loss_dict(step, views, lam)
        fwd = sharded_render_loss(
            model.gauss_params,
            views,
            self.communicator,
            self._sh_degree(),
            functools.partial(splatfacto_loss, ssim_lambda=lam),  # recognised by the fused compositor
            absgrad=bool(getattr(model.strategy, "absgrad", False)),
            compositor=self.compositor,
        )
        model.info = fwd.info
        if getattr(model, "optimizers", None) is not None:
            model.strategy.step_pre_backward(model.gauss_params, model.optimizers, model.strategy_state, step, model.info)
        meta = ExchangeStats()
        loss_dict = self._batch_loss_dict(step, fwd.local_loss, fwd.layout.total, meta)
        fwd.stats.meta_bytes += meta.meta_bytes
        self._pending_stats = fwd.stats
        metrics = {"gaussian_count": fwd.layout.total, "shard_gaussians": int(fwd.layout.counts[self.rank])}
        return {}, loss_dict, metrics

    def _batch_loss_dict(self, step: int, local_loss: torch.Tensor, total_gaussians: int, meta: ExchangeStats) -> Dict:
        """Both communicator families' loss dict (collective): this rank's loss share and, every 10
        steps, its share of splatfacto's scale regulariser over the whole scene's Gaussians, summed over
        the ranks. Value: the whole batch's; gradient: this rank's share only."""
        model = self.model
        local_terms = [local_loss]
        use_reg = model.config.use_scale_regularization and step % 10 == 0
        if use_reg:
            scale_exp = torch.exp(model.gauss_params["scales"])
            ratio = torch.maximum(
                scale_exp.amax(dim=-1) / scale_exp.amin(dim=-1), torch.tensor(model.config.max_gauss_ratio, device=scale_exp.device)
            )
            local_terms.append(0.1 * (ratio - model.config.max_gauss_ratio).sum() / max(1, total_gaussians))
        totals = torch.stack([t.detach().to(torch.float64) for t in local_terms]).to(comm_device())
        all_reduce_(totals, stats=meta, phase="summing the batch loss")
        totals = totals.to(local_loss.device, local_loss.dtype)
        loss_dict = {"main_loss": local_terms[0] + (totals[0] - local_terms[0]).detach()}
        if use_reg:
            loss_dict["scale_reg"] = local_terms[1] + (totals[1] - local_terms[1]).detach()
        return loss_dict

    def _pixel_loss_dict(self, step: int, views: Views, lam: float):
        """pixel: render this rank's cell into every view, exchange partial images (pixel.py)."""
        model = self.model
        params = model.gauss_params
        n = int(params["means"].shape[0])
        absgrad = bool(getattr(model.strategy, "absgrad", False))
        # Every local Gaussian belongs to this rank's cell until the next migration moves it (also
        # one that wandered out of the cell: the composite's order is then approximate for it).
        self.cells.cell_of = torch.full((n,), self._my_cell(), dtype=torch.int64, device=params["means"].device)
        cfg = PixelConfig(geometric=self.config.pixel_geometric, transmittance=self.config.pixel_transmittance)
        fwd = pixel_render_loss(
            params, self.cells, views, self._sh_degree(), cfg, functools.partial(splatfacto_loss, ssim_lambda=lam), absgrad=absgrad,
            renderer=self.compositor,
        )
        info = fwd.infos.get(self._my_cell())
        if info is None or n == 0:
            B = views.num_views
            means2d = torch.zeros(B, n, 2, device=params["means"].device, requires_grad=True)
            means2d.grad = torch.zeros_like(means2d)
            means2d.absgrad = torch.zeros_like(means2d)  # type: ignore[attr-defined]
            info = {"means2d": means2d, "radii": torch.zeros(B, n, dtype=torch.int32, device=means2d.device), "width": views.width,
                    "height": views.height, "n_cameras": B, "camera_ids": None, "gaussian_ids": None}
        model.info = info
        if getattr(model, "optimizers", None) is not None:
            model.strategy.step_pre_backward(model.gauss_params, model.optimizers, model.strategy_state, step, model.info)
        meta = ExchangeStats()
        layout = gather_layout(n, None, meta)
        loss_dict = self._batch_loss_dict(step, fwd.local_loss, layout.total, meta)
        st = fwd.stats
        # Filled in by the backward (bytes sent back, bytes saved): read after the iteration.
        self._pending_pixel_stats = (st, int(meta.meta_bytes))
        metrics = {"gaussian_count": layout.total, "shard_gaussians": n}
        return {}, loss_dict, metrics

    def _pixel_comm_stats(self):
        """(CommStats, extra scalars per rank) of the last pixel step, with this step's migration."""
        got = getattr(self, "_pending_pixel_stats", None)
        self._pending_pixel_stats = None
        if got is None:
            return CommStats(meta_bytes=self._migration_bytes), {}
        st, meta = got
        stats = CommStats(
            forward_bytes=int(st.forward_bytes),
            backward_bytes=int(st.backward_bytes),
            forward_records=int(st.sent_pixels),  # pixel: remote (view, cell) pixels whose color was sent
            backward_records=int(st.sent_pixels),
            meta_bytes=int(st.meta_bytes) + meta,
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

    # ---- callbacks ----
    def get_training_callbacks(self, attrs: TrainingCallbackAttributes) -> List[TrainingCallback]:
        callbacks = super().get_training_callbacks(attrs)
        trainer = attrs.trainer
        callbacks.append(
            TrainingCallback([TrainingCallbackLocation.AFTER_TRAIN_ITERATION], self._after_iteration, kwargs={"trainer": trainer})
        )
        callbacks.append(TrainingCallback([TrainingCallbackLocation.BEFORE_TRAIN_ITERATION], self._before_iteration))
        return callbacks

    def _before_iteration(self, step: int) -> None:
        # After an evaluation step the other ranks wait here for rank 0 (bounded by the process
        # group's timeout), before the step watchdog is armed for the next step.
        if self.world_size > 1 and self._eval_ran:
            _barrier("waiting for rank 0's evaluation")
        self._eval_ran = False

    def _after_iteration(self, step: int, trainer) -> None:
        model = self.model
        opts = trainer.optimizers
        gaussian_opts = {name: opts.optimizers[name] for name in PARAM_NAMES if name in opts.optimizers}
        if self.comm_name == "pixel":
            self._migration_bytes = self.partition_cells(gaussian_opts)
            for name in gaussian_opts:
                opts.parameters[name] = [model.gauss_params[name]]
            if self._cells_rebuilt:
                CONSOLE.log(f"bytesplat: step {step}: kd cells rebuilt and Gaussians migrated")
            self._log_communication(step)
            self._gather_if_due(step, trainer)
            return
        self._log_communication(step)
        strategy_rows = {k: model.strategy_state.get(k) for k in STRATEGY_ROW_KEYS if isinstance(model.strategy_state.get(k), torch.Tensor)}
        moved, layout = rebalance(model.gauss_params, gaussian_opts, self.config.rebalance_threshold, extra=strategy_rows)
        if moved:
            model.strategy_state.update(strategy_rows)
            for name in gaussian_opts:
                opts.parameters[name] = [model.gauss_params[name]]
            CONSOLE.log(f"bytesplat: step {step}: shards rebalanced to {layout.counts}")
        self._gather_if_due(step, trainer)

    def _gather_if_due(self, step: int, trainer) -> None:
        final = trainer._start_step + trainer.config.max_num_iterations - 1
        gathered = step_check(step, trainer.config.steps_per_save) or step == final
        if gathered:
            self.gather_checkpoint(step, trainer)
            if self._checkpoint is not None and self._checkpoint["step"] == step:
                self._set_full_copy(self._checkpoint["params"], step)  # the same gather serves the copy
        elif self.world_size > 1 and self._full_copy_due(step, trainer):
            self.refresh_full_copy(step)
        if self._watchdog is not None:
            self._watchdog.disarm()

    def _log_communication(self, step: int) -> None:
        extra: Dict[str, float] = {}
        if self.comm_name == "pixel":
            stats, extra = self._pixel_comm_stats()
        else:
            stats = self._pending_stats or CommStats()
        self._pending_stats = None
        local = {**stats.as_dict(), **extra}
        keys = list(local)
        vec = torch.tensor([float(local[k]) for k in keys], dtype=torch.float64, device=comm_device())
        all_reduce_(vec, phase="summing communication statistics")
        summed = dict(zip(keys, vec.cpu().tolist()))
        self.last_stats = CommStats(**{k: int(v) for k, v in summed.items() if k not in extra})
        writer.put_dict(
            name="communication",
            scalar_dict={f"{self.comm_name}/{k}": v for k, v in summed.items()},
            step=step,
        )
        started = getattr(self, "_step_started", None)
        if started is not None:
            # Forward, exchanges, backward, optimizer step and densification of this step; the
            # all_reduce above waited for the device, so this is wall time, not launch time.
            seconds = max(time.perf_counter() - started, 1e-9)
            self._step_started = None
            writer.put_dict(
                name="throughput",
                scalar_dict={"step_seconds": seconds, "views_per_second": self.views_per_step / seconds},
                step=step,
            )

    def gather_checkpoint(self, step: int, trainer) -> None:
        """Collective: every rank's Gaussians and their Adam state, concatenated on rank 0."""
        params = self.model.gauss_params
        opts = trainer.optimizers.optimizers
        tensors: Dict[str, torch.Tensor] = {f"param/{n}": params[n].detach() for n in PARAM_NAMES}
        row_keys: Dict[str, List[str]] = {}
        for name in PARAM_NAMES:
            opt = opts.get(name)
            state = opt.state.get(params[name], {}) if opt is not None else {}
            row_keys[name] = [k for k in ADAM_ROW_KEYS if isinstance(state.get(k), torch.Tensor) and state[k].shape == params[name].shape]
            for k in row_keys[name]:
                tensors[f"adam/{name}/{k}"] = state[k]
        # All ranks must send the same entries; the first step gives every rank Adam state at once.
        full = gather_to_rank0(tensors)
        if full is None:
            return
        optimizers: Dict[str, Any] = {}
        for name, opt in opts.items():
            sd = opt.state_dict()
            sd["state"] = {i: dict(st) for i, st in sd["state"].items()}  # state_dict shares the live dicts
            if name in PARAM_NAMES and sd["state"]:
                for k in row_keys[name]:
                    sd["state"][0][k] = full[f"adam/{name}/{k}"]
            optimizers[name] = sd
        self._checkpoint = {
            "step": step,
            "params": {n: full[f"param/{n}"] for n in PARAM_NAMES},
            "optimizers": optimizers,
        }

    # ---- checkpoints ----
    def checkpoint_state(self, step: int) -> Dict[str, Any]:
        """Rank 0: the full pipeline state and optimizer states gathered for ``step`` (no collective)."""
        if self.world_size == 1 and (self._checkpoint is None or self._checkpoint["step"] != step):
            return {"pipeline": super().state_dict(), "optimizers": None}
        if self._checkpoint is None or self._checkpoint["step"] != step:
            have = None if self._checkpoint is None else self._checkpoint["step"]
            raise BytesplatError(f"No gathered copy of the Gaussians for step {step} (latest: {have}); not writing a partial checkpoint.")
        state = super().state_dict()
        for n, t in self._checkpoint["params"].items():
            state[f"_model.gauss_params.{n}"] = t
        return {"pipeline": state, "optimizers": self._checkpoint["optimizers"]}

    def load_pipeline(self, loaded_state: Dict[str, Any], step: int) -> None:
        """Load a full checkpoint (any rank count) and keep this rank's shard."""
        state = _strip_module(loaded_state)
        total = int(state["_model.gauss_params.means"].shape[0])
        start, end = ShardLayout.even(total, self.world_size).range(self.rank)
        self.model.update_to_step(step)
        full = {n: state[f"_model.gauss_params.{n}"] for n in PARAM_NAMES}
        for n in PARAM_NAMES:
            key = f"_model.gauss_params.{n}"
            state[key] = state[key][start:end]
        self.load_state_dict(state)
        self._set_full_copy(full, step)
        self.model.strategy_state.update({k: None for k in STRATEGY_ROW_KEYS if k in self.model.strategy_state})

    def shard_range(self) -> tuple:
        layout = gather_layout(int(self.model.gauss_params["means"].shape[0]))
        return layout.range(self.rank), layout.total


def _barrier(what: str) -> None:
    if dist.is_initialized() and dist.get_world_size() > 1:
        try:
            dist.barrier()
        except Exception as error:  # noqa: BLE001
            raise wrap_failure(what, None, error) from error


# ---------------------------------------------------------------------------------------------


TORCHRUN_HINT = (
    "On CPU (gloo), launch the ranks with torchrun instead: `torchrun --nproc-per-node N -m bytesplat_ns.train "
    "bytesplat --machine.device-type cpu [ns-train arguments]` (same arguments as ns-train; see docs/distributed.md)."
)


def check_nerfstudio_launch(machine) -> None:
    """Fail early and clearly where nerfstudio 1.1.5's own launcher (``ns-train ... --machine.num-devices
    N``, N > 1) cannot work: its spawned worker asserts CUDA and one GPU per process, so it never runs
    on CPU. Not called under torchrun / ``bytesplat_ns.train`` (the process group already exists)."""
    processes = int(machine.num_devices) * int(machine.num_machines)
    if processes <= 1 or (dist.is_available() and dist.is_initialized()):
        return
    if machine.device_type != "cuda":
        raise BytesplatError(
            f"ns-train cannot start {processes} processes with --machine.device-type {machine.device_type}: "
            "nerfstudio 1.1.5's multi-process launcher only runs on CUDA GPUs (one per process).",
            hint=TORCHRUN_HINT,
        )
    if not torch.cuda.is_available():
        raise BytesplatError(
            f"--machine.num-devices {machine.num_devices} needs {machine.num_devices} CUDA GPUs, but torch sees none.",
            hint=TORCHRUN_HINT,
        )
    if torch.cuda.device_count() < int(machine.num_devices):
        raise BytesplatError(
            f"--machine.num-devices {machine.num_devices} needs {machine.num_devices} CUDA GPUs on this host, "
            f"but torch sees {torch.cuda.device_count()}.",
            hint="Lower --machine.num-devices or make more GPUs visible (CUDA_VISIBLE_DEVICES).",
        )


@dataclass
class ShardedTrainerConfig(ByteSplatTrainerConfig):
    _target: Type = field(default_factory=lambda: ShardedTrainer)


class ShardedTrainer(ByteSplatTrainer):
    pipeline: ShardedPipeline

    def setup(self, test_mode: Literal["test", "val", "inference"] = "val") -> None:
        super().setup(test_mode=test_mode)
        viewer = self.viewer_state
        if viewer is None or self.pipeline.world_size == 1:
            return
        if self.pipeline.rank == 0 and hasattr(viewer, "get_model"):
            # The viewer renders rank 0's full copy of the Gaussians (refreshed between steps), never
            # the shard and never through a collective.
            pipeline = self.pipeline
            viewer.get_model = lambda: pipeline.full_model()  # type: ignore[method-assign]
        elif self.pipeline.rank != 0:
            # nerfstudio starts a viewer on every node's local rank 0 (multi-node runs).
            CONSOLE.log(
                f"bytesplat: the viewer of rank {self.pipeline.rank} shows this rank's shard only; "
                "global rank 0's viewer shows the whole scene."
            )

    def setup_optimizers(self):
        """nerfstudio's optimizers on this rank's shard, with learning rates scaled for the batch."""
        from nerfstudio.engine.optimizers import Optimizers

        B = self.pipeline.views_per_step
        config = copy.deepcopy(self.config.optimizers)
        for name in PARAM_NAMES:
            if name not in config:
                continue
            opt_cfg = config[name]["optimizer"]
            betas = getattr(opt_cfg, "betas", (0.9, 0.999))
            lr, betas = scale_adam_for_batch(opt_cfg.lr, tuple(betas), B)
            opt_cfg.lr = lr
            opt_cfg.betas = betas  # AdamOptimizerConfig passes its attributes to torch.optim.Adam
            sched = config[name].get("scheduler")
            if sched is not None and getattr(sched, "lr_final", None) is not None:
                sched.lr_final = sched.lr_final * math.sqrt(B)
        return Optimizers(config, self.pipeline.get_param_groups())

    @check_main_thread
    def save_checkpoint(self, step: int) -> None:
        """Rank 0 writes the gathered full state (atomically; in the background unless configured off)."""
        try:
            gathered = self.pipeline.checkpoint_state(step)
        except BytesplatError as error:
            CONSOLE.print(f"[bold red]bytesplat: {error}")
            return
        state = self.checkpoint_contents(step)
        state["pipeline"] = gathered["pipeline"]
        state["optimizers"] = gathered["optimizers"] or state["optimizers"]
        self.checkpoint_writer.save(state, step)

    def _load_checkpoint(self) -> None:
        state, path = resume_pipeline(self)
        if state is None:
            return
        params = self.pipeline.model.gauss_params
        total = int(_strip_module(state["pipeline"])["_model.gauss_params.means"].shape[0])
        start, end = ShardLayout.even(total, self.pipeline.world_size).range(self.pipeline.rank)
        for name, sd in state["optimizers"].items():
            opt = self.optimizers.optimizers.get(name)
            if opt is None:
                continue
            if name in PARAM_NAMES:
                # The model's load replaced the Parameter objects: point the optimizer at the new ones.
                opt.param_groups[0]["params"] = [params[name]]
                self.optimizers.parameters[name] = [params[name]]
                sd = copy.copy(sd)
                sd["state"] = {i: dict(s) for i, s in sd["state"].items()}
                for s in sd["state"].values():
                    for k in ADAM_ROW_KEYS:
                        if isinstance(s.get(k), torch.Tensor) and s[k].dim() > 0 and s[k].shape[0] == total:
                            s[k] = s[k][start:end].clone()
            opt.load_state_dict(sd)
        if "schedulers" in state and self.config.load_scheduler:
            self.optimizers.load_schedulers(state["schedulers"])
        self.grad_scaler.load_state_dict(state["scalers"])
        if self.pipeline.comm_name == "pixel":
            # Re-partition the loaded Gaussians (any rank count) into this run's kd cells, with their
            # Adam state: the even slices above are only the starting point of the migration.
            gaussian_opts = {n: self.optimizers.optimizers[n] for n in PARAM_NAMES if n in self.optimizers.optimizers}
            self.pipeline.partition_cells(gaussian_opts, force=True)
            for name in gaussian_opts:
                self.optimizers.parameters[name] = [self.pipeline.model.gauss_params[name]]
        CONSOLE.print(f"Done loading checkpoint from {path} (rank {self.pipeline.rank}: Gaussians {start}..{end} of {total})")
