"""nerfstudio integration of the sharded step: a pipeline without DDP.

``ShardedPipeline`` (a ``VanillaPipeline``) never wraps the model in DDP. After the model is built
(the same initial Gaussians on every rank: rank 0's are broadcast), each rank keeps only its share
of the Gaussians; the trainer (``distributed/trainer.py``) then builds the optimizers from it, so
each rank also owns only its share's optimizer state, and writes checkpoints from rank 0's gathered
copy. How the ranks split a batch is the pipeline's ``exchange`` (``batch_exchange.py``), chosen by
``--pipeline.communicator``: ``dense`` / ``sparse-grad`` (contiguous shards, 2D records travel),
``pixel`` (one kd cell per rank, partial images travel; docs/pixel_exchange.md), or ``auto``, which
picks ``sparse-grad`` or ``pixel`` at start (``auto.choose``: a time model on the link a start-up probe
measures, ``link_probe``; rank 0 prints the reason). A training
step:

- every rank draws the SAME batch of ``views_per_step`` training views (a per-epoch permutation
  seeded by ``--machine.seed`` and the epoch: no communication) and loads the images the exchange
  asks for;
- ``get_train_loss_dict`` runs the exchange's ``render_loss``; the returned ``main_loss`` is this
  rank's share plus the detached rest of the batch loss, so its value is the batch loss and its
  gradient is this rank's share: nerfstudio's ``loss.backward()`` runs the gradient exchange and
  the rank's own backward;
- callbacks after the iteration (after the model's densification, which runs per rank on the
  statistics the owner received from every renderer): the exchange's ``after_step`` rebalances the
  ownership (shards re-cut when they drift more than ``rebalance_threshold``; cells rebuilt and
  Gaussians migrated), moving parameters, Adam state and densification statistics together (the
  record exchange looks only after the densification's refine steps, the only ones that change a
  shard's size); on the steps nerfstudio logs (``--logging.steps-per-log``), the bytes every rank
  sent this step are summed over the ranks and logged to nerfstudio's writer under
  ``communication/*``, and the batch loss is summed too (in between, no step pays a collective or a
  host read that only a log line needs); and before a checkpoint every rank's Gaussians and Adam state are gathered
  on rank 0 (a collective in a callback: nerfstudio saves on rank 0 only, so ``state_dict`` never
  runs a collective). Checkpoints are gathered in rank order and loaded as even slices, which the
  exchange re-partitions (``after_load``).

The compositor (``--pipeline.compositor``, auto: fused on CUDA, reference elsewhere) composites the
records of a rank's views, or renders a rank's cell with ``pixel``; both run on CPU with gloo and on
GPUs with NCCL.

The viewer and evaluation during training (docs/design.md, "Distributed design": never a collective from the viewer
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

Not supported yet in sharded mode (a clear error at start): camera pose optimisation, the
bilateral grid, masks, training views of different resolutions in one batch.
"""

from __future__ import annotations

import contextlib
import copy
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
from nerfstudio.utils.misc import step_check

from bytesplat_ns.distributed.batch_exchange import STRATEGY_ROW_KEYS, BatchExchange, make_batch_exchange
from bytesplat_ns.distributed.communicators import CommStats
from bytesplat_ns.distributed.pixel import resolve_renderer
from bytesplat_ns.distributed.exchange import ExchangeStats, all_reduce_, comm_device, rank_and_world, wrap_failure
from bytesplat_ns.distributed.runtime import StepWatchdog, share_cpu_threads
from bytesplat_ns.distributed.sharding import ShardLayout, gather_layout, gather_to_rank0
from bytesplat_ns.distributed.step import PARAM_NAMES, Views
from bytesplat_ns.errors import BytesplatError

ADAM_ROW_KEYS = ("exp_avg", "exp_avg_sq", "max_exp_avg_sq")


@dataclass
class ShardedPipelineConfig(VanillaPipelineConfig):
    """A pipeline whose Gaussians are sharded over the ranks (no DDP)."""

    _target: Type = field(default_factory=lambda: ShardedPipeline)
    communicator: Literal["dense", "sparse-grad", "pixel", "auto"] = "sparse-grad"
    """How ranks share the work of a batch (batch_exchange.py): dense / sparse-grad move 2D Gaussian records (all
    gradients back / non-zero only); pixel (Splaxel) gives each rank a kd cell of Gaussians and moves partial images;
    auto picks sparse-grad or pixel at start from a model of each one's step time on the ranks' link, measured by a
    short probe (auto.py, link_probe.py; the reason is logged)."""
    link_bandwidth_gbps: Optional[float] = None
    """auto: the link between the ranks in Gb/s for the time model; None measures it at start-up (a probe of a few
    exchanges). Give it to choose for another link than this one's (e.g. 25 for 25 Gb/s Ethernet between nodes)."""
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
    rank_timeout: float = 600.0
    """Seconds a collective waits for the other ranks before every rank stops with an error (the process
    group's timeout, under bytesplat_ns.train / torchrun)."""
    sparse_kernels: bool = True
    """sparse-grad: encode and decode the gradients with its CUDA kernels (cuda/sparse_grad.cu) where they
    build; False: the torch implementation (same bytes; A/B runs)."""
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


def strip_module(state: Mapping[str, Any]) -> Dict[str, Any]:
    """A pipeline state dict without DDP's ``module.`` prefixes (checkpoints of any launcher)."""
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
        self.comm_name = config.communicator  # auto: resolved in _share_initial_gaussians
        self.auto_decision = None
        self._check_supported()
        self.last_stats = CommStats()
        self._checkpoint: Optional[Dict[str, Any]] = None
        self._sampler_epoch = -1
        self._sampler_order: List[int] = []
        self._watchdog = StepWatchdog(config.step_timeout) if config.step_timeout > 0 else None
        self._steps_per_log = 1  # the trainer's --logging.steps-per-log, read when it asks for the callbacks
        # Rank 0's full copy of the Gaussians (viewer, evaluation). Kept out of the module tree
        # (plain __dict__ entry) so that state_dict(), .to() and .train()/.eval() ignore it.
        self.__dict__["_full_copy"] = None
        self.full_copy_step: Optional[int] = None
        self._eval_ran = False
        self._share_initial_gaussians()
        self.exchange: BatchExchange = make_batch_exchange(self.comm_name, self.model, config, rank, world)
        self.exchange.start()

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
        from bytesplat_ns.distributed.link_probe import LinkEstimate, probe_link

        gbps = self.config.link_bandwidth_gbps
        link = LinkEstimate.from_config(gbps) if gbps is not None else probe_link()  # every rank probes together
        views = self._camera_views(self._sample_views(0), self.datamanager.train_dataset.cameras)
        means = params["means"].detach().cpu()
        scales = torch.exp(params["scales"].detach().cpu())
        decision = choose(means, scales, views, self.world_size, link=link)
        self.auto_decision = decision
        self.comm_name = decision.choice
        if self.rank == 0:
            # One plain line (not wrapped by the console's width), so logs can be grepped.
            print(f"bytesplat: {decision.log_line()}", flush=True)

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
        from bytesplat_ns.data.datamanager import viewmat_from_camera_to_world

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
        mine = self.exchange.views_to_load(B)
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
        absgrad = bool(getattr(model.strategy, "absgrad", False))
        out = self.exchange.render_loss(views, self._sh_degree(), model.config.ssim_lambda, absgrad, self.compositor,
                                        logged=self.logs_at(step))
        model.info = out.info
        if getattr(model, "optimizers", None) is not None:
            model.after_training_render(step)  # statistics; visible rows: this rank's Gaussians in any view of the batch
        loss_dict = self._batch_loss_dict(step, out.local_loss, out.total_gaussians, out.meta)
        self.exchange.add_meta_bytes(int(out.meta.meta_bytes))
        metrics = {"gaussian_count": out.total_gaussians, "shard_gaussians": out.local_gaussians}
        return {}, loss_dict, metrics

    def _batch_loss_dict(self, step: int, local_loss: torch.Tensor, total_gaussians: int, meta: ExchangeStats) -> Dict:
        """Every exchange's loss dict: this rank's loss share and, every 10 steps, its share of
        splatfacto's scale regulariser over the whole scene's Gaussians. Gradient: this rank's share
        only. Value: on the steps nerfstudio logs, the whole batch's (summed over the ranks, a
        collective); in between, this rank's share (nothing reads it), so no step pays a host-side
        all_reduce that only a log line needs."""
        model = self.model
        local_terms = [local_loss]
        use_reg = model.config.use_scale_regularization and step % 10 == 0
        if use_reg:
            scale_exp = torch.exp(model.gauss_params["scales"])
            ratio = torch.maximum(
                scale_exp.amax(dim=-1) / scale_exp.amin(dim=-1), torch.tensor(model.config.max_gauss_ratio, device=scale_exp.device)
            )
            local_terms.append(0.1 * (ratio - model.config.max_gauss_ratio).sum() / max(1, total_gaussians))
        if self.world_size == 1 or not self.logs_at(step):
            names = ["main_loss", "scale_reg"][: len(local_terms)]
            return dict(zip(names, local_terms))
        totals = torch.stack([t.detach().to(torch.float64) for t in local_terms]).to(comm_device())
        all_reduce_(totals, stats=meta, phase="summing the batch loss")
        totals = totals.to(local_loss.device, local_loss.dtype)
        loss_dict = {"main_loss": local_terms[0] + (totals[0] - local_terms[0]).detach()}
        if use_reg:
            loss_dict["scale_reg"] = local_terms[1] + (totals[1] - local_terms[1]).detach()
        return loss_dict

    def logs_at(self, step: int) -> bool:
        """Whether nerfstudio's trainer logs ``step`` (its rule: every ``--logging.steps-per-log``
        steps, step 0 included); the batch loss and the communication statistics are summed over
        the ranks on these steps only."""
        return step_check(step, self._steps_per_log, run_at_zero=True)

    # ---- callbacks ----
    def get_training_callbacks(self, attrs: TrainingCallbackAttributes) -> List[TrainingCallback]:
        callbacks = super().get_training_callbacks(attrs)
        trainer = attrs.trainer
        self._steps_per_log = int(trainer.config.logging.steps_per_log)
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
        opts = trainer.optimizers
        gaussian_opts = {name: opts.optimizers[name] for name in PARAM_NAMES if name in opts.optimizers}
        if self.exchange.after_step(step, gaussian_opts):
            self.follow_replaced_parameters(opts)
        self._log_communication(step)
        self._gather_if_due(step, trainer)

    def follow_replaced_parameters(self, opts) -> None:
        """nerfstudio's optimizer bookkeeping onto the Gaussian parameters the exchange replaced."""
        for name in PARAM_NAMES:
            if name in opts.optimizers:
                opts.parameters[name] = [self.model.gauss_params[name]]

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
        stats, extra = self.exchange.step_stats()  # consumed every step
        if not self.logs_at(step):
            self._step_started = None
            return  # summed over the ranks (a collective and a host read) on logged steps only
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
        state = strip_module(loaded_state)
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
