"""Side-by-side training benchmark: splatfacto vs bytesplat (one or more backends) on the same scene.

Every method trains in this one process, one after the other, on the same data, seed and iteration
count; then each is evaluated on all held-out views with the same code. Writes one JSON file with
wall time per iteration, final eval PSNR/SSIM(/LPIPS when its weights are available), Gaussian
count, GPU, versions and the exact command. Each method's nerfstudio run directory (config.yml,
dataparser_transforms.json, the final checkpoint) stays under ``--work-dir``; the JSON names it
(``run_dir``) for ``bytesplat-bench raster/distributed --trained RUN_DIR``.

    python -m bytesplat_ns.bench.train --scene small --iterations 7000 --out outputs/bench/train.json
"""

from __future__ import annotations

import argparse
import copy
import json
import platform
import random
import shlex
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np
import torch


def environment(args: Optional[List[str]] = None, prog: str = "python -m bytesplat_ns.bench.train") -> Dict[str, str]:
    """Versions and hardware, recorded next to every number."""
    import gsplat
    import nerfstudio  # noqa: F401

    from importlib.metadata import version

    info = {
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "gsplat": gsplat.__version__,
        "nerfstudio": version("nerfstudio"),
        "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else platform.processor() or "cpu",
        "command": prog + " " + " ".join(shlex.quote(a) for a in (sys.argv[1:] if args is None else args)),
    }
    return info


def method_config(name: str, rasterizer: Optional[str]):
    from nerfstudio.configs.method_configs import all_methods  # built-in and plugin methods

    if name not in all_methods:
        raise SystemExit(f"bytesplat-bench: unknown method {name!r} (known: {', '.join(sorted(all_methods))})")
    config = copy.deepcopy(all_methods[name])
    if rasterizer is not None:
        config.pipeline.model.rasterizer = rasterizer
    # Same parsing for every method: our dataparser is nerfstudio's with a plyfile point loader,
    # so splatfacto also runs where open3d (nerfstudio's loader) is not installed.
    from bytesplat_ns.data.dataparser import BytesplatSceneDataParserConfig

    config.pipeline.datamanager.dataparser = BytesplatSceneDataParserConfig()
    return config


def set_model_option(model_config, item: str) -> None:
    """``field=value`` on a model config, the value parsed to the field's current type; a dotted field
    (``fused.trim_tile_lists=true``) names a field of a nested config."""
    key, sep, value = item.partition("=")
    *parents, key = key.strip().replace("-", "_").split(".")
    for parent in parents:
        model_config = getattr(model_config, parent, None)
    if not sep or model_config is None or not hasattr(model_config, key):
        raise SystemExit(f"bytesplat-bench train: unknown model option {item!r} (use field=value)")
    current = getattr(model_config, key)
    if isinstance(current, bool):
        parsed = value.lower() in ("1", "true", "yes", "on")
    elif isinstance(current, (int, float)):
        parsed = type(current)(value)
    elif isinstance(current, tuple):  # e.g. budget_prune_steps=7500+15000 ("," separates the options)
        parsed = tuple(int(v) for v in value.split("+") if v)
    else:
        parsed = value
    setattr(model_config, key, parsed)


def method_from_entry(entry: str, configure: Optional[Callable] = None):
    """``method[:rasterizer][@field=value,...]`` -> (label, config); ``configure(config)`` (the
    command's options for every method) runs before the entry's own field=value overrides. A field
    is the model config's, or with ``trainer.`` in front the trainer config's
    (``trainer.optimizer_steps_in_one_pass=false``)."""
    spec, _, overrides = entry.partition("@")
    name, _, rasterizer = spec.partition(":")
    config = method_config(name, rasterizer or None)
    if configure is not None:
        configure(config)
    for item in filter(None, overrides.split(",")):
        if item.startswith("trainer."):
            set_model_option(config, item[len("trainer."):])
        else:
            set_model_option(config.pipeline.model, item)
    label = entry.replace(":", "-").replace("@", "-").replace(",", "-").replace("=", "-")
    return label, config


def setup_trainer(label: str, config, data: Path, iterations: int, out_dir: Path, seed: int, device: str):
    """A ready trainer for ``config`` on ``data``: no viewer, no evaluation or saving while it
    trains, seeded. Returns (trainer, lpips_status)."""
    from bytesplat_ns.compat import offline_safe_lpips

    config.pipeline.datamanager.data = data
    config.pipeline.datamanager.dataparser.data = data
    config.output_dir = out_dir
    config.experiment_name = label
    config.timestamp = "bench"
    config.max_num_iterations = iterations
    config.vis = "tensorboard"
    config.steps_per_eval_image = 10**9
    config.steps_per_eval_batch = 10**9
    config.steps_per_eval_all_images = 10**9
    config.steps_per_save = 10**9
    config.machine.device_type = device
    config.machine.seed = seed
    config.viewer.quit_on_train_completion = True
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)

    with offline_safe_lpips() as lpips_status:  # splatfacto builds LPIPS too; offline it must not crash
        trainer = config.setup(local_rank=0, world_size=1)
        trainer.setup()
    return trainer, lpips_status


def train_and_evaluate(label: str, config, data: Path, iterations: int, out_dir: Path, seed: int, device: str) -> dict:
    from nerfstudio.utils.rich_utils import CONSOLE

    trainer, lpips_status = setup_trainer(label, config, data, iterations, out_dir, seed, device)
    # What ns-train leaves in a run directory: config.yml (saved here, as ns-train's main does),
    # dataparser_transforms.json and the final checkpoint (both written by trainer.train(), which
    # saves a checkpoint at its last step whatever steps_per_save is). `bytesplat-bench raster /
    # distributed --trained <run_dir>` load the trained scene from it.
    config.save_config()
    CONSOLE.rule(f"[bold]{label}: {iterations} iterations")
    if device == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    trainer.train()
    if device == "cuda":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    from bytesplat_ns.trainer import latest_checkpoint

    run_dir = Path(trainer.base_dir).resolve()
    checkpoint = latest_checkpoint(run_dir / config.relative_model_dir)  # a clear error if none was written
    pipeline = trainer.pipeline
    pipeline.eval()
    metrics = pipeline.get_average_eval_image_metrics(step=iterations)
    if not lpips_status.available:
        metrics.pop("lpips", None)
    result = {
        "label": label,
        "run_dir": str(run_dir),
        "checkpoint": str(checkpoint),
        "iterations": iterations,
        "train_seconds": seconds,
        "ms_per_iteration": 1000.0 * seconds / iterations,
        "num_gaussians": int(pipeline.model.num_points),
        "eval": {k: float(v) for k, v in metrics.items()},
        "peak_gpu_memory_mb": torch.cuda.max_memory_allocated() / 2**20 if device == "cuda" else None,
        "tile_occupancy": list(pipeline.model.tile_occupancy.log),
        "hw_prune_steps": [dict(s) for s in pipeline.model.pruning.history],
    }
    CONSOLE.print(result)
    print(f"bytesplat-bench train: {label}: run directory {run_dir}", flush=True)
    del trainer, pipeline
    if device == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    return result


def parser() -> argparse.ArgumentParser:
    """``bytesplat-bench train``'s options (also how a suite's train steps are checked)."""
    parser = argparse.ArgumentParser(prog="bytesplat-bench train", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scene", default="small", choices=["small", "medium", "large"], help="built-in scene size")
    parser.add_argument("--data", type=Path, default=None, help="a nerfstudio-format scene instead of the built-in one")
    parser.add_argument("--iterations", type=int, default=7000)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--seeds", type=int, nargs="+", default=None,
                        help="several seeds: every method trains once per seed (labels get -seedN) and the JSON's "
                        "summary holds each method's mean and spread (GPU atomics make single runs vary)")
    parser.add_argument(
        "--num-downscales", type=int, default=None, help="override splatfacto's coarse-to-fine start (all methods)"
    )
    parser.add_argument(
        "--methods",
        nargs="+",
        default=["splatfacto", "bytesplat:gsplat"],
        help="method[:rasterizer][@field=value,...] entries, run in this order; the fields set "
        "pipeline.model options, e.g. bytesplat:fused@hw_prune=off",
    )
    parser.add_argument("--tile-stats-every", type=int, default=0,
                        help="bytesplat methods: log tile occupancy vs the fused capacity every N steps (into the JSON)")
    parser.add_argument(
        "--hw-prune", choices=["auto", "on", "off"], default=None,
        help="bytesplat methods' hardware-aware pruning (off: compare the rasterizers alone)",
    )
    parser.add_argument("--out", type=Path, default=Path("outputs/bench/train.json"))
    parser.add_argument("--work-dir", type=Path, default=Path("outputs/bench"),
                        help="where each method's nerfstudio run directory goes: WORK_DIR/<label>/<method>/bench "
                        "(config.yml, dataparser_transforms.json, nerfstudio_models/step-*.ckpt; the JSON's "
                        "run_dir), for `bytesplat-bench raster/distributed --trained RUN_DIR`")
    return parser


def main(argv: Optional[List[str]] = None) -> dict:
    args = parser().parse_args(argv)

    import bytesplat_ns  # noqa: F401  (registers the torch.load allow-list and error hook)
    from bytesplat_ns.data.scene import SceneSpec, ensure_scene

    # absolute: the saved config.yml must find the data from any working directory
    data = (args.data if args.data is not None else ensure_scene(SceneSpec(size=args.scene))).resolve()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    report = {"environment": environment(argv), "scene": str(data), "runs": []}

    def configure(config) -> None:
        model = config.pipeline.model
        if args.tile_stats_every and hasattr(model, "tile_stats_every"):
            model.tile_stats_every = args.tile_stats_every
        if args.num_downscales is not None:
            model.num_downscales = args.num_downscales
        if hasattr(model, "min_train_resolution"):  # A/B: every method on splatfacto's schedule as is
            model.min_train_resolution = 0
        if args.hw_prune is not None and hasattr(model, "hw_prune"):
            model.hw_prune = args.hw_prune

    seeds = args.seeds or [args.seed]
    for seed in seeds:  # seed-major: a run cut short still has every method at the first seeds
        for entry in args.methods:
            label, config = method_from_entry(entry, configure)
            label = label if len(seeds) == 1 else f"{label}-seed{seed}"
            run = train_and_evaluate(label, config, data, args.iterations, args.work_dir.resolve(), seed, device)
            report["runs"].append(dict(run, method=entry, seed=seed))
            if len(seeds) > 1:
                report["summary"] = summarize(report["runs"], baseline="splatfacto" if "splatfacto" in args.methods else None)
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(report, indent=2))  # after every run: a cut-short job keeps its results
    print(json.dumps(report, indent=2))
    return report


def _mean_std(values: List[float]) -> Tuple[float, float]:
    import statistics

    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


def paired_differences(pairs: List[Tuple[dict, dict]]) -> Dict[str, Any]:
    """Over (run, baseline run) pairs of one seed each (``seed``, ``eval.psnr``, ``eval.ssim``): the
    seeds and the mean and sample standard deviation of the PSNR and SSIM differences."""
    out: Dict[str, Any] = {"seeds": [r["seed"] for r, _ in pairs]}
    for name in ("psnr", "ssim"):
        out[f"{name}_diff_mean"], out[f"{name}_diff_std"] = _mean_std([r["eval"][name] - b["eval"][name] for r, b in pairs])
    return out


def summarize(runs: List[dict], baseline: Optional[str] = None) -> Dict[str, dict]:
    """Per method entry: the number of runs, mean and sample standard deviation of eval PSNR/SSIM and
    of ms per iteration. With ``baseline`` (a method entry), every other method also gets its paired
    comparison over the seeds both ran (``vs_baseline``): the mean and spread of its per-seed PSNR and
    SSIM differences and of the baseline's ms per iteration over its own. Seeds move both methods'
    PSNR together (the same seed starts both from the same Gaussians), so the paired difference says
    far more about equal quality than the two means do."""
    out: Dict[str, dict] = {}
    for method in dict.fromkeys(r["method"] for r in runs):
        mine = [r for r in runs if r["method"] == method]
        row: Dict[str, Any] = {"runs": len(mine)}
        for name, values in (("psnr", [r["eval"]["psnr"] for r in mine]), ("ssim", [r["eval"]["ssim"] for r in mine]),
                             ("ms_per_iteration", [r["ms_per_iteration"] for r in mine])):
            row[f"{name}_mean"], row[f"{name}_std"] = _mean_std(values)
        out[method] = row
    base_runs = {r["seed"]: r for r in runs if r["method"] == baseline}
    for method, row in out.items():
        pairs = [(r, base_runs[r["seed"]]) for r in runs if r["method"] == method and r.get("seed") in base_runs]
        if method == baseline or not pairs:
            continue
        vs: Dict[str, Any] = {"baseline": baseline, **paired_differences(pairs)}
        vs["speedup_mean"], vs["speedup_std"] = _mean_std([b["ms_per_iteration"] / r["ms_per_iteration"] for r, b in pairs])
        row["vs_baseline"] = vs
    return out


if __name__ == "__main__":
    main()
