"""ns-render on a bytesplat run (CPU): an interpolated camera path through the built-in scene's eval views becomes
an H.264 video (nerfstudio writes it with ffmpeg, which install.sh installs), whose first frame is the model's
render of the first eval view."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from tests.helpers.cli import cli_env, describe, run_cli
from tests.helpers.tiny_runs import train_tiny

pytestmark = pytest.mark.slow

ITERATIONS = 30
STEPS = 2  # frames between consecutive eval views


@pytest.fixture(scope="module")
def trained_config(tmp_path_factory) -> Path:
    return train_tiny(tmp_path_factory.mktemp("render"), "render", ITERATIONS)


def probe(video: Path) -> dict:
    out = subprocess.run(["ffprobe", "-v", "error", "-count_frames", "-show_entries",
                          "stream=codec_name,width,height,nb_read_frames", "-of", "json", str(video)],
                         capture_output=True, text=True, timeout=60, check=True)
    return json.loads(out.stdout)["streams"][0]


def first_frame(video: Path, width: int, height: int) -> np.ndarray:
    raw = subprocess.run(["ffmpeg", "-v", "error", "-i", str(video), "-frames:v", "1", "-f", "rawvideo",
                          "-pix_fmt", "rgb24", "-"], capture_output=True, timeout=60, check=True).stdout
    return np.frombuffer(raw, np.uint8).reshape(height, width, 3).astype(np.float64) / 255.0


def test_ns_render_interpolate_writes_a_video_of_the_scene(trained_config):
    assert shutil.which("ffmpeg") and shutil.which("ffprobe"), "ffmpeg is not installed (install.sh installs it)"
    video = trained_config.parent / "interpolate.mp4"
    result = run_cli(
        ["ns-render", "interpolate", "--load-config", str(trained_config), "--output-path", str(video),
         "--pose-source", "eval", "--interpolation-steps", str(STEPS), "--frame-rate", "4",
         "--rendered-output-names", "rgb"],
        cli_env(trained_config.parent / "render-cache"), timeout=600,
    )
    assert result.returncode == 0, describe(result)

    import torch
    from nerfstudio.utils.eval_utils import eval_setup

    _, pipeline, _, _ = eval_setup(trained_config, test_mode="test")
    cameras = pipeline.datamanager.eval_dataset.cameras
    width, height = int(cameras.width[0]), int(cameras.height[0])
    stream = probe(video)
    assert stream["codec_name"] == "h264" and (stream["width"], stream["height"]) == (width, height), stream
    assert int(stream["nb_read_frames"]) == STEPS * (len(cameras) - 1), stream

    with torch.no_grad():
        ours = pipeline.model.get_outputs_for_camera(cameras[0:1].to(pipeline.device))["rgb"].cpu().numpy()
    frame = first_frame(video, width, height)
    assert frame.std() > 0.05  # a picture, not a blank frame
    mse = float(np.mean((frame - ours) ** 2))
    assert 10 * np.log10(1.0 / mse) > 30.0, f"first frame vs the render of eval view 0: mse {mse:.5f}"
