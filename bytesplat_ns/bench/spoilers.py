r"""``bytesplat-bench spoilers``: which Gaussians spoil one eval view, what they are, and since when.

    bytesplat-bench spoilers --load-config RUN/config.yml --image 0052.jpg [--top 100] --out spoilers.json

A 30000-iteration run on a capture can end with one of its few eval views several dB below the
others (the fox capture: 20.9 dB for one view of a run whose other four score 26.5-29.8), while
every training view is fine. This tool takes the run's latest checkpoint and that view and:

1. ranks the Gaussians by their share of the view's squared error: Gaussian ``g`` gets
   ``sum_p w(g, p) * e(p)``, its compositing weights ``w = alpha * T`` times the pixel's squared
   error (mean over channels), taken from any backend's backward as in ``gaussian_budget.py``;
2. re-renders the view with the top 1, 10, 100 and 1000 of them removed (the PSNR a fix that
   removed them would give);
3. describes the top ones beside the median Gaussian: opacity, largest and smallest scale, size of
   the view-dependent colour (the SH coefficients above degree 0), distance to the eval camera and
   to the nearest training camera, depth in that training camera (negative: behind it), and their
   summed weights in all training views (zero: no training view shows them);
4. follows the top ones back through the run's other checkpoints that hold the same Gaussians
   (after densification stops nothing is added or removed; ``ns-train --save-only-latest-checkpoint
   False`` keeps them): the view's PSNR, their error share and their median parameters at each.
   Which parameter runs away, and when, says what to fix.

The JSON is small enough to sit in a benchmark result (``bytesplat-bench wallclock --spoilers``).
Works for any Gaussian-splatting checkpoint nerfstudio loads (splatfacto's too).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch
from torch import Tensor

REMOVED_COUNTS = (1, 10, 100, 1000)
DESCRIBED = 20  # the top Gaussians listed one by one


class ViewProbe:
    """One eval view of a loaded pipeline: its ground truth, renders and error attribution."""

    def __init__(self, pipeline, image_name: str):
        self.model = pipeline.model
        dataset = pipeline.datamanager.eval_dataset
        names = [Path(name).name for name in dataset.image_filenames]
        if image_name not in names:
            from bytesplat_ns.errors import BytesplatError

            raise BytesplatError(f"--image {image_name}: not an eval image of this run (eval images: {', '.join(names)})")
        index = names.index(image_name)
        self.camera = dataset.cameras[index:index + 1].to(self.model.device)
        # The datamanager's cached image, as the eval renders are scored against: for a capture with lens
        # distortion it is undistorted (and cropped) to the camera the render uses; dataset[index] is
        # the photo as taken.
        self.batch = pipeline.datamanager.cached_eval[index]

    def render(self) -> Dict[str, Tensor]:
        """The model's eval render of the view and the ground truth it is scored against ([H,W,3] each),
        as splatfacto's ``get_image_metrics_and_images`` pairs them (without its metrics: no LPIPS)."""
        model = self.model
        model.eval()
        with torch.no_grad():
            outputs = model.get_outputs_for_camera(self.camera)
            target = model.composite_with_background(model.get_gt_img(self.batch["image"]), outputs["background"])
        return {"target": target.float(), "predicted": outputs["rgb"].float()}

    def psnr(self) -> float:
        from bytesplat_ns.image_metrics import psnr

        out = self.render()
        return float(psnr(out["predicted"], out["target"]))

    def psnr_without(self, rows: Tensor) -> float:
        """The view's PSNR with these Gaussians made fully transparent (their opacities restored after)."""
        opacities = self.model.gauss_params["opacities"]
        kept = opacities.data[rows].clone()
        with torch.no_grad():
            opacities.data[rows] = -1e4
        try:
            return self.psnr()
        finally:
            with torch.no_grad():
                opacities.data[rows] = kept

    def error_attribution(self, backend: str) -> Tuple[float, Tensor]:
        """The view's PSNR and [N] each Gaussian's compositing weights times the squared error of the
        pixels they fall on (from one render)."""
        from bytesplat_ns.gaussian_budget import view_blending_weights
        from bytesplat_ns.image_metrics import psnr

        out = self.render()
        error = ((out["predicted"] - out["target"]) ** 2).mean(dim=-1)
        render = colour_renderer(self.model, self.camera, backend)
        return float(psnr(out["predicted"], out["target"])), view_blending_weights(
            render, self.model.num_points, self.model.device, pixel_weights=error.to(self.model.device))


def colour_renderer(model, camera, backend: str) -> Callable[[Tensor], Tensor]:
    """``render(colors)`` of the model's Gaussians from ``camera`` at its full resolution ([1,H,W,3],
    no background), as the Gaussian budget renders them."""
    from bytesplat_ns.data.datamanager import viewmat_from_camera_to_world
    from bytesplat_ns.model import intrinsics_matrices
    from bytesplat_ns.raster import rasterize

    with torch.no_grad():
        means, quats = model.means.detach(), model.quats.detach()
        scales = torch.exp(model.scales.detach())
        opacities = torch.sigmoid(model.opacities.detach()).squeeze(-1)
        viewmat = viewmat_from_camera_to_world(camera.camera_to_worlds.to(model.device))
    intrinsics = intrinsics_matrices(camera).to(model.device)
    width, height = int(camera.width.item()), int(camera.height.item())

    def render(colors: Tensor) -> Tensor:
        image, _, _ = rasterize(means, quats, scales, opacities, colors, viewmat, intrinsics, width, height,
                                backend=backend)
        return image

    return render


def camera_geometry(cameras, device) -> Dict[str, Tensor]:
    """Centres [C,3] and OpenCV world-to-camera matrices [C,4,4] of nerfstudio cameras."""
    from bytesplat_ns.data.datamanager import viewmat_from_camera_to_world

    c2w = cameras.camera_to_worlds.to(device).float()
    return {"centres": c2w[:, :3, 3], "viewmats": viewmat_from_camera_to_world(c2w)}


def depth_in(viewmats: Tensor, points: Tensor) -> Tensor:
    """[C,N] depth (camera z, forward positive) of each point in each camera."""
    return torch.einsum("cj,nj->cn", viewmats[:, 2, :3], points) + viewmats[:, 2, 3:4]


def gaussian_features(model, rows: Tensor, eval_geometry: Dict[str, Tensor], train_geometry: Dict[str, Tensor],
                      train_weights: Optional[Tensor] = None) -> Dict[str, Tensor]:
    """Per Gaussian in ``rows``: the descriptors of the module docstring (item 3), each [len(rows)]."""
    with torch.no_grad():
        means = model.means.detach()[rows].float()
        scales = torch.exp(model.scales.detach()[rows].float())
        distances = torch.cdist(means, train_geometry["centres"])  # [n, C]
        nearest = distances.argmin(dim=1)
        train_depths = depth_in(train_geometry["viewmats"], means)  # [C, n]
        features = {
            "opacity": torch.sigmoid(model.opacities.detach()[rows].float()).squeeze(-1),
            "scale_max": scales.amax(dim=-1),
            "scale_min": scales.amin(dim=-1),
            "sh_rest_norm": model.features_rest.detach()[rows].float().flatten(1).norm(dim=1),
            "eval_camera_distance": (means - eval_geometry["centres"][0]).norm(dim=1),
            "eval_camera_depth": depth_in(eval_geometry["viewmats"], means)[0],
            "nearest_train_camera": nearest.float(),
            "nearest_train_camera_distance": distances.gather(1, nearest[:, None]).squeeze(1),
            "nearest_train_camera_depth": train_depths.gather(0, nearest[None]).squeeze(0),
        }
        if train_weights is not None:
            features["train_weight"] = train_weights[rows].float()
    return features


def training_view_weights(model, cameras, backend: str) -> Tensor:
    """[N] every Gaussian's compositing weights summed over the training views (full resolution)."""
    from bytesplat_ns.gaussian_budget import summed_over_views, view_blending_weights

    def per_view():
        for index in range(len(cameras)):
            camera = cameras[index:index + 1].to(model.device)
            yield view_blending_weights(colour_renderer(model, camera, backend), model.num_points, model.device)

    return summed_over_views(per_view(), model.num_points, model.device)[0]


def medians(features: Dict[str, Tensor]) -> Dict[str, float]:
    return {key: float(value.float().median()) for key, value in features.items() if key != "nearest_train_camera"}


def checkpoint_paths(config) -> List[Path]:
    """The run's checkpoints, oldest first."""
    directory = Path(config.get_checkpoint_dir())
    return sorted(directory.glob("step-*.ckpt"), key=lambda path: int(path.stem.split("-")[-1]))


def trajectory_point(probe: ViewProbe, rows: Tensor, final_means: Tensor, backend: str,
                     eval_geometry: Dict[str, Tensor], train_geometry: Dict[str, Tensor]) -> Dict:
    """The view and the followed Gaussians at the checkpoint the pipeline holds now."""
    model = probe.model
    if model.num_points != final_means.shape[0]:  # densification or pruning since: rows are other Gaussians
        return {"num_gaussians": model.num_points, "psnr": probe.psnr(), "tracked": False}
    psnr, attribution = probe.error_attribution(backend)
    point: Dict = {"num_gaussians": model.num_points, "psnr": psnr}
    features = gaussian_features(model, rows, eval_geometry, train_geometry)
    with torch.no_grad():
        features["displacement_to_final"] = (model.means.detach()[rows].float() - final_means[rows]).norm(dim=1)
    total = float(attribution.sum())
    point.update(tracked=True, error_share=float(attribution[rows].sum()) / total if total > 0 else 0.0,
                 median=medians(features))
    return point


def analyse(pipeline, image_name: str, step: int, top: int = 100, backend: Optional[str] = None,
            checkpoints: Sequence[Path] = (), log: Callable[[str], None] = print) -> Dict:
    """The report of the module docstring for the checkpoint ``pipeline`` holds (the run's latest),
    then ``checkpoints`` loaded one after the other."""
    from bytesplat_ns.checkpoints import read_checkpoint

    model = pipeline.model
    backend = backend or getattr(model, "rasterizer_backend", None) or ("gsplat" if model.device.type == "cuda"
                                                                         else "reference")
    probe = ViewProbe(pipeline, image_name)
    eval_geometry = camera_geometry(probe.camera, model.device)
    train_cameras = pipeline.datamanager.train_dataset.cameras
    train_geometry = camera_geometry(train_cameras, model.device)

    log(f"spoilers: {image_name}: attributing its error to {model.num_points} Gaussians ({backend})")
    psnr, attribution = probe.error_attribution(backend)
    total = float(attribution.sum())
    order = torch.argsort(attribution, descending=True)
    count = min(top, model.num_points)
    rows = order[:count]
    share = attribution[order] / total if total > 0 else torch.zeros_like(attribution)
    cumulative = torch.cumsum(share, 0)
    removed = {str(k): {"error_share": float(cumulative[k - 1]), "psnr": probe.psnr_without(order[:k])}
               for k in REMOVED_COUNTS if k <= model.num_points}

    log(f"spoilers: weights of every Gaussian in {len(train_cameras)} training views")
    train_weights = training_view_weights(model, train_cameras, backend)
    every = torch.arange(model.num_points, device=model.device)
    described = gaussian_features(model, rows, eval_geometry, train_geometry, train_weights)
    listed = []
    for i in range(min(DESCRIBED, count)):
        entry = {"index": int(rows[i]), "error_share": float(share[i])}
        entry.update({key: float(value[i]) for key, value in described.items()})
        entry["nearest_train_camera"] = int(entry["nearest_train_camera"])
        listed.append(entry)
    result: Dict = {
        "image": image_name, "psnr": psnr, "num_gaussians": model.num_points, "rasterizer": backend,
        "step": int(step), "top": count,
        "removed": removed,
        "top_median": medians(described),
        "all_median": medians(gaussian_features(model, every, eval_geometry, train_geometry, train_weights)),
        "top_unseen_by_training": int((described["train_weight"] <= 0).sum()),
        "spoilers": listed,
        "trajectory": [],
    }

    final_means = model.means.detach().float().clone()
    for path in checkpoints:
        state = read_checkpoint(path)
        pipeline.load_pipeline(state["pipeline"], state["step"])
        log(f"spoilers: following the top {count} through {path.name}")
        point = {"step": int(state["step"])}
        point.update(trajectory_point(probe, rows, final_means, backend, eval_geometry, train_geometry))
        result["trajectory"].append(point)
    return result


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="bytesplat-bench spoilers", description=__doc__.split("\n\n")[1].strip())
    p.add_argument("--load-config", type=Path, required=True, help="the run's config.yml (as for ns-eval)")
    p.add_argument("--image", required=True, help="the eval image's file name, e.g. 0052.jpg")
    p.add_argument("--top", type=int, default=100, help="how many of the highest-ranked Gaussians to describe and follow")
    p.add_argument("--rasterizer", default=None, choices=("reference", "gsplat", "fused"),
                   help="backend of the attribution renders (default: the model's own; gsplat for other methods)")
    p.add_argument("--no-trajectory", dest="trajectory", action="store_false",
                   help="only the latest checkpoint, not the run's earlier ones")
    p.add_argument("--out", type=Path, required=True, help="JSON output path")
    return p


def main(argv: Optional[List[str]] = None) -> Dict:
    args = parser().parse_args(argv)
    from nerfstudio.utils.eval_utils import eval_setup

    from bytesplat_ns.compat import offline_safe_lpips

    # splatfacto builds LPIPS (downloading its weights) when its model is set up; no metric here needs it
    with offline_safe_lpips():
        config, pipeline, checkpoint, step = eval_setup(args.load_config, test_mode="test")
    earlier = [path for path in checkpoint_paths(config) if path != Path(checkpoint)] if args.trajectory else []
    result = analyse(pipeline, args.image, step, top=args.top, backend=args.rasterizer, checkpoints=earlier,
                     log=lambda line: print(line, file=sys.stderr, flush=True))
    result.update(config=str(args.load_config), checkpoint=str(checkpoint))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
