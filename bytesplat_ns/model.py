"""The bytesplat model: splatfacto's Gaussians and training schedule, rendered through our backends.

It subclasses ``SplatfactoModel`` so ``ns-export gaussian-splat``, ``ns-viewer`` and ``ns-eval``
accept it unchanged, and replaces the parts of splatfacto 1.1.5 that only run on CUDA (hard-coded
``.cuda()`` calls, a ``torch.compile``d view matrix), need the network (LPIPS weights) or cost
seconds of start-up (torchmetrics and sklearn imports).
"""

from __future__ import annotations

import functools
import threading
from dataclasses import dataclass, field
from typing import Dict, List, Literal, Optional, Tuple, Type, Union

import numpy as np
import torch
from nerfstudio.cameras.cameras import Cameras
from nerfstudio.data.scene_box import OrientedBox
from nerfstudio.model_components.lib_bilagrid import BilateralGrid, color_correct
from nerfstudio.models.splatfacto import (
    RGB2SH,
    SplatfactoModel,
    SplatfactoModelConfig,
    num_sh_bases,
    random_quat_tensor,
    resize_image,
)
from nerfstudio.utils import writer
from nerfstudio.utils.colors import get_color
from nerfstudio.utils.rich_utils import CONSOLE
from pytorch_msssim import SSIM
from scipy.spatial import cKDTree

from bytesplat_ns.data.datamanager import host_image_size, viewmat_from_camera_to_world, world_to_camera
from bytesplat_ns.errors import BytesplatError
from bytesplat_ns.gaussian_budget import (BudgetSettings, GaussianBudget, budget_announcement, summed_over_views,
                                          view_blending_weights)
from bytesplat_ns.image_metrics import Lpips, psnr
from bytesplat_ns.optim import DeviceAdam
from bytesplat_ns.pair_capacity import PairRoom
from bytesplat_ns.raster import rasterize, resolve_backend
from bytesplat_ns.pruning import HardwarePruner
from bytesplat_ns.raster.loss import SSIM_WIN_SIZE
from bytesplat_ns.raster.options import FusedRasterConfig
from bytesplat_ns.raster.sh import ShCoefficients
from bytesplat_ns.strategy import SyncFreeDefaultStrategy
from bytesplat_ns.tile_occupancy import TileOccupancyMonitor

# Per thread: get_image_metrics_and_images sizes the ground truth as eval mode does (see there).
_EVAL_RESOLUTION = threading.local()

METRIC_MODULE_PREFIXES = ("psnr.", "ssim.", "lpips.")
GAUSSIAN_PARAM_NAMES = ("means", "scales", "quats", "features_dc", "features_rest", "opacities")


@dataclass
class ByteSplatModelConfig(SplatfactoModelConfig):
    """splatfacto's configuration plus the choice of rasterizer backend."""

    _target: Type = field(default_factory=lambda: ByteSplatModel)
    rasterizer: Literal["auto", "reference", "gsplat", "fused"] = "auto"
    """Rasterizer backend. auto: fused on GPU (gsplat, with the cause logged, if its kernels cannot be built), reference on CPU."""
    fused: FusedRasterConfig = field(default_factory=FusedRasterConfig)
    """Switches of the fused rasterizer (schedule, culling, reduction, projection, binning, cross-check)."""
    # Hardware-aware pruning (bytesplat_ns/pruning.py, docs/pruning.md).
    hw_prune: Literal["auto", "on", "off"] = "auto"
    """Prune so each tile's Gaussians fit the fused kernel's shared memory. auto: off for now (not yet shown
    to pay for itself on a GPU; docs/pruning.md); on: prune with any backend (the fused one scores for free)."""
    hw_prune_every_refines: int = 1
    """Prune right after every this many of gsplat's refine (densification) steps (1: after each)."""
    hw_prune_max_fraction: float = 0.05
    """At most this fraction of all Gaussians is removed by one pruning step (the overflow of crowded tiles
    first, then low-contribution Gaussians)."""
    hw_prune_min_contribution: float = 1.0 / 255.0
    """Gaussians whose largest alpha*T over the score window is at or below this are removed."""
    hw_prune_window: int = 0
    """Training views the score covers at least (0: one per training image); it always covers the views since
    the previous pruning step, and whole periods before it when this is longer."""
    hw_prune_tile_views: int = 4
    """Recent views whose tile lists decide which tiles are over capacity (at most refine_every)."""
    hw_prune_capacity: int = 0
    """Gaussians per tile; 0: read from the device (the fused kernel's shared-memory capacity)."""
    hw_prune_stop_iter: int = -1
    """No pruning from this step on (-1: when gsplat stops refining, stop_split_at)."""
    optimize_visible_only: bool = False
    """Adam updates only the Gaussians the step's view shows (radius > 0): Adam's arithmetic on those rows, the
    others' parameters and moments untouched (gsplat's SelectiveAdam). Needs bytesplat's Adam (the default
    optimizer config; bytesplat_ns/optim.py). Sharded: each rank's Gaussians that any view of the batch shows."""
    # Gaussian budget (bytesplat_ns/gaussian_budget.py, docs/pruning.md).
    budget_prune_fraction: float = 0.4
    """At each budget step, remove this share of the Gaussians: those whose compositing weights, summed over
    every training view's pixels, are lowest (0: off). 0.4 keeps eval PSNR at 30000 iterations (fox: above the
    unpruned runs; built-in large scene: the same mean over 6 seeds) with 40% fewer Gaussians (docs/pruning.md)."""
    budget_prune_steps: Tuple[int, ...] = ()
    """Steps at which the budget prunes, right after gsplat's step (empty: stop_split_at, when densification
    ends; runs shorter than that need steps here)."""
    tile_stats_every: int = 0
    """Every this many steps, log how many tiles hold more Gaussians than the fused kernel keeps on chip
    (tensorboard tiles/*, model.tile_occupancy.log; 0: off). Any backend; capacity as for hw-prune."""
    gt_downscale: Literal["pool", "conv"] = "pool"
    """How a training image is shrunk while splatfacto's coarse start (num_downscales) trains below full
    resolution: pool (one d x d average pool) or conv (splatfacto's convolution with a d x d box filter). The
    same pixels up to the order of each box's sum; the convolution loads cuDNN at the first training step and
    autotunes each new image size (nerfstudio turns cuDNN's benchmark mode on), which the pool needs neither
    of: suite gt-downscale."""
    min_train_resolution: int = 100
    """splatfacto's coarse start (num_downscales) never trains on images whose longer side is below this
    many pixels. Its quarter resolution is meant for photos; on small images (the built-in 128x96 scene:
    32x24) densification runs away (262k Gaussians by step 1500 on a CPU, 74k at full resolution).
    0: splatfacto's schedule whatever the image size."""


def intrinsics_matrices(camera: Cameras) -> torch.Tensor:
    """``camera.get_intrinsics_matrices()`` [*,3,3], built on the device the camera's tensors are on.
    nerfstudio's fills a CPU tensor element by element: for a camera on the GPU, four read-backs
    (each a host-device wait) and then a copy back."""
    fx, fy, cx, cy = (v.squeeze(-1).float() for v in (camera.fx, camera.fy, camera.cx, camera.cy))
    zero, one = torch.zeros_like(fx), torch.ones_like(fx)
    return torch.stack([fx, zero, cx, zero, fy, cy, zero, zero, one], dim=-1).unflatten(-1, (3, 3))


def nearest_neighbour_distances(points: np.ndarray, k: int) -> np.ndarray:
    """[N,k] distances from each point to its k nearest other points (splatfacto's sklearn query,
    through scipy's k-d tree, which nerfstudio has imported already)."""
    distances, _ = cKDTree(points).query(points, k=k + 1)
    return distances[:, 1:]


def box_downscale(image: torch.Tensor, d: int) -> torch.Tensor:
    """splatfacto's ``resize_image`` ([H,W,C] to [H//d,W//d,C] float32, each output pixel the mean of a d x d
    box) as one average pool: no cuDNN, the same pixels up to the order of each box's sum."""
    chw = image.to(torch.float32).permute(2, 0, 1)[:, None]
    return torch.nn.functional.avg_pool2d(chw, d, stride=d).squeeze(1).permute(1, 2, 0)


def training_psnr(predicted: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """PSNR for the training log (images in [0, 1]), computed on the device: torchmetrics' metric
    copies the pixel count to the GPU from the host, a host-device wait on every step."""
    return -10.0 * torch.log10(torch.mean((predicted - target) ** 2))


class ByteSplatModel(SplatfactoModel):
    """splatfacto with a pluggable rasterizer (reference / gsplat / fused) that also runs on CPU."""

    config: ByteSplatModelConfig
    # Whether this training step's metrics dict gets the image metrics (PSNR): nerfstudio's trainer writes
    # the dict only on logged steps, and bytesplat's trainer says which step is one (trainer.py); True
    # wherever nobody says (every step, as splatfacto).
    training_metrics_wanted: bool = True

    def get_training_callbacks(self, training_callback_attributes):
        cameras = getattr(getattr(getattr(training_callback_attributes.pipeline, "datamanager", None),
                                  "train_dataset", None), "cameras", None)
        self._train_cameras = cameras  # the Gaussian budget's importance pass renders every one of them
        trainer = getattr(training_callback_attributes, "trainer", None)
        config = getattr(trainer, "config", None)
        if getattr(config, "max_num_iterations", None) is not None:  # the step after the run's last (resumed runs too)
            self._run_end_step = int(getattr(trainer, "_start_step", 0)) + int(config.max_num_iterations)
        if cameras is not None:
            self.limit_downscales(int(max(cameras.width.max().item(), cameras.height.max().item())))
        return super().get_training_callbacks(training_callback_attributes)

    def limit_downscales(self, long_side: int) -> int:
        """Cap the coarse start so training images keep ``min_train_resolution`` pixels on their longer
        side (``long_side``: the training images' at full resolution); returns the downscales allowed."""
        wanted = allowed = self.config.num_downscales
        floor = self.config.min_train_resolution
        while allowed > 0 and long_side / 2**allowed < floor:
            allowed -= 1
        self._max_downscales = allowed
        if allowed < wanted:
            CONSOLE.log(f"bytesplat: training images are {long_side} px on their longer side; starting at 1/{2**allowed} "
                        f"of that instead of splatfacto's 1/{2**wanted} (min_train_resolution {floor} px; 0 turns this off)")
        return allowed

    def _downscale_if_required(self, image: torch.Tensor) -> torch.Tensor:
        d = self._get_downscale_factor()
        if d == 1:
            return image
        return box_downscale(image, d) if self.config.gt_downscale == "pool" else resize_image(image, d)

    def _get_downscale_factor(self):
        if getattr(_EVAL_RESOLUTION, "pinned", False):
            return 1  # what splatfacto gives in eval mode
        factor = super()._get_downscale_factor()
        cap = getattr(self, "_max_downscales", None)
        return factor if cap is None else min(factor, 2**cap)

    def populate_modules(self):
        # splatfacto's populate_modules, rebuilt: its seeded start hard-codes .cuda(), and its metric
        # modules import torchmetrics (and through it transformers, where installed) and sklearn, which
        # cost seconds of every start-up. The same Gaussians, metrics and strategy.
        if self.seed_points is not None and not self.config.random_init:
            points, colors = self.seed_points
        else:
            points = (torch.rand((self.config.num_random, 3)) - 0.5) * self.config.random_scale
            colors = torch.empty(0, 3)
        self.gauss_params = torch.nn.ParameterDict(self._gaussians_from_seed(points, colors))
        self.camera_optimizer = self.config.camera_optimizer.setup(num_cameras=self.num_train_data, device="cpu")
        # plain callables, not modules: out of the state dict, the LPIPS weights loaded on first use
        self.psnr = psnr
        self.ssim = SSIM(data_range=1.0, size_average=True, channel=3)
        self.lpips = Lpips()
        self.step = 0
        self.crop_box: Optional[OrientedBox] = None
        if self.config.background_color == "random":
            self.background_color = torch.tensor([0.1490, 0.1647, 0.2157])  # splatfacto's: the viewer's background
        else:
            self.background_color = get_color(self.config.background_color)
        if self.config.use_bilateral_grid:
            self.bil_grids = BilateralGrid(num=self.num_train_data, grid_X=self.config.grid_shape[0],
                                           grid_Y=self.config.grid_shape[1], grid_W=self.config.grid_shape[2])
        # gsplat's densification with splatfacto's settings, without the three GPU waits per step of its
        # statistics update
        self.strategy = SyncFreeDefaultStrategy(
            prune_opa=self.config.cull_alpha_thresh,
            grow_grad2d=self.config.densify_grad_thresh,
            grow_scale3d=self.config.densify_size_thresh,
            grow_scale2d=self.config.split_screen_size,
            prune_scale3d=self.config.cull_scale_thresh,
            prune_scale2d=self.config.cull_screen_size,
            refine_scale2d_stop_iter=self.config.stop_screen_size_at,
            refine_start_iter=self.config.warmup_length,
            refine_stop_iter=self.config.stop_split_at,
            reset_every=self.config.reset_alpha_every * self.config.refine_every,
            refine_every=self.config.refine_every,
            pause_refine_after_reset=self.num_train_data + self.config.refine_every,
            absgrad=self.config.use_absgrad,
            revised_opacity=False,
            verbose=True,
        )
        self.strategy_state = self.strategy.initialize_state(scene_scale=1.0)
        self._backend: Optional[str] = None
        self.tile_occupancy = TileOccupancyMonitor(self.config.tile_stats_every, self.config.hw_prune_capacity,
                                                   self.config.fused.opacity_aware_tiles)
        self._pruning: Optional[HardwarePruner] = None
        self._budget: Optional[GaussianBudget] = None
        self._budget_settings()  # a bad value stops here, before any training
        self._train_cameras: Optional[Cameras] = None
        self._run_end_step: Optional[int] = None  # set by get_training_callbacks: the budget's console line
        # built here, so that a bad margin stops the run before any training
        self._pair_room = PairRoom(self.config.fused.pair_room_margin) if self.config.fused.sync_free_binning else None
        self._adam_on_device: Tuple[int, bool] = (-1, False)  # (Gaussians, answer) of _gaussian_steps_on_device
        self.binning_exactly = False  # set while the trainer trains a view again (pair_capacity.py)
        self.sized_binning_allowed = True  # the trainer's say: off with gradient scaling or accumulation
        self._graph_views: Dict[Tuple, Tuple[torch.Tensor, int, int]] = {}  # graph_step_view's intrinsics and size

    @property
    def pruning(self) -> HardwarePruner:
        """The hardware-aware pruning strategy (pruning.py), built on first use: its tile capacity
        depends on the device the model was moved to after it was built."""
        if self._pruning is None:
            self._pruning = HardwarePruner.from_model(self)
        return self._pruning

    @property
    def budget(self) -> GaussianBudget:
        """The Gaussian budget (gaussian_budget.py), built on first use."""
        if self._budget is None:
            settings = self._budget_settings()
            dist = (torch.distributed.is_available() and torch.distributed.is_initialized()
                    and torch.distributed.get_world_size() > 1)
            if settings.active and dist:
                CONSOLE.log("bytesplat: the Gaussian budget (--pipeline.model.budget-prune-fraction) is not "
                            "supported with sharded training yet; off")
            self._budget = GaussianBudget(settings, self.config.stop_split_at, enabled=not dist)
            if self._budget.enabled:
                CONSOLE.log(budget_announcement(self._budget, self._run_end_step))
        return self._budget

    def size_rooms_ahead(self) -> None:
        """Bin the training steps' tile lists into rooms sized ahead (pair_capacity.py), as with
        ``--pipeline.model.fused.sync-free-binning True``: what a training step replayed as a CUDA graph needs."""
        if self._pair_room is None:
            self._pair_room = PairRoom(self.config.fused.pair_room_margin)

    @property
    def pair_room(self) -> Optional[PairRoom]:
        """The training step's tile-pair room (pair_capacity.py; ``--pipeline.model.fused.sync-free-binning``),
        or None where the steps bin by the count read back from the GPU."""
        return self._pair_room if self.sized_binning_allowed else None

    def _room_for_pairs(self, contribution: bool, view_key: Optional[int] = None) -> Optional[int]:
        """This training step's room for tile pairs (``view_key``: the training image's index), or None: binned
        by the count read back. None for a view trained again, for a step whose render also scores Gaussians
        for pruning (its scores are not gated by the step's flag), and where a Gaussian's Adam step cannot be
        decided on the GPU."""
        room = self.pair_room
        if room is None or self.binning_exactly or contribution or self.camera_optimizer.config.mode != "off":
            return None
        if not self._gaussian_steps_on_device():
            return None
        return room.room(self.num_points, view_key)

    def _gaussian_steps_on_device(self) -> bool:
        """Whether every Gaussian optimizer is bytesplat's Adam with its kernel for every group (asked again
        whenever the Gaussian count changes)."""
        known_for, answer = self._adam_on_device
        if known_for != self.num_points:
            optimizers = [getattr(self, "optimizers", {}).get(name) for name in GAUSSIAN_PARAM_NAMES]
            answer = all(isinstance(o, DeviceAdam) and o.decides_on_device() for o in optimizers)
            self._adam_on_device = (self.num_points, answer)
        return answer

    def views_to_train_again(self, step: int) -> List[Tuple[Cameras, Dict]]:
        """The (camera, batch) of earlier steps whose tile lists did not fit their room, to be trained again at
        ``step`` (pair_capacity.py); empty where the steps are not binned into a room."""
        room = self._pair_room
        return room.views_to_train_again(step) if room is not None else []

    def record_densification_statistics(self, step: int) -> None:
        """gsplat's running statistics of this render (the first half of its step_post_backward), for a view
        trained again outside the step's own callbacks."""
        if step < self.strategy.refine_stop_iter:
            self.strategy._update_state(self.gauss_params, self.strategy_state, self.info, packed=False)

    def _budget_settings(self) -> BudgetSettings:
        return BudgetSettings(float(self.config.budget_prune_fraction), tuple(self.config.budget_prune_steps))

    def _budget_importance(self) -> Tuple[torch.Tensor, int]:
        """Every Gaussian's compositing weights summed over every training view at the current training
        resolution (gaussian_budget.py), and the number of views."""
        cameras = self._train_cameras
        if cameras is None:
            raise BytesplatError("the Gaussian budget needs the training cameras (set by get_training_callbacks)")
        with torch.no_grad():
            means, quats = self.gauss_params["means"].detach(), self.gauss_params["quats"].detach()
            scales = torch.exp(self.gauss_params["scales"].detach())
            opacities = torch.sigmoid(self.gauss_params["opacities"].detach()).squeeze(-1)
        count, scale_factor = means.shape[0], self._get_downscale_factor()

        def per_view():
            for index in range(len(cameras)):
                camera = cameras[index:index + 1]
                camera.metadata = {"cam_idx": index}  # what the datamanager gives a training camera
                with torch.no_grad():
                    viewmat = viewmat_from_camera_to_world(self.camera_optimizer.apply_to_camera(camera).to(self.device))
                intrinsics, width, height = self._intrinsics_and_size(camera, scale_factor)

                def render(colors, viewmat=viewmat, intrinsics=intrinsics, width=width, height=height):
                    image, _, _ = rasterize(means, quats, scales, opacities, colors, viewmat, intrinsics, width, height,
                                            backend=self.rasterizer_backend, fused_options=self.config.fused.options())
                    return image

                yield view_blending_weights(render, count, self.device)

        return summed_over_views(per_view(), count, self.device)

    def _gaussians_from_seed(self, points: torch.Tensor, colors: torch.Tensor) -> Dict[str, torch.nn.Parameter]:
        """Initial Gaussians at the seed points: isotropic, sized by the mean distance to 3 neighbours;
        colours from ``colors`` (0-255), random where there are none. Random draws in splatfacto's order."""
        points = points.float().clone()  # own storage: training must not move the dataparser's seed points
        mean_distance = torch.from_numpy(nearest_neighbour_distances(points.numpy(), 3)).float().mean(dim=-1, keepdim=True)
        count = points.shape[0]
        quats = random_quat_tensor(count)
        sh_bases = num_sh_bases(self.config.sh_degree)
        features = torch.zeros(count, sh_bases, 3)
        if colors.shape[0] > 0:
            rgb = colors.float() / 255.0
            features[:, 0] = RGB2SH(rgb) if self.config.sh_degree > 0 else torch.logit(rgb, eps=1e-10)
        else:
            features[:, 0] = torch.rand(count, 3)
        return {
            "means": torch.nn.Parameter(points),
            "scales": torch.nn.Parameter(torch.log(mean_distance.repeat(1, 3))),
            "quats": torch.nn.Parameter(quats),
            "features_dc": torch.nn.Parameter(features[:, 0].contiguous()),
            "features_rest": torch.nn.Parameter(features[:, 1:].contiguous()),
            "opacities": torch.nn.Parameter(torch.logit(0.1 * torch.ones(count, 1))),
        }

    @property
    def rasterizer_backend(self) -> str:
        """The backend actually used, resolved against the model's device on first use."""
        if self._backend is None:
            try:
                self._backend = resolve_backend(self.config.rasterizer, self.device)
            except BytesplatError:
                if self.training or self.device.type == "cuda":
                    raise
                # Viewing/exporting a GPU-trained model on a CPU machine: render with the reference.
                CONSOLE.log(f"bytesplat: '{self.config.rasterizer}' needs a GPU; rendering with 'reference' on CPU")
                self._backend = "reference"
            if self.config.rasterize_mode != "classic" and self._backend != "gsplat":
                raise BytesplatError(
                    f"rasterize_mode '{self.config.rasterize_mode}' is only available with the gsplat rasterizer "
                    f"(selected: {self._backend}); use --pipeline.model.rasterizer gsplat or rasterize-mode classic."
                )
            CONSOLE.log(f"bytesplat: rasterizer backend '{self._backend}' on {self.device}")
        return self._backend

    def load_state_dict(self, dict, **kwargs):  # type: ignore  # noqa: A002 (splatfacto's signature)
        if "gauss_params.means" not in dict and "means" not in dict:
            found = sorted({key.split(".")[0] for key in dict})[:6]
            raise BytesplatError(
                "This checkpoint was not written by a Gaussian-splatting method (it has no Gaussian "
                f"parameters; top-level entries: {', '.join(found) or 'none'}). Load a checkpoint "
                "trained with `ns-train bytesplat` (or splatfacto)."
            )
        # checkpoints of earlier versions hold torchmetrics' metric modules; the metrics are no modules now
        dict = {key: value for key, value in dict.items() if not key.startswith(METRIC_MODULE_PREFIXES)}  # noqa: A001
        return super().load_state_dict(dict, **kwargs)

    def _select_gaussians(self, camera: Cameras) -> Optional[Dict[str, torch.Tensor]]:
        """The Gaussians to render: all of them, or those inside the viewer's crop box (None: empty)."""
        params = {name: self.gauss_params[name] for name in GAUSSIAN_PARAM_NAMES}
        if self.crop_box is None or self.training:
            return params
        inside = self.crop_box.within(self.means).squeeze()
        if inside.sum() == 0:
            return None
        return {name: value[inside] for name, value in params.items()}

    def get_outputs(self, camera: Cameras) -> Dict[str, Union[torch.Tensor, List]]:
        if not isinstance(camera, Cameras):
            CONSOLE.log("bytesplat: get_outputs expects a Cameras object")
            return {}
        if self.training:
            if camera.shape[0] != 1:
                raise BytesplatError("bytesplat trains on one camera per forward call")
            camera_to_world = self.camera_optimizer.apply_to_camera(camera)
        else:
            camera_to_world = camera.camera_to_worlds

        gaussians = self._select_gaussians(camera)
        if gaussians is None:
            return self.get_empty_outputs(int(camera.width.item()), int(camera.height.item()), self.background_color)

        intrinsics, width, height = self._intrinsics_and_size(camera, self._get_downscale_factor())
        self.last_size = (height, width)
        # a training camera's matrix, made once by the datamanager, where no camera optimizer moves it
        viewmat = world_to_camera(camera) if self.training and self.camera_optimizer.config.mode == "off" else None
        if viewmat is None:
            viewmat = viewmat_from_camera_to_world(camera_to_world.to(self.device))

        raster_args, sh_degree = self._raster_args(gaussians, viewmat, intrinsics, width, height)
        if (self.training and self.rasterizer_backend == "fused" and not self.config.use_bilateral_grid
                and min(width, height) >= SSIM_WIN_SIZE):
            # The fused kernel needs the ground truth to compute the loss inside the same launch;
            # nerfstudio hands the batch over in get_metrics_dict, which finishes the step there
            # (or renders the usual way there when the batch carries a mask).
            return {"fused_pending": (raster_args, sh_degree, camera.metadata, camera),
                    "background": self._get_background_color()}
        return self._render_outputs(raster_args, sh_degree, self._get_background_color(), camera.metadata)

    def _raster_args(self, gaussians: Dict[str, torch.Tensor], viewmat: torch.Tensor, intrinsics: torch.Tensor,
                     width: int, height: int) -> Tuple[Tuple, Optional[int]]:
        """The rasterizer's arguments for ``gaussians`` seen by one camera, and the SH degree in use."""
        colors, sh_degree = self._colors_and_sh_degree(gaussians)
        return (gaussians["means"], gaussians["quats"], torch.exp(gaussians["scales"]),
                torch.sigmoid(gaussians["opacities"]).squeeze(-1), colors, viewmat, intrinsics, width, height), sh_degree

    def graph_step_view(self, camera: Cameras) -> Tuple[torch.Tensor, torch.Tensor, int, int]:
        """A training camera's view matrix [1,4,4], intrinsics [1,3,3] and size at this step's resolution, as
        ``get_outputs`` takes them: the per-step inputs of a training step replayed as a CUDA graph
        (step_graphs.py)."""
        factor = self._get_downscale_factor()
        key = ((camera.metadata or {}).get("cam_idx"), factor)
        known = self._graph_views.get(key) if key[0] is not None else None
        if known is None:  # the training cameras do not move (no camera optimizer): made once per view and factor
            known = self._graph_views[key] = self._intrinsics_and_size(camera, factor)
        intrinsics, width, height = known
        self.last_size = (height, width)
        viewmat = world_to_camera(camera)
        assert viewmat is not None, "graph steps need the datamanager's view matrices (no camera optimizer)"
        return viewmat, intrinsics, width, height

    def graph_step_blocker(self, step: int) -> Optional[str]:
        """Why training ``step`` must run eagerly rather than as a replayed CUDA graph of its render, loss and
        backward (step_graphs.py), or None: the graph holds everything but the per-step view, ground truth
        and background, so a step that renders, scores or logs anything else, or that cannot bin into a
        fixed room, is not one. The view's own reasons: :meth:`graph_view_blocker`."""
        if not self.training or self.rasterizer_backend != "fused":
            return "the fused rasterizer is not training"
        if self.config.use_bilateral_grid or self.camera_optimizer.config.mode != "off":
            return "a bilateral grid or a camera optimizer"
        if self.config.optimize_visible_only:
            return "Adam on the visible Gaussians only"
        if self.pair_room is None or not self._gaussian_steps_on_device():
            return "no sized binning (--pipeline.model.fused.sync-free-binning) or an Adam that cannot skip a step"
        if self.config.use_scale_regularization and step % 10 == 0:
            return "a scale-regularisation step"
        check_every = self.config.fused.check_every
        if (check_every > 0 and step % check_every == 0) or self.pruning.wants_contribution(step):
            return "a diagnostic or pruning-score step"
        return None

    @staticmethod
    def graph_view_blocker(batch: Dict, width: int, height: int) -> Optional[str]:
        """Why this view's step runs eagerly (the fused loss does not take it), or None."""
        if "mask" in batch:
            return "a mask"
        if min(width, height) < SSIM_WIN_SIZE:
            return "an image smaller than the SSIM window"
        return None

    def graph_step_loss(self, viewmat: torch.Tensor, intrinsics: torch.Tensor, width: int, height: int,
                        image: torch.Tensor, room: int) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The training loss of one view, everything the step computes before its backward, from the inputs
        a CUDA graph holds fixed (step_graphs.py): its tile lists binned into ``room`` pairs, its flag
        (``info["step_valid"]``) set on the device, the pair total read after the replay
        (:meth:`graph_step_replayed`). Also the rendered image and its background, for a logged step's
        training metrics (:meth:`graph_step_dicts`)."""
        gaussians = {name: self.gauss_params[name] for name in GAUSSIAN_PARAM_NAMES}
        raster_args, sh_degree = self._raster_args(gaussians, viewmat, intrinsics, width, height)
        outputs = {"fused_pending": (raster_args, sh_degree, None, None), "background": self._get_background_color()}
        batch = {"image": image}
        self._run_fused_step(outputs, batch, graph_room=room)
        loss = functools.reduce(torch.add, self.get_loss_dict(outputs, batch, {}).values())
        return loss, outputs["rgb"], outputs["background"]

    def graph_step_dicts(self, loss: torch.Tensor, rgb: torch.Tensor, background: torch.Tensor,
                         batch: Dict) -> Tuple[Dict[str, torch.Tensor], Dict[str, torch.Tensor]]:
        """A replayed step's loss and metrics dicts from the graph's loss, render and background, as the eager
        step's (``get_loss_dict``, ``get_metrics_dict``): in full on the steps the trainer logs, else the
        loss and the Gaussian count alone (nobody reads more)."""
        if not self.training_metrics_wanted:
            return {"main_loss": loss}, {"gaussian_count": self.num_points}
        # a graph step has no scale regularisation (graph_step_blocker): its term is the eager step's zero
        return {"main_loss": loss, "scale_reg": self._scale_regularization()}, self._training_metrics(rgb, background, batch)

    def graph_step_room(self) -> Optional[int]:
        """The room for a graph of the training step: the largest any training view would get now (one
        graph serves every view), or None before any pair total was read."""
        room = self.pair_room
        if room is None:
            return None
        rooms = [room.room(self.num_points, key) for key in list(room.by_view) or [None]]
        rooms = [r for r in rooms if r is not None]
        return max(rooms) if rooms else None

    def graph_step_replayed(self, info: Dict, room: int, camera: Cameras, batch: Dict) -> None:
        """After a replay: the step's render statistics (``info``, the graph's) become this step's, its flag
        goes to the Gaussians' optimizers and its pair total is read as any sized step's (pair_capacity.py)."""
        self.info = info
        self._hand_step_valid(info["step_valid"])
        self.pair_room.send(self.step, info["pair_total"], room, self.num_points, (camera, batch),
                            (camera.metadata or {}).get("cam_idx"))

    def _intrinsics_and_size(self, camera: Cameras, scale_factor: float) -> Tuple[torch.Tensor, int, int]:
        """K [1,3,3] on the model's device and (width, height) at ``1 / scale_factor`` resolution,
        exactly as ``camera.rescale_output_resolution(1 / scale_factor)`` gives them. Training cameras
        carry their size on the host (data/datamanager.py), so a training step reads nothing back
        from the GPU; other cameras (viewer, eval) take nerfstudio's path."""
        host = host_image_size(camera)
        if host is None:
            camera.rescale_output_resolution(1 / scale_factor)
            intrinsics = intrinsics_matrices(camera).to(self.device)
            width, height = int(camera.width.item()), int(camera.height.item())
            camera.rescale_output_resolution(scale_factor)
            return intrinsics, width, height
        intrinsics = intrinsics_matrices(camera).to(self.device)
        if scale_factor == 1:
            return intrinsics, host[0], host[1]
        # rescale_output_resolution's arithmetic: float32 factor, sizes truncated to int64
        factor = torch.tensor([1 / scale_factor])  # host tensor: the sizes stay on the CPU
        intrinsics = torch.cat([intrinsics[:, :2] * (1 / scale_factor), intrinsics[:, 2:]], 1)
        width, height = (int((torch.tensor([v]) * factor).to(torch.int64)) for v in host)
        return intrinsics, width, height

    def _render_outputs(self, raster_args: Tuple, sh_degree: Optional[int], background: torch.Tensor,
                        metadata: Optional[Dict]) -> Dict[str, Union[torch.Tensor, List]]:
        """Render with the selected backend and build splatfacto's outputs (the unfused path: eval,
        the viewer, and training with the reference/gsplat backends or where the fused loss cannot run)."""
        width, height = raster_args[7], raster_args[8]
        render_mode = "RGB+ED" if (self.config.output_depth_during_training or not self.training) else "RGB"
        render, alpha, self.info = rasterize(
            *raster_args,
            backend=self.rasterizer_backend,
            sh_degree=sh_degree,
            render_mode=render_mode,
            absgrad=self.strategy.absgrad,
            fused_options=self.config.fused.options(),
        )
        if self.training:
            self.after_training_render()

        rgb = torch.clamp(render[..., :3] + (1 - alpha) * background, 0.0, 1.0)
        if self.config.use_bilateral_grid and self.training and metadata and "cam_idx" in metadata:
            rgb = self._apply_bilateral_grid(rgb, metadata["cam_idx"], height, width)

        depth = None
        if render_mode == "RGB+ED":
            depth = torch.where(alpha > 0, render[..., 3:4], render[..., 3:4].detach().max()).squeeze(0)
        if not self.training:
            background = background.expand(height, width, 3)
        return {"rgb": rgb.squeeze(0), "depth": depth, "accumulation": alpha.squeeze(0), "background": background}

    def after_training_render(self, step: Optional[int] = None) -> None:
        """gsplat's statistics hook on this step's render (``self.info``), and (optimize_visible_only) the
        Gaussians it showed in any of its views handed to the Gaussians' optimizers for this step. The
        sharded pipeline calls it too, with this rank's Gaussians in the batch's views."""
        step = self.step if step is None else step
        self.strategy.step_pre_backward(self.gauss_params, self.optimizers, self.strategy_state, step, self.info)
        if self._pair_room is not None:
            self._hand_step_valid(self.info.get("step_valid"))
        if not self.config.optimize_visible_only:
            return
        radii = self.info["radii"]
        visible = (radii > 0).reshape(radii.shape[0], radii.shape[1], -1).all(-1).any(0)  # [C,N] or [C,N,2]
        for name in GAUSSIAN_PARAM_NAMES:
            optimizer = self.optimizers.get(name)
            if optimizer is None:
                continue
            if not isinstance(optimizer, DeviceAdam):
                raise BytesplatError(
                    f"--pipeline.model.optimize-visible-only needs bytesplat's Adam; the '{name}' optimizer is "
                    f"{type(optimizer).__name__}",
                    hint="keep the default optimizer config (DeviceAdamOptimizerConfig) or turn the switch off")
            optimizer.visible_rows = visible

    def _hand_step_valid(self, valid: Optional[torch.Tensor]) -> None:
        """Whether the step's tile lists fitted their room (pair_capacity.py), to the Gaussians' optimizers; None,
        for a step binned by the count read back, also clears an earlier step's flag that an optimizer without
        gradients kept."""
        for name in GAUSSIAN_PARAM_NAMES:
            optimizer = self.optimizers.get(name)
            if isinstance(optimizer, DeviceAdam):
                optimizer.step_valid = valid

    def step_post_backward(self, step):
        """splatfacto's densification step with hardware-aware pruning around it (pruning.py)."""
        info = getattr(self, "info", None)
        self.tile_occupancy.record(info, step, self.num_points)  # this step's render, before gsplat changes it
        self.pruning.step_post_backward(
            self.gauss_params, self.optimizers, self.strategy_state, step, info, super().step_post_backward
        )
        if self.budget.is_prune_step(step):  # one render and backward per training view: say so before it starts
            views = len(self._train_cameras) if self._train_cameras is not None else 0
            CONSOLE.log(f"bytesplat: Gaussian budget at step {step}: scoring {self.num_points} Gaussians in {views} "
                        "training views")
        stats = self.budget.step_post_backward(self.gauss_params, self.optimizers, self.strategy_state, step,
                                               self._budget_importance)
        if stats is not None:
            CONSOLE.log(f"bytesplat: Gaussian budget at step {step}: removed {stats['removed']:.0f} of "
                        f"{stats['gaussians']:.0f} Gaussians ({stats['unseen']:.0f} seen in none of the "
                        f"{stats['views']:.0f} training views), {stats['seconds']:.1f} s")
            writer.put_scalar(name="budget_prune/removed", scalar=stats["removed"], step=step)

    def _colors_and_sh_degree(
        self, gaussians: Dict[str, torch.Tensor]
    ) -> Tuple[Union[ShCoefficients, torch.Tensor], Optional[int]]:
        """The rasterizer's colors and SH degree in use: the DC and rest parameters as they are
        (``ShCoefficients``: the fused path's SH kernel reads them without a per-step concatenation;
        the other backends stack them), or, without SH, the activated DC colors [N,3] and None."""
        degree = self.sh_degree_in_use()
        if degree is not None:
            return ShCoefficients(gaussians["features_dc"], gaussians["features_rest"]), degree
        return torch.sigmoid(gaussians["features_dc"]), None

    def sh_degree_in_use(self) -> Optional[int]:
        """splatfacto's SH degree at this step (one more every sh_degree_interval steps); None without SH."""
        if self.config.sh_degree > 0:
            return min(self.step // self.config.sh_degree_interval, self.config.sh_degree)
        return None

    def gaussian_parameters(self) -> List[torch.nn.Parameter]:
        """The Gaussians' parameters, in GAUSSIAN_PARAM_NAMES order."""
        return [self.gauss_params[name] for name in GAUSSIAN_PARAM_NAMES]

    def _run_fused_step(self, outputs: Dict, batch: Dict, graph_room: Optional[int] = None) -> None:
        """Render, compute splatfacto's loss and its 2D gradients in the fused kernel (training only).
        ``graph_room``: the fixed room of a step captured as a CUDA graph (:meth:`graph_step_loss`)."""
        from bytesplat_ns.raster.fused import fused_render_loss

        raster_args, sh_degree, metadata, camera = outputs.pop("fused_pending")
        background = outputs["background"]
        gt = self.composite_with_background(self.get_gt_img(batch["image"]), background)
        gt_images, backgrounds = gt[None, ..., :3].float().contiguous(), background[None].float()
        options = self.config.fused.options()
        check_every = self.config.fused.check_every
        if check_every > 0 and self.step % check_every == 0:
            # Diagnostics: this step's fused loss/gradients against the unfused (splatfacto) path.
            from bytesplat_ns.raster.diagnostics import compare_with_unfused

            errors = compare_with_unfused(
                raster_args, gt_images, backgrounds, {n: self.gauss_params[n] for n in GAUSSIAN_PARAM_NAMES},
                sh_degree=sh_degree, ssim_lambda=self.config.ssim_lambda, absgrad=self.strategy.absgrad,
                options=options,
            )
            errors["step"] = float(self.step)
            if not hasattr(self, "fused_check_log"):
                self.fused_check_log = []
            self.fused_check_log.append(errors)
            CONSOLE.log("bytesplat fused check: " + " ".join(f"{k}={v:.3g}" for k, v in errors.items()))
        contribution = self.pruning.wants_contribution(self.step)  # the pruning score, from the backward kernel
        view_key = (metadata or {}).get("cam_idx")  # the datamanager's training image index
        room = self._room_for_pairs(contribution, view_key) if graph_room is None else graph_room
        loss, rgb, alpha, self.info = fused_render_loss(
            *raster_args,
            gt_images,
            backgrounds,
            sh_degree=sh_degree,
            ssim_lambda=self.config.ssim_lambda,
            absgrad=self.strategy.absgrad,
            contribution=contribution,
            options=options,
            pair_room=room,
        )
        if graph_room is not None:  # the total is read after each replay (graph_step_replayed)
            self.info["step_valid"] = self.info["pair_total"][0] <= graph_room
        elif self.pair_room is not None:
            # None where binned by the count read back; else False when the lists did not fit the room
            self.info["step_valid"] = self.pair_room.send(self.step, self.info["pair_total"], room, self.num_points,
                                                          (camera, batch), view_key)
        self.after_training_render()
        outputs.update(rgb=rgb.squeeze(0), accumulation=alpha.squeeze(0), depth=None, fused_loss=loss)

    def get_metrics_dict(self, outputs, batch) -> Dict[str, torch.Tensor]:
        if "fused_pending" in outputs:
            if "mask" in batch:
                # The fused loss has no mask term: render with the same kernels and let splatfacto's
                # loss apply the mask (its masked L1/SSIM), as with the other backends.
                raster_args, sh_degree, metadata, _ = outputs.pop("fused_pending")
                outputs.update(self._render_outputs(raster_args, sh_degree, outputs["background"], metadata))
            else:
                self._run_fused_step(outputs, batch)
        if not self.training:
            return super().get_metrics_dict(outputs, batch)
        return self._training_metrics(outputs["rgb"], outputs["background"], batch)

    def _training_metrics(self, rgb: torch.Tensor, background: torch.Tensor, batch: Dict) -> Dict[str, torch.Tensor]:
        """splatfacto's training metrics, with a PSNR that does not wait for the GPU, on the steps that log them."""
        metrics_dict = {}
        if self.training_metrics_wanted:
            gt_rgb = self.composite_with_background(self.get_gt_img(batch["image"]), background)
            metrics_dict["psnr"] = training_psnr(rgb, gt_rgb)
            if self.config.color_corrected_metrics:
                metrics_dict["cc_psnr"] = training_psnr(color_correct(rgb, gt_rgb), gt_rgb)
        metrics_dict["gaussian_count"] = self.num_points
        self.camera_optimizer.get_metrics_dict(metrics_dict)
        return metrics_dict

    def get_loss_dict(self, outputs, batch, metrics_dict=None) -> Dict[str, torch.Tensor]:
        if "fused_loss" not in outputs:
            return super().get_loss_dict(outputs, batch, metrics_dict)
        loss_dict = {"main_loss": outputs["fused_loss"], "scale_reg": self._scale_regularization()}
        if self.training:
            self.camera_optimizer.get_loss_dict(loss_dict)
        return loss_dict

    def _scale_regularization(self) -> torch.Tensor:
        """PhysGaussian's penalty on needle-like Gaussians, as splatfacto applies it (every 10 steps)."""
        if not (self.config.use_scale_regularization and self.step % 10 == 0):
            return torch.zeros((), device=self.device)  # not torch.tensor(0.0, ...): a copy from the host
        scales = torch.exp(self.scales)
        ratio = scales.amax(dim=-1) / scales.amin(dim=-1)
        return 0.1 * (torch.clamp_min(ratio, self.config.max_gauss_ratio) - self.config.max_gauss_ratio).mean()

    def get_image_metrics_and_images(self, outputs, batch):
        # Eval images are rendered in eval mode, at full resolution. splatfacto sizes the ground truth
        # from self.training, which is True again while the trainer's eval logger runs this on its
        # worker thread: pin the eval resolution for this thread instead.
        _EVAL_RESOLUTION.pinned = True
        try:
            metrics, images = super().get_image_metrics_and_images(outputs, batch)
        finally:
            _EVAL_RESOLUTION.pinned = False
        if not self.lpips.available:
            # The stand-in returned a placeholder; report no number rather than a wrong one.
            metrics.pop("lpips", None)
            metrics.pop("cc_lpips", None)
        return metrics, images
