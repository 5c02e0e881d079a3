r"""``ns-eval`` that also keeps each eval image's metrics, for ``bytesplat-bench wallclock``.

    python -m bytesplat_ns.bench.eval_images --images IMAGES.json [--offline-lpips] -- [ns-eval arguments]

runs nerfstudio's own ``ns-eval`` (the same pipeline and the same averages in its ``--output-path``
JSON) and writes IMAGES.json: a list with, per eval image in the order ns-eval renders them, its
index in the eval split, its file name and the PSNR and SSIM the model computed for it. A capture
has few eval images (the fox capture: 5), so one view spoiled by a floater in front of its camera
moves the mean by a dB or more; the list tells that apart from every view being a little worse.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import sys
from pathlib import Path
from typing import Dict, List, Optional

IMAGE_METRICS = ("psnr", "ssim")  # lpips is left out: offline it may be a placeholder (compat.offline_safe_lpips)


def _image_index(batch: Dict) -> Optional[int]:
    index = batch.get("image_idx")
    if index is None:
        return None
    return int(index.item()) if hasattr(index, "item") else int(index)


def record_image_metrics(pipeline, images: List[Dict]) -> None:
    """Wrap this pipeline's model so every ``get_image_metrics_and_images`` call appends the image's
    metrics to ``images`` (the model instance only: nothing else changes)."""
    model = pipeline.model
    real = model.get_image_metrics_and_images
    dataset = getattr(getattr(pipeline, "datamanager", None), "eval_dataset", None)
    names = list(getattr(dataset, "image_filenames", None) or [])

    @functools.wraps(real)
    def get_image_metrics_and_images(outputs, batch):
        metrics, images_dict = real(outputs, batch)
        index = _image_index(batch)
        name = names[index] if index is not None and index < len(names) else None
        entry: Dict = {"index": index, "file": Path(name).name if name is not None else None}
        entry.update({key: float(metrics[key]) for key in IMAGE_METRICS if key in metrics})
        images.append(entry)
        return metrics, images_dict

    model.get_image_metrics_and_images = get_image_metrics_and_images


def main(argv: Optional[List[str]] = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    cut = argv.index("--") if "--" in argv else len(argv)
    p = argparse.ArgumentParser(prog="python -m bytesplat_ns.bench.eval_images",
                                usage="%(prog)s --images PATH [--offline-lpips] -- [ns-eval args]")
    p.add_argument("--images", type=Path, required=True, help="where the per-image metrics go (JSON)")
    p.add_argument("--offline-lpips", action="store_true", help="LPIPS through bytesplat's offline check")
    own = p.parse_args(argv[:cut])

    import nerfstudio.scripts.eval as ns_eval

    from bytesplat_ns.compat import offline_safe_lpips

    images: List[Dict] = []
    real_setup = ns_eval.eval_setup

    def eval_setup(*args, **kwargs):
        loaded = real_setup(*args, **kwargs)
        record_image_metrics(loaded[1], images)  # (config, pipeline, checkpoint path, step)
        return loaded

    ns_eval.eval_setup = eval_setup
    sys.argv = ["ns-eval", *argv[cut + 1:]]
    with offline_safe_lpips() if own.offline_lpips else contextlib.nullcontext():
        ns_eval.entrypoint()
    own.images.parent.mkdir(parents=True, exist_ok=True)
    own.images.write_text(json.dumps(images, indent=1))


if __name__ == "__main__":
    main()
