"""A trained scene for the benchmarks: the Gaussians of a finished nerfstudio run, with that scene's
real cameras and ground-truth images (``--trained RUN_DIR`` of the raster and distributed benchmarks).

A run directory is what ``ns-train bytesplat`` (or splatfacto, or ``bytesplat-bench train``, whose
JSON names it as ``run_dir``) leaves behind::

    RUN_DIR/config.yml                        the trainer config (nerfstudio's yaml)
    RUN_DIR/dataparser_transforms.json        the world frame the Gaussians live in
    RUN_DIR/nerfstudio_models/step-*.ckpt     the latest one is loaded

The Gaussians are the checkpoint's ``_model.gauss_params.*`` tensors (splatfacto's parameterisation:
log scales, logit opacities, SH split into features_dc/features_rest). The cameras and images come
from the run's own datamanager, rebuilt from config.yml (so the dataparser puts them in the frame the
model was trained in; that frame is checked against dataparser_transforms.json), train split, each
image undistorted as nerfstudio's FullImageDatamanager does. The view matrix is the model's own
conversion (``bytesplat_ns.data.datamanager.viewmat_from_camera_to_world``), the background the model's eval
background. ``scale`` renders a view at another resolution: intrinsics scaled as nerfstudio's
``Cameras.rescale_output_resolution`` does (size floored), ground truth resized (bilinear).

- :func:`load_run` -> :class:`TrainedRun`
- :func:`raster_scene`: ``bench.synthetic.synthetic_scene``'s dict for one view;
- :func:`views_scene`: ``bench.distributed.make_scene``'s dict for B views.

Problems with the run directory raise a :class:`~bytesplat_ns.errors.BytesplatError` (one line on
the command line, no traceback).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple, Union

import torch
from torch import Tensor

from bytesplat_ns.errors import BytesplatError

PARAM_NAMES = ("means", "scales", "quats", "features_dc", "features_rest", "opacities")
SH_C0 = 0.28209479177387814
HINT = ("pass the directory of a finished `ns-train bytesplat` (or splatfacto) run, the one holding config.yml, "
        "dataparser_transforms.json and nerfstudio_models/ (bytesplat-bench train prints it as run_dir)")


def add_scene_options(parser, trained_use: str) -> None:
    """The scene options the raster and distributed benchmarks share: random Gaussians (count, image
    size) or ``--trained RUN_DIR``; ``trained_use`` ends --trained's help (what the run provides)."""
    parser.add_argument("--num-gaussians", type=int, nargs="+", default=None,
                        help="random scenes: one per count, in this order (default 1000000)")
    parser.add_argument("--width", type=int, default=None, help="random scenes' image width (default 1920)")
    parser.add_argument("--height", type=int, default=None, help="random scenes' image height (default 1080)")
    parser.add_argument("--sh-degree", type=int, default=None, help="default: 3, or the trained model's degree")
    parser.add_argument("--trained", type=str, default=None, metavar="RUN_DIR",
                        help="a trained scene instead of random Gaussians: a finished nerfstudio run of bytesplat or "
                        "splatfacto (the directory with config.yml, dataparser_transforms.json, nerfstudio_models/; "
                        f"`bytesplat-bench train` records it as run_dir); {trained_use}")


def scenes_from_options(args, default_counts: Sequence[int]) -> List[Tuple[str, Dict]]:
    """(label, scene) for :func:`add_scene_options`' options (and ``--trained-view``): the trained run's
    view at full resolution, or one random scene per ``--num-gaussians`` count (default
    ``default_counts``), 1920x1080 and SH degree 3 unless given."""
    if args.trained is not None:
        run = load_run(args.trained)
        return [(f"trained:{run.run_dir}", raster_scene(run, args.trained_view, 1.0, args.sh_degree, device="cuda"))]
    from bytesplat_ns.bench.synthetic import synthetic_scene

    width, height = args.width or 1920, args.height or 1080
    degree = 3 if args.sh_degree is None else args.sh_degree
    return [("synthetic", synthetic_scene(n, width, height, degree)) for n in (args.num_gaussians or default_counts)]


def reject_random_scene_options(parser, args) -> None:
    """With --trained, the random scenes' options are a usage error (argparse's, exit 2)."""
    given = [f for f, v in (("--num-gaussians", args.num_gaussians), ("--width", args.width), ("--height", args.height))
             if v is not None]
    if given:
        parser.error(f"{', '.join(given)} cannot be combined with --trained (the trained scene sets them; "
                     "--trained-scale changes the resolution)")


def run_paths(run_dir: Union[str, Path]) -> Tuple[Path, Path, Path]:
    """(run directory, config.yml, latest checkpoint): the cheap checks, without loading anything.
    ``run_dir`` may also be the run's config.yml."""
    from bytesplat_ns.trainer import latest_checkpoint

    path = Path(run_dir).expanduser()
    if path.is_file() and path.name == "config.yml":
        path = path.parent
    if not path.exists():
        raise BytesplatError(f"Trained run directory {path} does not exist.", hint=HINT)
    if not path.is_dir():
        raise BytesplatError(f"{path} is not a run directory.", hint=HINT)
    for name in ("config.yml", "dataparser_transforms.json"):
        if not (path / name).is_file():
            raise BytesplatError(f"{path} is not a nerfstudio run directory: it has no {name}.", hint=HINT)
    try:
        checkpoint = latest_checkpoint(path / "nerfstudio_models")
    except BytesplatError as e:
        raise BytesplatError(f"{path} holds no trained model: {e.message}", hint=HINT) from None
    return path.resolve(), path.resolve() / "config.yml", checkpoint.resolve()


def _load_config(config_path: Path):
    import yaml
    from nerfstudio.engine.trainer import TrainerConfig

    try:
        config = yaml.load(config_path.read_text(), Loader=yaml.Loader)  # nerfstudio's own format (eval_setup)
    except Exception as e:  # noqa: BLE001 - unreadable yaml, a class that no longer imports, ...
        raise BytesplatError(f"Cannot read {config_path}: {type(e).__name__}: {e}") from e
    if not isinstance(config, TrainerConfig):
        raise BytesplatError(f"{config_path} is not a nerfstudio trainer config.", hint=HINT)
    return config


def _gaussians(state: Dict, checkpoint: Path, sh_degree: int) -> Dict[str, Tensor]:
    pipeline = {(k[len("module."):] if k.startswith("module.") else k): v for k, v in state["pipeline"].items()}
    missing = [n for n in PARAM_NAMES if f"_model.gauss_params.{n}" not in pipeline]
    if missing:
        raise BytesplatError(f"{checkpoint} holds no Gaussians (no _model.gauss_params.{missing[0]}): "
                             "it was not written by a Gaussian-splatting method.", hint=HINT)
    params = {n: pipeline[f"_model.gauss_params.{n}"].detach().float().contiguous() for n in PARAM_NAMES}
    if sh_degree == 0:  # colors are logits of RGB (splatfacto's sh_degree 0): the same colors as SH DC
        params["features_dc"] = (torch.sigmoid(params["features_dc"]) - 0.5) / SH_C0
        params["features_rest"] = params["features_rest"][:, :0]
    return params


@dataclass
class TrainedRun:
    """A finished run's Gaussians (CPU, splatfacto's parameterisation) and its train views."""

    run_dir: Path
    checkpoint: Path
    step: int
    method: str
    params: Dict[str, Tensor]
    sh_degree: int  # the model's (what its eval render uses)
    background: Tensor  # [3], the model's eval background
    dataset: object  # the datamanager's train InputDataset: cameras + images

    @property
    def num_gaussians(self) -> int:
        return int(self.params["means"].shape[0])

    @property
    def num_views(self) -> int:
        return len(self.dataset)

    def describe(self) -> Dict:
        return {"run_dir": str(self.run_dir), "checkpoint": str(self.checkpoint), "step": self.step,
                "method": self.method, "num_gaussians": self.num_gaussians, "sh_degree": self.sh_degree,
                "train_views": self.num_views}

    def colors(self, sh_degree: Optional[int] = None) -> Tuple[Tensor, int]:
        """SH coefficients [N, (d+1)^2, 3] for degree ``sh_degree`` (default: the model's)."""
        d = self.sh_degree if sh_degree is None else int(sh_degree)
        if not 0 <= d <= self.sh_degree:
            raise BytesplatError(f"--sh-degree {d}: the trained model in {self.run_dir} has SH degree {self.sh_degree}.")
        coeffs = torch.cat((self.params["features_dc"][:, None, :], self.params["features_rest"]), dim=1)
        return coeffs[:, : (d + 1) ** 2].contiguous(), d

    def view(self, index: int, scale: float = 1.0) -> Tuple[Tensor, Tensor, int, int, Tensor]:
        """Train view ``index``: (viewmat [4,4] OpenCV world-to-camera, K [3,3], width, height,
        ground truth [H,W,3] in [0,1] over the model's background), at ``scale`` x its resolution."""
        from bytesplat_ns.data.datamanager import viewmat_from_camera_to_world

        if not 0 <= index < self.num_views:
            raise BytesplatError(f"View {index} is out of range: the run in {self.run_dir} has {self.num_views} "
                                 f"train views (0..{self.num_views - 1}).")
        if not (scale > 0 and math.isfinite(scale)):
            raise BytesplatError(f"--trained-scale must be a positive number (got {scale}).")
        camera = self.dataset.cameras[index]
        try:
            data = self.dataset.get_data(index, image_type="float32")
        except Exception as e:  # noqa: BLE001 - a missing or corrupt image file
            name = self.dataset.image_filenames[index]
            raise BytesplatError(f"Cannot read train image {index} ({name}): {type(e).__name__}: {e}") from e
        image = data["image"]
        K = camera.get_intrinsics_matrices().float()
        if camera.distortion_params is not None and bool(torch.any(camera.distortion_params != 0)):
            # what FullImageDatamanager does to every image (and its intrinsics) before training
            from nerfstudio.data.datamanagers.full_images_datamanager import _undistort_image

            K_np, image_np, _ = _undistort_image(camera, camera.distortion_params.numpy(), data, image.numpy(),
                                                 K.numpy())
            K, image = torch.as_tensor(K_np).float(), torch.from_numpy(image_np)
        height, width = int(image.shape[0]), int(image.shape[1])
        if image.shape[-1] == 4:  # RGBA: over the background, as splatfacto's composite_with_background
            image = image[..., :3] * image[..., 3:] + self.background * (1.0 - image[..., 3:])
        image = image[..., :3].float()
        if scale != 1.0:
            K = K.clone()
            K[:2] *= scale  # fx, fy, cx, cy (Cameras.rescale_output_resolution)
            width, height = int(width * scale), int(height * scale)  # its "floor" rounding
            if width < 1 or height < 1:
                raise BytesplatError(f"--trained-scale {scale} leaves no pixels of view {index}.")
            image = torch.nn.functional.interpolate(image.permute(2, 0, 1)[None], size=(height, width), mode="bilinear",
                                                    align_corners=False, antialias=scale < 1)[0].permute(1, 2, 0)
        viewmat = viewmat_from_camera_to_world(camera.camera_to_worlds[None].float())[0]
        return viewmat, K, width, height, image.clamp(0.0, 1.0).contiguous()


def _check_frame(datamanager, transforms_path: Path, run_dir: Path) -> None:
    """The data must still parse into the frame the run trained in (the Gaussians' frame)."""
    saved = json.loads(transforms_path.read_text())
    outputs = datamanager.train_dataparser_outputs
    transform = outputs.dataparser_transform.float()
    ok = (torch.allclose(transform, torch.tensor(saved["transform"], dtype=torch.float32), atol=1e-4)
          and math.isclose(float(outputs.dataparser_scale), float(saved["scale"]), rel_tol=1e-4))
    if not ok:
        raise BytesplatError(f"The scene data of the run in {run_dir} now parses into another world frame than the "
                             "one it was trained in (dataparser_transforms.json differs): the data changed since.")


def load_run(run_dir: Union[str, Path]) -> TrainedRun:
    """Load a finished run's Gaussians and its train views (see the module docstring)."""
    from bytesplat_ns.trainer import read_checkpoint

    run_dir, config_path, checkpoint = run_paths(run_dir)
    config = _load_config(config_path)
    model_config = config.pipeline.model
    sh_degree = int(getattr(model_config, "sh_degree", 3))
    state = read_checkpoint(checkpoint)
    params = _gaussians(state, checkpoint, sh_degree)

    from nerfstudio.configs.method_configs import all_methods
    from nerfstudio.utils.colors import get_color

    dm_config = config.pipeline.datamanager
    if config.method_name in all_methods:  # as eval_setup does: the datamanager class of the method
        dm_config._target = all_methods[config.method_name].pipeline.datamanager._target
    if hasattr(dm_config.dataparser, "load_3D_points"):
        dm_config.dataparser.load_3D_points = False  # cameras and images only (no open3d/PLY read; same frame)
    try:
        datamanager = dm_config.setup(device="cpu", test_mode="test")
    except BytesplatError:
        raise
    except Exception as e:  # noqa: BLE001 - the scene data moved, nerfstudio's asserts, ...
        data = getattr(dm_config, "data", None) or getattr(dm_config.dataparser, "data", None)
        raise BytesplatError(f"Cannot load the scene data of the run in {run_dir} (data: {data}): "
                             f"{type(e).__name__}: {e}") from e
    _check_frame(datamanager, run_dir / "dataparser_transforms.json", run_dir)
    background_name = getattr(model_config, "background_color", "black")
    background = torch.tensor([0.1490, 0.1647, 0.2157]) if background_name == "random" else get_color(background_name)
    return TrainedRun(run_dir=run_dir, checkpoint=checkpoint, step=int(state["step"]), method=str(config.method_name),
                      params=params, sh_degree=sh_degree, background=background.float().reshape(3),
                      dataset=datamanager.train_dataset)


def _as_run(run: Union[TrainedRun, str, Path]) -> TrainedRun:
    return run if isinstance(run, TrainedRun) else load_run(run)


def raster_scene(run: Union[TrainedRun, str, Path], view: int = 0, scale: float = 1.0,
                 sh_degree: Optional[int] = None, device: str = "cuda") -> Dict:
    """``synthetic_scene``'s dict for train view ``view`` of a trained run: activated scales and
    opacities, SH colors [N,K,3], viewmats [1,4,4], Ks [1,3,3], gt [1,H,W,3], backgrounds [1,3]."""
    run = _as_run(run)
    viewmat, K, width, height, gt = run.view(view, scale)
    colors, d = run.colors(sh_degree)
    p = run.params
    to = lambda t: t.to(device).contiguous()  # noqa: E731
    return dict(means=to(p["means"]), quats=to(p["quats"]), scales=to(torch.exp(p["scales"])),
                opacities=to(torch.sigmoid(p["opacities"]).reshape(-1)), colors=to(colors), viewmats=to(viewmat[None]),
                Ks=to(K[None]), gt=to(gt[None]), backgrounds=to(run.background[None]), width=width, height=height,
                sh_degree=d)


def spread_views(run: TrainedRun, count: int) -> List[int]:
    """``count`` train views spread evenly over the run's train split."""
    if not 1 <= count <= run.num_views:
        raise BytesplatError(f"{count} views asked for; the run in {run.run_dir} has {run.num_views} train views.")
    return [int(i * run.num_views / count) for i in range(count)]


def views_scene(run: Union[TrainedRun, str, Path], views: Sequence[int], scale: float = 1.0,
                sh_degree: Optional[int] = None) -> Dict:
    """``make_scene``'s dict for train views ``views`` of a trained run (CPU): splatfacto-parameterised
    params, viewmats [B,4,4], Ks [B,3,3], images [B,H,W,3], backgrounds [B,3] (the model's)."""
    run = _as_run(run)
    colors, d = run.colors(sh_degree)
    params = {n: run.params[n].clone() for n in PARAM_NAMES}
    params["features_rest"] = colors[:, 1:].contiguous()
    loaded = [run.view(int(v), scale) for v in views]
    sizes = sorted({(w, h) for _, _, w, h, _ in loaded})
    if len(sizes) != 1:
        raise BytesplatError(f"Views {list(views)} of the run in {run.run_dir} differ in size ({sizes}); "
                             "one batch needs one image size: pick views of the same size (--trained-views).")
    (width, height), = sizes
    return {"params": params, "viewmats": torch.stack([v[0] for v in loaded]), "Ks": torch.stack([v[1] for v in loaded]),
            "images": torch.stack([v[4] for v in loaded]), "backgrounds": run.background[None].expand(len(loaded), 3).clone(),
            "width": width, "height": height, "sh_degree": d}
