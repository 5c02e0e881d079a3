"""Camera sanity checks on any dataparser's outputs, the point-cloud hint as a runnable command, and
one error line under torchrun (docs/faults.md)."""

from __future__ import annotations

import functools
import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from nerfstudio.cameras.cameras import Cameras
from PIL import Image

from bytesplat_ns.data.sanity import check_cameras
from bytesplat_ns.errors import BytesplatError
from tests.helpers.checkpoint_runs import assert_one_clear_error
from tests.helpers.cli import cli_env, describe, run_cli
from tests.helpers.concurrent_jobs import run_jobs, selected_tests


def cameras(n=4, fx=50.0, cx=32.0, positions=None) -> Cameras:
    c2w = torch.eye(4)[:3].repeat(n, 1, 1)
    c2w[:, :, 3] = torch.tensor(positions if positions is not None else [[i * 0.5, 0.0, 3.0] for i in range(n)])
    return Cameras(camera_to_worlds=c2w, fx=fx, fy=50.0, cx=cx, cy=24.0, width=64, height=48)


NAMES = [f"{i}.png" for i in range(4)]


def test_implausible_intrinsics_name_the_frame():
    check_cameras(cameras(), NAMES)  # plausible: no error
    for fx in (1e12, 1e-9):
        with pytest.raises(BytesplatError, match=r"Implausible focal length fx=.*\(frame 0 \(0.png\)"):
            check_cameras(cameras(fx=fx), NAMES)
    with pytest.raises(BytesplatError, match=r"Principal point cx=500 px is far outside the 64x48 image"):
        check_cameras(cameras(cx=500.0), NAMES)


def test_pose_checks():
    nan = cameras()
    nan.camera_to_worlds[2, 0, 3] = float("nan")
    with pytest.raises(BytesplatError, match=r"pose of frame 2 \(2.png\) .* non-finite"):
        check_cameras(nan, NAMES)
    with pytest.raises(BytesplatError, match="All 4 cameras .* at one point"):
        check_cameras(cameras(positions=[[1.0, 2.0, 3.0]] * 4), NAMES)
    with pytest.warns(UserWarning, match=r"frame 3 \(3.png\) has the same camera pose as frame 1 \(1.png\)"):
        check_cameras(cameras(positions=[[0, 0, 3], [1, 0, 3], [2, 0, 3], [1, 0, 3]]), NAMES)


def write_scene(root: Path, fl: float = 60.0, same_position: bool = False, ply: bool = False) -> Path:
    (root / "images").mkdir(parents=True)
    rng = np.random.default_rng(0)
    frames = []
    for i in range(4):
        Image.fromarray(rng.integers(0, 255, (36, 48, 3), dtype=np.uint8)).save(root / "images" / f"{i}.png")
        pose = torch.eye(4)
        pose[0, 3], pose[2, 3] = (0.0 if same_position else 0.4 * i), 3.0
        frames.append({"file_path": f"images/{i}.png", "transform_matrix": pose.tolist()})
    meta = {"fl_x": fl, "fl_y": fl, "cx": 24, "cy": 18, "w": 48, "h": 36, "frames": frames}
    if ply:
        meta["ply_file_path"] = "points.ply"
        (root / "points.ply").write_bytes(b"ply\nformat garbage\n")
    (root / "transforms.json").write_text(json.dumps(meta))
    return root


def ns_train(tmp: Path, *args: str):
    return run_cli(
        ["ns-train", "bytesplat", "--output-dir", str(tmp / "out"), "--vis", "tensorboard",
         "--machine.device-type", "cpu", "--max-num-iterations", "2", "--pipeline.model.num-downscales", "0", *args],
        cli_env(tmp / "cache"), timeout=300,
    )


# The CLI runs below are separate processes that spend most of their time importing: the module runs those of
# the selected tests side by side, in one fixture ((test, run) -> the finished run), and each test checks its own.
@pytest.fixture(scope="module")
def cli_runs(workdir, request):
    wanted = selected_tests(request)
    jobs = {}

    def folder(test: str) -> Path:
        path = workdir / test
        path.mkdir()
        return path

    test = "test_nerfstudio_data_dataparser_is_checked_too"
    if test in wanted:
        tmp = folder(test)
        focal, point = write_scene(tmp / "focal", fl=1e12), write_scene(tmp / "point", same_position=True)
        jobs[test, "focal"] = functools.partial(ns_train, tmp / "focal-run", "--data", str(focal), "nerfstudio-data")
        jobs[test, "point"] = functools.partial(ns_train, tmp / "point-run", "--data", str(point), "nerfstudio-data")
    test = "test_a_frame_without_a_pose_is_named"
    if test in wanted:
        tmp = folder(test)
        scene = write_scene(tmp / "nopose")
        meta = json.loads((scene / "transforms.json").read_text())
        del meta["frames"][2]["transform_matrix"]
        (scene / "transforms.json").write_text(json.dumps(meta))
        jobs[test, "nopose"] = functools.partial(ns_train, tmp, "--data", str(scene), "nerfstudio-data")
    test = "test_point_cloud_hint_is_a_command_that_runs"
    if test in wanted:
        tmp = folder(test)
        scene = write_scene(tmp / "scene", ply=True)

        def hint_then_run(tmp=tmp, scene=scene):  # the second run follows the first one's hint
            first = ns_train(tmp, "--data", str(scene))
            message = assert_one_clear_error(first, "points.ply")
            hinted = message.split("end the ns-train command with '", 1)[1].split("'", 1)[0]
            return hinted, ns_train(tmp, "--data", str(scene), *hinted.split())

        jobs[test, "hint"] = hint_then_run
    test = "test_torchrun_prints_a_user_error_once"
    if test in wanted:
        from bytesplat_ns.distributed.launch import launch_local

        tmp = folder(test)
        cmd = [sys.executable, "-m", "bytesplat_ns.train", "bytesplat", "--machine.device-type", "cpu",
               "--output-dir", str(tmp / "out"), "--vis", "tensorboard", "--load-dir", str(tmp / "nowhere")]
        jobs[test, "missing"] = functools.partial(launch_local, cmd, 2, timeout_s=240, env=cli_env(tmp / "cache"))
        jobs[test, "bad-flag"] = functools.partial(launch_local, [*cmd[:4], "--no-such-flag", "1"], 2, timeout_s=240,
                                                   env=cli_env(tmp / "bad-flag-cache"))
    return run_jobs(jobs)


@pytest.mark.slow
def test_nerfstudio_data_dataparser_is_checked_too(cli_runs):
    test = "test_nerfstudio_data_dataparser_is_checked_too"
    assert_one_clear_error(cli_runs[test, "focal"], "Implausible focal length", "0.png")
    assert_one_clear_error(cli_runs[test, "point"], "all at one point")


@pytest.mark.slow
def test_a_frame_without_a_pose_is_named(cli_runs):
    assert_one_clear_error(cli_runs["test_a_frame_without_a_pose_is_named", "nopose"], "no transform_matrix",
                           "images/2.png")


@pytest.mark.slow
def test_point_cloud_hint_is_a_command_that_runs(cli_runs):
    hinted, result = cli_runs["test_point_cloud_hint_is_a_command_that_runs", "hint"]
    assert hinted == "bytesplat-scene --load-3D-points False"
    assert result.returncode == 0, describe(result)


@pytest.mark.slow
def test_torchrun_prints_a_user_error_once(cli_runs):
    results = cli_runs["test_torchrun_prints_a_user_error_once", "missing"]
    assert all(r.returncode not in (0, None) for r in results), [(r.returncode, r.stderr[-2000:]) for r in results]
    text = "".join(r.stderr + r.stdout for r in results)
    assert text.count("bytesplat: error:") == 1 and "Traceback" not in text, text[-4000:]
    assert "nowhere" in text.split("bytesplat: error:", 1)[1]
    assert "bytesplat: error:" in results[0].stderr
    # tyro's own message, once as well
    bad_flag = cli_runs["test_torchrun_prints_a_user_error_once", "bad-flag"]
    assert all(r.returncode not in (0, None) for r in bad_flag)
    assert sum("no-such-flag" in r.stderr + r.stdout for r in bad_flag) == 1, [r.stderr[-1500:] for r in bad_flag]
