"""Short ``python -m bytesplat_ns.train`` runs with the pixel/auto communicator under the local launcher,
and what they leave: checkpoints, the Gaussians in them, the scalars the writer logged."""

from __future__ import annotations

import glob
import os
import sys
from pathlib import Path

import torch

from bytesplat_ns.distributed.launch import launch_local

REPO = Path(__file__).resolve().parents[2]
WALL_S = 55  # launch_local's wall-clock bound of one run
NAMES = ("means", "scales", "quats", "features_dc", "features_rest", "opacities")


def train(tmp: Path, name: str, nprocs: int, iterations: int, extra=(), device: str = "cpu", rasterizer: str = "reference",
          expect_ok: bool = True, wall_s: float = WALL_S):
    """``python -m bytesplat_ns.train`` on ``nprocs`` ranks (gloo on the CPU, NCCL with ``device="cuda"``)."""
    args = [
        sys.executable, "-m", "bytesplat_ns.train", "bytesplat",
        "--output-dir", str(tmp / "out"), "--experiment-name", name, "--timestamp", "run",
        "--vis", "tensorboard", "--max-num-iterations", str(iterations), "--logging.steps-per-log", "1",
        "--steps-per-eval-image", "100000", "--steps-per-eval-all-images", "100000", "--steps-per-eval-batch", "0",
        "--machine.device-type", device, "--pipeline.model.rasterizer", rasterizer,
        "--pipeline.model.background-color", "black", "--pipeline.model.num-downscales", "0",
        "--pipeline.views-per-step", "2",
        *extra,
        "bytesplat-scene", "--num-views", "8", "--width", "48",
    ]
    env = dict(os.environ, BYTESPLAT_CACHE=str(tmp / "cache"), WANDB_MODE="disabled", OMP_NUM_THREADS="1",
               PYTHONUNBUFFERED="1", MPLBACKEND="Agg", PYTHONPATH=os.pathsep.join(p for p in [str(REPO), os.environ.get("PYTHONPATH", "")] if p))
    results = launch_local(args, nprocs, timeout_s=wall_s, env=env, cwd=tmp)
    detail = "\n".join(f"--- rank {r.rank} exit {r.returncode} after {r.seconds:.1f}s\n"
                       f"{r.stdout[-2000:]}\n{r.stderr[-4000:]}" for r in results)
    if not expect_ok:
        return None, results
    assert all(r.returncode == 0 for r in results), detail
    run_dir = tmp / "out" / name / "bytesplat" / "run"
    return run_dir, results


def checkpoints(run_dir: Path):
    return {int(p.stem.split("-")[1]): p for p in (run_dir / "nerfstudio_models").glob("step-*.ckpt")}


def load(path: Path):
    return torch.load(path, map_location="cpu", weights_only=False)


def gaussians(state):
    return {n: state["pipeline"][f"_model.gauss_params.{n}"] for n in NAMES}


def scalars(run_dir: Path, tag: str):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(glob.glob(str(run_dir / "events.out.tfevents.*"))[0])
    events.Reload()
    if tag not in events.Tags()["scalars"]:
        return None
    return {e.step: e.value for e in events.Scalars(tag)}


DENSIFY = ["--pipeline.model.warmup-length", "4", "--pipeline.model.refine-every", "4",
           "--pipeline.model.densify-grad-thresh", "1e-6"]
