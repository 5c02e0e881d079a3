"""Bad input through the real CLIs: one clear message, a non-zero exit, no traceback, in bounded time."""

from __future__ import annotations

import functools
import json
from pathlib import Path

import pytest
import torch

from tests.helpers.cli import cli_env, run_cli
from tests.helpers.concurrent_jobs import run_jobs, selected_tests

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


# Each test's ns-train run (inputs written by the function below, in the test's own folder) is a separate process
# that spends most of its time importing: the module runs the selected tests' runs side by side, in one fixture,
# and each test checks its own.
INPUTS = {}


def inputs_of(test):
    def register(write_inputs):
        INPUTS[test] = write_inputs
        return write_inputs
    return register


@pytest.fixture(scope="module")
def ns_train_runs(workdir, request):
    jobs = {}
    for test in selected_tests(request):
        tmp = workdir / test
        tmp.mkdir()
        jobs[test] = functools.partial(ns_train, tmp, *INPUTS[test](tmp))
    return run_jobs(jobs)


@pytest.fixture
def ns_train_run(ns_train_runs, request):
    """This test's finished ns-train process."""
    return ns_train_runs[request.node.originalname]


@inputs_of("test_missing_data_path")
def _(tmp: Path):
    return ["--data", str(tmp / "nowhere")]


def test_missing_data_path(ns_train_run, workdir):
    assert_clear_error(ns_train_run, "does not exist", "nowhere")
    assert not (workdir / "test_missing_data_path" / "out").exists()  # no run directory left behind


@inputs_of("test_missing_data_path_with_nerfstudios_dataparser")
def _(tmp: Path):
    return ["--data", str(tmp / "nowhere"), "nerfstudio-data"]


def test_missing_data_path_with_nerfstudios_dataparser(ns_train_run, workdir):
    assert_clear_error(ns_train_run, "does not exist", "nowhere")
    assert not (workdir / "test_missing_data_path_with_nerfstudios_dataparser" / "out").exists()


@inputs_of("test_colmap_dataparser_without_a_model")
def _(tmp: Path):
    (tmp / "scene" / "images").mkdir(parents=True)
    return ["--data", str(tmp / "scene"), "colmap"]


def test_colmap_dataparser_without_a_model(ns_train_run, workdir):
    """nerfstudio's colmap parser would stop at an assert (a traceback) after the run directory exists."""
    assert_clear_error(ns_train_run, "No COLMAP model", "colmap/sparse/0")
    assert not (workdir / "test_colmap_dataparser_without_a_model" / "out").exists()


@inputs_of("test_transforms_without_frames")
def _(tmp: Path):
    scene = tmp / "scene"
    scene.mkdir()
    (scene / "transforms.json").write_text(json.dumps({"fl_x": 100, "fl_y": 100, "cx": 32, "cy": 32, "w": 64, "h": 64}))
    return ["--data", str(scene)]


def test_transforms_without_frames(ns_train_run):
    assert_clear_error(ns_train_run, "frames")


@inputs_of("test_corrupt_image")
def _(tmp: Path):
    scene = tmp / "scene"
    (scene / "images").mkdir(parents=True)
    frame = {"file_path": "images/0.png", "transform_matrix": torch.eye(4).tolist()}
    meta = {"fl_x": 100, "fl_y": 100, "cx": 32, "cy": 32, "w": 64, "h": 64, "frames": [frame] * 1}
    (scene / "transforms.json").write_text(json.dumps(meta))
    (scene / "images" / "0.png").write_bytes(b"\x89PNG\r\n\x1a\n not really a png")
    return ["--data", str(scene)]


def test_corrupt_image(ns_train_run):
    assert_clear_error(ns_train_run, "0.png")


@inputs_of("test_checkpoint_from_another_method")
def _(tmp: Path):
    foreign = tmp / "nerfacto.ckpt"
    torch.save(
        {"step": 10, "pipeline": {"_model.field.mlp_base.params": torch.zeros(4)}, "optimizers": {}, "scalers": {}},
        foreign,
    )
    return ["--load-checkpoint", str(foreign)]


def test_checkpoint_from_another_method(ns_train_run):
    assert_clear_error(ns_train_run, "not written by a Gaussian-splatting")


@inputs_of("test_missing_load_dir")
def _(tmp: Path):
    return ["--load-dir", str(tmp / "nowhere")]


def test_missing_load_dir(ns_train_run, workdir):
    """Checked before the run directory is written and the data loaded."""
    assert_clear_error(ns_train_run, "Checkpoint directory", "nowhere", "does not exist")
    assert not (workdir / "test_missing_load_dir" / "out").exists()


@inputs_of("test_missing_load_checkpoint")
def _(tmp: Path):
    return ["--load-checkpoint", str(tmp / "step-000000010.ckpt")]


def test_missing_load_checkpoint(ns_train_run, workdir):
    assert_clear_error(ns_train_run, "step-000000010.ckpt does not exist")
    assert not (workdir / "test_missing_load_checkpoint" / "out").exists()


@inputs_of("test_truncated_checkpoint")
def _(tmp: Path):
    broken = tmp / "step-000000010.ckpt"
    broken.write_bytes(b"PK\x03\x04 truncated")
    return ["--load-checkpoint", str(broken)]


def test_truncated_checkpoint(ns_train_run):
    assert_clear_error(ns_train_run, "Cannot read checkpoint")


@inputs_of("test_multi_process_launch_on_cpu_points_to_torchrun")
def _(tmp: Path):
    return ["--machine.num-devices", "2"]


def test_multi_process_launch_on_cpu_points_to_torchrun(ns_train_run):
    assert_clear_error(ns_train_run, "torchrun")
