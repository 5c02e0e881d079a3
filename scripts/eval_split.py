"""ns-eval's metrics over the TRAINING views of a finished run (or its held-out views), one process.

Why: on the built-in scenes a few held-out views sometimes get fog-like Gaussians close to their
cameras, which no training view constrains, so their eval PSNR moves by several dB from run to run
with the same code (docs/benchmarks.md, "The backward's reciprocal and the loss kernel's region").
How well the optimisation fitted the views it trained on does not have that noise, which makes it
the sharper check that two training paths (one GPU against two, pruning off against on) optimise
alike. Same model calls as ns-eval (``get_outputs_for_camera``, ``get_image_metrics_and_images``),
so the same PSNR / SSIM (LPIPS where its weights are available).

    python scripts/eval_split.py --load-config outputs/.../config.yml --split train --out eval_train.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def evaluate(load_config: Path, split: str) -> dict:
    from nerfstudio.data.utils.dataloaders import FixedIndicesEvalDataloader
    from nerfstudio.utils.eval_utils import eval_setup

    config, pipeline, checkpoint, step = eval_setup(load_config)
    dm = pipeline.datamanager
    dataset = dm.train_dataset if split == "train" else dm.eval_dataset
    loader = FixedIndicesEvalDataloader(input_dataset=dataset, device=dm.device)
    metrics = pipeline.get_average_image_metrics(loader, split, step, None, get_std=True)
    return {
        "experiment_name": config.experiment_name,
        "method_name": config.method_name,
        "checkpoint": str(checkpoint),
        "split": split,
        "num_views": len(dataset),
        "results": {k: float(v) for k, v in metrics.items()},
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--load-config", type=Path, required=True)
    p.add_argument("--split", choices=("train", "eval"), default="train")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args()
    if not args.load_config.is_file():
        p.error(f"--load-config {args.load_config}: no such file (a run's config.yml)")
    out = evaluate(args.load_config, args.split)
    args.out.write_text(json.dumps(out, indent=2))
    r = out["results"]
    print(f"{out['split']} views ({out['num_views']}): PSNR {r.get('psnr', float('nan')):.3f}, "
          f"SSIM {r.get('ssim', float('nan')):.4f} -> {args.out}")


if __name__ == "__main__":
    main()
