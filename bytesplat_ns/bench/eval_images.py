r"""``ns-eval`` that also keeps each eval image's metrics, for ``bytesplat-bench wallclock``.

    python -m bytesplat_ns.bench.eval_images --images IMAGES.json [--offline-lpips] -- [ns-eval arguments]

runs nerfstudio's own ``ns-eval`` (the same pipeline and the same averages in its ``--output-path``
JSON) and writes IMAGES.json: a list with, per eval image in the order ns-eval renders them, its
index in the eval split, its file name and the PSNR and SSIM the model computed for it. A capture
has few eval images (the fox capture: 5), so one view spoiled by a floater in front of its camera
moves the mean by a dB or more; the list tells that apart from every view being a little worse.

``--worst-view PNG`` also writes the worst image's panel: ground truth, render and depth side by
side (what spoiled the view: a floater shows in the depth as a near blob). ``--rasterizer NAME``
renders a bytesplat model with another backend than the one it trained with (``gsplat``: the
rasterizer splatfacto evaluates with), so a view spoiled only by our eval render tells itself apart
from one spoiled by the trained Gaussians.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import sys
from pathlib import Path
from typing import Callable, Dict, List, Optional

IMAGE_METRICS = ("psnr", "ssim")  # lpips is left out: offline it may be a placeholder (compat.offline_safe_lpips)


def _image_index(batch: Dict) -> Optional[int]:
    index = batch.get("image_idx")
    if index is None:
        return None
    return int(index.item()) if hasattr(index, "item") else int(index)


class WorstView:
    """Keeps the panel (ground truth | render | depth, 8-bit, on the host) of the lowest-PSNR image seen."""

    def __init__(self):
        self.psnr = float("inf")
        self.panel = None
        self.entry: Optional[Dict] = None

    def offer(self, entry: Dict, outputs: Dict, images_dict: Dict) -> None:
        psnr = entry.get("psnr")
        if psnr is None or psnr >= self.psnr or "img" not in images_dict:
            return
        self.psnr, self.entry, self.panel = psnr, entry, view_panel(images_dict["img"], outputs.get("depth"))

    def write(self, path: Path, max_width: int = 1200) -> bool:
        """The panel as PNG at ``path``, shrunk to at most ``max_width`` pixels wide (a capture's panel
        stays near 1 MB: several runs' come back through the device in one 16 MB archive); False if none
        was kept."""
        if self.panel is None:
            return False
        from PIL import Image

        image = Image.fromarray(self.panel)
        if image.width > max_width:
            image = image.resize((max_width, max(1, round(image.height * max_width / image.width))), Image.BILINEAR)
        path.parent.mkdir(parents=True, exist_ok=True)
        image.save(path)
        return True


def view_panel(combined_rgb, depth=None):
    """uint8 [H, W*k, 3]: splatfacto's ground truth | render image, then the depth (near bright) when given."""
    import torch

    parts = [combined_rgb.detach().float().clamp(0, 1)]
    if depth is not None:
        d = depth.detach().float().reshape(combined_rgb.shape[0], -1, 1)
        finite = d[torch.isfinite(d)]
        lo, hi = (finite.min(), finite.max()) if finite.numel() else (torch.tensor(0.0), torch.tensor(1.0))
        near = 1.0 - ((d - lo) / (hi - lo).clamp_min(1e-12)).clamp(0, 1)
        parts.append(near.nan_to_num(0.0).expand(-1, -1, 3).to(parts[0].device))
    return (torch.cat(parts, dim=1) * 255.0 + 0.5).to(torch.uint8).cpu().numpy()


def record_image_metrics(pipeline, images: List[Dict], worst: Optional[WorstView] = None,
                         active: Callable[[], bool] = lambda: True) -> None:
    """Wrap this pipeline's model so every ``get_image_metrics_and_images`` call while ``active()``
    appends the image's metrics to ``images`` (and offers its panel to ``worst``); the model instance
    only: nothing else changes."""
    model = pipeline.model
    real = model.get_image_metrics_and_images
    dataset = getattr(getattr(pipeline, "datamanager", None), "eval_dataset", None)
    names = list(getattr(dataset, "image_filenames", None) or [])

    @functools.wraps(real)
    def get_image_metrics_and_images(outputs, batch):
        metrics, images_dict = real(outputs, batch)
        if not active():
            return metrics, images_dict
        index = _image_index(batch)
        name = names[index] if index is not None and index < len(names) else None
        entry: Dict = {"index": index, "file": Path(name).name if name is not None else None}
        entry.update({key: float(metrics[key]) for key in IMAGE_METRICS if key in metrics})
        images.append(entry)
        if worst is not None:
            worst.offer(entry, outputs, images_dict)
        return metrics, images_dict

    model.get_image_metrics_and_images = get_image_metrics_and_images


def use_rasterizer(pipeline, name: str) -> None:
    """Render the loaded bytesplat model with backend ``name`` from now on."""
    from bytesplat_ns.errors import BytesplatError

    model = pipeline.model
    if not hasattr(getattr(model, "config", None), "rasterizer") or not hasattr(model, "_backend"):
        raise BytesplatError(f"--rasterizer {name}: the loaded model ({type(model).__name__}) is not a bytesplat model")
    model.config.rasterizer = name
    model._backend = None  # resolved again on the next render


def main(argv: Optional[List[str]] = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    cut = argv.index("--") if "--" in argv else len(argv)
    p = argparse.ArgumentParser(prog="python -m bytesplat_ns.bench.eval_images",
                                usage="%(prog)s --images PATH [--offline-lpips] -- [ns-eval args]")
    p.add_argument("--images", type=Path, required=True, help="where the per-image metrics go (JSON)")
    p.add_argument("--offline-lpips", action="store_true", help="LPIPS through bytesplat's offline check")
    p.add_argument("--worst-view", type=Path, default=None,
                   help="PNG of the worst image: ground truth, render and depth side by side")
    p.add_argument("--rasterizer", default=None, choices=("reference", "gsplat", "fused"),
                   help="render a bytesplat model with this backend instead of its configured one")
    own = p.parse_args(argv[:cut])

    import nerfstudio.scripts.eval as ns_eval

    from bytesplat_ns.compat import offline_safe_lpips

    images: List[Dict] = []
    worst = WorstView() if own.worst_view is not None else None
    real_setup = ns_eval.eval_setup

    def eval_setup(*args, **kwargs):
        loaded = real_setup(*args, **kwargs)  # (config, pipeline, checkpoint path, step)
        if own.rasterizer is not None:
            use_rasterizer(loaded[1], own.rasterizer)
        record_image_metrics(loaded[1], images, worst)
        return loaded

    ns_eval.eval_setup = eval_setup
    sys.argv = ["ns-eval", *argv[cut + 1:]]
    with offline_safe_lpips() if own.offline_lpips else contextlib.nullcontext():
        ns_eval.entrypoint()
    own.images.parent.mkdir(parents=True, exist_ok=True)
    own.images.write_text(json.dumps(images, indent=1))
    if worst is not None:
        worst.write(own.worst_view)


if __name__ == "__main__":
    main()
