"""Bad input through the real CLIs: one clear message, a non-zero exit, no traceback, in bounded time."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.helpers.cli import cli_env, run_cli

pytestmark = pytest.mark.slow


def ns_train(tmp: Path, *args: str):
    return run_cli(
        ["ns-train", "bytesplat", "--output-dir", str(tmp / "out"), "--vis", "tensorboard",
         "--machine.device-type", "cpu", "--max-num-iterations", "2", *args],
        cli_env(tmp / "cache"),
        timeout=300,
    )


def assert_clear_error(result, *fragments: str) -> None:
    assert result.returncode != 0
    assert "bytesplat: error:" in result.stderr, result.stderr[-3000:]
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    message = result.stderr.split("bytesplat: error:", 1)[1]
    for fragment in fragments:
        assert fragment in message, message


def test_missing_data_path(tmp_path):
    assert_clear_error(ns_train(tmp_path, "--data", str(tmp_path / "nowhere")), "does not exist", "nowhere")


def test_transforms_without_frames(tmp_path):
    scene = tmp_path / "scene"
    scene.mkdir()
    (scene / "transforms.json").write_text(json.dumps({"fl_x": 100, "fl_y": 100, "cx": 32, "cy": 32, "w": 64, "h": 64}))
    assert_clear_error(ns_train(tmp_path, "--data", str(scene)), "frames")


def test_corrupt_image(tmp_path):
    scene = tmp_path / "scene"
    (scene / "images").mkdir(parents=True)
    frame = {"file_path": "images/0.png", "transform_matrix": torch.eye(4).tolist()}
    meta = {"fl_x": 100, "fl_y": 100, "cx": 32, "cy": 32, "w": 64, "h": 64, "frames": [frame] * 1}
    (scene / "transforms.json").write_text(json.dumps(meta))
    (scene / "images" / "0.png").write_bytes(b"\x89PNG\r\n\x1a\n not really a png")
    assert_clear_error(ns_train(tmp_path, "--data", str(scene)), "0.png")


def test_checkpoint_from_another_method(tmp_path):
    foreign = tmp_path / "nerfacto.ckpt"
    torch.save(
        {"step": 10, "pipeline": {"_model.field.mlp_base.params": torch.zeros(4)}, "optimizers": {}, "scalers": {}},
        foreign,
    )
    assert_clear_error(ns_train(tmp_path, "--load-checkpoint", str(foreign)), "not written by a Gaussian-splatting")


def test_truncated_checkpoint(tmp_path):
    broken = tmp_path / "step-000000010.ckpt"
    broken.write_bytes(b"PK\x03\x04 truncated")
    assert_clear_error(ns_train(tmp_path, "--load-checkpoint", str(broken)), "Cannot read checkpoint")


def test_multi_process_launch_on_cpu_points_to_torchrun(tmp_path):
    assert_clear_error(ns_train(tmp_path, "--machine.num-devices", "2"), "torchrun")
