"""bytesplat-export on trained runs (CPU, reference rasterizer): every format from one run's config.yml, the
``data`` frame against the capture's own points and cameras, a run trained on two ranks, user errors."""

from __future__ import annotations

import functools
import json
import os
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.helpers.cli import cli_env, describe, run_cli
from tests.helpers.concurrent_jobs import run_jobs, selected_tests
from tests.helpers.tiny_runs import train_tiny

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
# The console script runs bytesplat_ns.export.cli:entrypoint; run the module, which works before a reinstall too.
EXPORT = [sys.executable, "-m", "bytesplat_ns.export.cli"]
FORMATS = {"ply": "s.ply", "compressed-ply": "s.compressed.ply", "spz": "s.spz", "splat": "s.splat", "sog": "s.sog"}


def export(config: Path, out: Path, *extra: str, expect_ok: bool = True):
    result = run_cli([*EXPORT, "--load-config", str(config), "--output", str(out), *extra],
                     cli_env(config.parent / "export-cache"), timeout=300)
    if expect_ok:
        assert result.returncode == 0, describe(result)
        assert out.is_file() and not out.with_name(out.name + ".partial").exists()
    return result


def checkpoint_params(config: Path) -> dict:
    (ckpt,) = sorted((config.parent / "nerfstudio_models").glob("step-*.ckpt"))[-1:]
    state = torch.load(ckpt, map_location="cpu", weights_only=False)["pipeline"]
    prefix = "_model.gauss_params."
    return {k[len(prefix):]: v.float().numpy() for k, v in state.items() if k.startswith(prefix)}


@pytest.fixture(scope="module")
def one_step_run(workdir) -> Path:
    """One training step: the Gaussians still sit (within one optimizer step) on the scene's point cloud."""
    return train_tiny(workdir, "one-step", 1)


@pytest.fixture(scope="module")
def exports(one_step_run, workdir, request):
    """Every export of ``one_step_run`` that the selected tests check, run side by side (each export is a
    process that spends most of its time starting up): (test, job) -> the finished process. ``export``
    asserts success (or not) inside the job; a failed job fails the test that reads it."""
    wanted = selected_tests(request)
    jobs = {}

    def add(test, job, out, *extra, config=one_step_run, expect_ok=True):
        if test in wanted:
            jobs[test, job] = functools.partial(export, config, out, *extra, expect_ok=expect_ok)

    for fmt, name in FORMATS.items():
        add("test_every_format_exports_the_checkpoints_gaussians", fmt, workdir / "formats" / name)
    add("test_data_frame_puts_the_gaussians_on_the_captures_own_points", "data", workdir / "data.ply", "--frame", "data")
    add("test_data_frame_log_scales_undo_the_dataparser_scale", "data-scales", workdir / "data-scales.ply",
        "--frame", "data", "--sh-degree", "1")
    add("test_y_up_frame_turns_nerfstudios_z_into_y", "y-up", workdir / "y-up.ply", "--frame", "y-up")
    errors_test = "test_user_errors_are_one_line_and_write_nothing"
    if errors_test in wanted:
        errors = workdir / "user-errors"
        elsewhere = errors / "copied" / "config.yml"  # a config without its run's dataparser_transforms.json
        elsewhere.parent.mkdir(parents=True)
        elsewhere.write_text(one_step_run.read_text())
        jobs[errors_test, "missing"] = functools.partial(
            run_cli, [*EXPORT, "--load-config", str(errors / "none.yml"), "--output", str(errors / "a.ply")],
            cli_env(errors / "cache"), timeout=120,
        )
        add(errors_test, "bad-suffix", errors / "a.xyz", expect_ok=False)
        add(errors_test, "too-high", errors / "a.ply", "--sh-degree", "4", expect_ok=False)
        add(errors_test, "no-transform", errors / "a.spz", "--frame", "data", config=elsewhere, expect_ok=False)
    return run_jobs(jobs)


def test_every_format_exports_the_checkpoints_gaussians(one_step_run, exports, workdir):
    from plyfile import PlyData
    import gsply

    params = checkpoint_params(one_step_run)
    n = len(params["means"])
    for fmt, name in FORMATS.items():
        out = workdir / "formats" / name
        result = exports["test_every_format_exports_the_checkpoints_gaussians", fmt]
        assert f"-> {out} ({fmt}, nerfstudio frame)" in result.stdout, describe(result)
    vertex = PlyData.read(str(workdir / "formats" / "s.ply"))["vertex"].data
    assert len(vertex) == n
    np.testing.assert_array_equal(np.stack([vertex[a] for a in "xyz"], 1), params["means"])
    np.testing.assert_array_equal(vertex["opacity"], params["opacities"].reshape(-1))
    rest = params["features_rest"]
    for k in range(rest.shape[1]):
        for c in range(3):
            np.testing.assert_array_equal(vertex[f"f_rest_{c * rest.shape[1] + k}"], rest[:, k, c])
    assert len(gsply.read_spz(str(workdir / "formats" / "s.spz"))) == n
    assert len(gsply.plyread(str(workdir / "formats" / "s.compressed.ply"))) == n
    assert (workdir / "formats" / "s.splat").stat().st_size == 32 * n


def test_data_frame_puts_the_gaussians_on_the_captures_own_points(one_step_run, exports, workdir):
    """The built-in scene's Gaussians start on its point cloud (sparse_pc.ply, in the capture's frame); after
    one step they are still within a hair of it, in the data frame, and project to the same pixels of the
    capture's cameras (transforms.json) as those points; the nerfstudio frame is far from them."""
    from plyfile import PlyData

    (data_dir,) = (one_step_run.parent.parent.parent.parent.parent / "cache" / "scenes").glob("small-*")
    points = PlyData.read(str(data_dir / "sparse_pc.ply"))["vertex"].data
    points = np.stack([points[a] for a in "xyz"], 1).astype(np.float64)
    out = workdir / "data.ply"
    exports["test_data_frame_puts_the_gaussians_on_the_captures_own_points", "data"]
    vertex = PlyData.read(str(out))["vertex"].data
    means = np.stack([vertex[a] for a in "xyz"], 1).astype(np.float64)
    assert means.shape == points.shape
    extent = np.ptp(points, axis=0).max()
    assert np.abs(means - points).max() < 0.01 * extent
    ns_means = checkpoint_params(one_step_run)["means"]
    assert np.abs(ns_means - points).max() > 0.1 * extent  # the training frame is another one

    meta = json.loads((data_dir / "transforms.json").read_text())
    K = np.array([[meta["fl_x"], 0, meta["cx"]], [0, meta["fl_y"], meta["cy"]], [0, 0, 1]])
    for frame in meta["frames"][:8]:
        c2w = np.asarray(frame["transform_matrix"], dtype=np.float64)
        w2c = np.linalg.inv(c2w)

        def pixels(p):
            cam = p @ w2c[:3, :3].T + w2c[:3, 3]
            cam = cam * np.array([1.0, -1.0, -1.0])  # OpenGL camera (looks down -z) -> OpenCV
            uv = cam @ K.T
            return uv[:, :2] / uv[:, 2:], cam[:, 2]

        (uv_export, z), (uv_points, _) = pixels(means), pixels(points)
        seen = (z > 0.1) & (uv_points >= 0).all(1) & (uv_points < [meta["w"], meta["h"]]).all(1)
        assert seen.mean() > 0.3
        assert np.abs(uv_export[seen] - uv_points[seen]).max() < 1.0  # pixels


def test_data_frame_log_scales_undo_the_dataparser_scale(one_step_run, exports, workdir):
    from plyfile import PlyData

    scale = json.loads((one_step_run.parent / "dataparser_transforms.json").read_text())["scale"]
    out = workdir / "data-scales.ply"
    exports["test_data_frame_log_scales_undo_the_dataparser_scale", "data-scales"]
    vertex = PlyData.read(str(out))["vertex"].data
    params = checkpoint_params(one_step_run)
    np.testing.assert_allclose(vertex["scale_0"], params["scales"][:, 0] - np.log(scale), atol=1e-5)
    assert len([n for n in vertex.dtype.names if n.startswith("f_rest_")]) == 9


def test_y_up_frame_turns_nerfstudios_z_into_y(one_step_run, exports, workdir):
    from plyfile import PlyData

    out = workdir / "y-up.ply"
    exports["test_y_up_frame_turns_nerfstudios_z_into_y", "y-up"]
    ply = PlyData.read(str(out))
    vertex, params = ply["vertex"].data, checkpoint_params(one_step_run)
    np.testing.assert_allclose(vertex["y"], params["means"][:, 2], atol=1e-6)
    np.testing.assert_allclose(vertex["z"], -params["means"][:, 1], atol=1e-6)
    assert "Vertical Axis: y" in ply.comments


def test_a_run_trained_on_two_ranks_exports_all_its_gaussians(workdir):
    from plyfile import PlyData

    from bytesplat_ns.distributed.launch import launch_local

    tmp = workdir / "two-ranks"
    tmp.mkdir()
    args = [
        sys.executable, "-m", "bytesplat_ns.train", "bytesplat",
        "--output-dir", str(tmp / "out"), "--experiment-name", "dist", "--timestamp", "run",
        "--vis", "tensorboard", "--max-num-iterations", "3", "--steps-per-save", "1000",
        "--steps-per-eval-image", "100000", "--steps-per-eval-all-images", "100000", "--steps-per-eval-batch", "0",
        "--machine.device-type", "cpu", "--pipeline.model.rasterizer", "reference",
        "--pipeline.views-per-step", "2", "bytesplat-scene", "--num-views", "8", "--width", "48",
    ]
    env = dict(os.environ, BYTESPLAT_CACHE=str(tmp / "cache"), WANDB_MODE="disabled", OMP_NUM_THREADS="1",
               PYTHONUNBUFFERED="1", PYTHONPATH=os.pathsep.join(p for p in [str(REPO), os.environ.get("PYTHONPATH", "")] if p))
    results = launch_local(args, 2, timeout_s=240, env=env, cwd=tmp)
    assert all(r.returncode == 0 for r in results), "\n".join(r.stderr[-3000:] for r in results)
    config = tmp / "out" / "dist" / "bytesplat" / "run" / "config.yml"
    params = checkpoint_params(config)
    out = tmp / "dist.ply"
    export(config, out)
    vertex = PlyData.read(str(out))["vertex"].data
    assert len(vertex) == len(params["means"])
    np.testing.assert_array_equal(np.stack([vertex[a] for a in "xyz"], 1), params["means"])


def test_the_console_script_is_declared():
    import tomllib

    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["bytesplat-export"] == "bytesplat_ns.export.cli:entrypoint"


def test_user_errors_are_one_line_and_write_nothing(exports, workdir):
    test = "test_user_errors_are_one_line_and_write_nothing"
    missing = exports[test, "missing"]
    assert missing.returncode != 0 and "bytesplat: error: no such file:" in missing.stderr, describe(missing)
    bad_suffix = exports[test, "bad-suffix"]
    assert bad_suffix.returncode != 0 and "bytesplat: error: cannot tell the format" in bad_suffix.stderr
    too_high = exports[test, "too-high"]
    assert too_high.returncode != 0 and "bytesplat: error: SH degree 4" in too_high.stderr, describe(too_high)
    no_transform = exports[test, "no-transform"]
    assert no_transform.returncode != 0 and "bytesplat: error: no dataparser_transforms.json in" in no_transform.stderr
    assert not list((workdir / "user-errors").glob("a.*"))
