"""A tiny ns-train bytesplat run of the built-in scene on CPU (reference rasterizer), for tests that need a
trained run's config.yml (export, render)."""

from __future__ import annotations

from pathlib import Path

from tests.helpers.cli import cli_env, describe, run_cli


def train_tiny(tmp: Path, name: str, iterations: int) -> Path:
    """Train ``iterations`` steps, saving the last one; returns the run's config.yml."""
    args = [
        "ns-train", "bytesplat", "--output-dir", str(tmp / "outputs"), "--experiment-name", name,
        "--timestamp", "run", "--vis", "tensorboard", "--max-num-iterations", str(iterations),
        "--steps-per-save", str(iterations), "--steps-per-eval-image", "100000",
        "--steps-per-eval-all-images", "100000", "--machine.device-type", "cpu",
        "--pipeline.model.rasterizer", "reference", "--pipeline.model.num-downscales", "0",
    ]
    result = run_cli(args, cli_env(tmp / "cache"), timeout=600)
    assert result.returncode == 0, describe(result)
    return tmp / "outputs" / name / "bytesplat" / "run" / "config.yml"
