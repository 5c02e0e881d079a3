"""Checkpoints survive any kill, cleanup deletes only what it superseded, divergence stops loudly,
and every nerfstudio tool gives one clear line for a bad checkpoint (docs/faults.md)."""

from __future__ import annotations

import functools
import os
import random
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch

from bytesplat_ns.checkpoints import (
    CHECKPOINT_NAME,
    PARTIAL_DIR_NAME,
    CheckpointWriter,
    read_checkpoint,
    refuse_existing_run,
)
from bytesplat_ns.divergence import DivergenceError, DivergenceGuard
from bytesplat_ns.errors import BytesplatError
from tests.helpers.checkpoint_runs import (
    assert_one_clear_error,
    copy_run_with,
    run_dir,
    train,
    train_args,
    viewer_outcome,
)
from tests.helpers.cli import cli_env, describe, run_cli, tool
from tests.helpers.concurrent_jobs import run_jobs, selected_params

# ---- in-process: writer, cleanup, refusal, divergence guard ---------------------------------------


def test_writer_keeps_temporary_files_out_of_the_checkpoint_folder_and_removes_only_what_it_superseded(tmp_path):
    models = tmp_path / "run" / "nerfstudio_models"
    models.mkdir(parents=True)
    earlier_newer = models / "step-000000100.ckpt"  # an earlier run's, newer than anything written here
    earlier_older = models / "step-000000005.ckpt"
    for path in (earlier_newer, earlier_older):
        torch.save({"step": 0, "pipeline": {}}, path)
    writer = CheckpointWriter(models, keep_only_latest=True, background=True)
    for step in (1, 2, 3):
        writer.save({"step": step, "pipeline": {"x": torch.full((3,), float(step))}}, step)
    writer.finish()
    names = sorted(os.listdir(models))
    assert names == ["step-000000003.ckpt", "step-000000005.ckpt", "step-000000100.ckpt"]
    assert all(CHECKPOINT_NAME.match(name) for name in names)
    assert os.listdir(tmp_path / "run" / PARTIAL_DIR_NAME) == []  # renamed away, nothing left behind
    assert torch.load(models / "step-000000003.ckpt")["pipeline"]["x"].tolist() == [3.0, 3.0, 3.0]


def test_background_write_holds_the_state_of_the_save_step_and_reports_a_failure(tmp_path):
    models = tmp_path / "run" / "nerfstudio_models"
    writer = CheckpointWriter(models, keep_only_latest=False, background=True)
    live = torch.zeros(1000)
    writer.save({"step": 7, "pipeline": {"x": live}}, 7)
    live += 1.0  # training goes on while the file is written
    writer.finish()
    assert float(torch.load(models / "step-000000007.ckpt")["pipeline"]["x"].sum()) == 0.0

    blocked = tmp_path / "blocked"
    blocked.write_text("a file where the run directory should be")
    failing = CheckpointWriter(blocked / "nerfstudio_models", keep_only_latest=False, background=True)
    failing.save({"step": 1, "pipeline": {}}, 1)
    with pytest.raises(BytesplatError, match="Writing a checkpoint to .* failed"):
        failing.finish()
    failing.finish()  # reported once


@pytest.mark.gpu
def test_background_write_of_gpu_tensors_holds_the_save_step_while_the_gpu_goes_on(tmp_path):
    """The host copy of CUDA tensors is started without a wait; kernels queued after the save (in-place
    updates, a freed and reused tensor) do not reach the file."""
    models = tmp_path / "run" / "nerfstudio_models"
    writer = CheckpointWriter(models, keep_only_latest=False, background=True)
    big = torch.randn(4096, 4096, device="cuda")
    live = torch.arange(3_000_000, dtype=torch.float32, device="cuda")
    strided = live.view(1000, 3000)[:, ::3]  # a non-contiguous view
    expected = {"live": live.cpu(), "strided": strided.cpu(), "step": torch.tensor(5)}
    for _ in range(3):
        big = big @ big  # keep the GPU busy, so that the copies are still queued when save returns
    writer.save({"step": 5, "pipeline": {"live": live, "strided": strided}, "optimizers": {"step": torch.tensor(5)}}, 5)
    live.mul_(-1.0)
    strided.add_(7.0)
    del live, strided
    reused = torch.zeros(3_000_000, device="cuda")  # may take the freed block
    reused.add_(1.0)
    writer.finish()
    written = torch.load(models / "step-000000005.ckpt")
    assert torch.equal(written["pipeline"]["live"], expected["live"])
    assert torch.equal(written["pipeline"]["strided"], expected["strided"])
    assert torch.equal(written["optimizers"]["step"], expected["step"])


def test_a_new_run_into_a_directory_with_checkpoints_is_refused_unless_it_resumes_there(tmp_path):
    models = tmp_path / "nerfstudio_models"
    refuse_existing_run(models, None, None)  # nothing there yet
    models.mkdir()
    torch.save({"step": 4, "pipeline": {}}, models / "step-000000004.ckpt")
    with pytest.raises(BytesplatError, match="already holds checkpoints .*step 4") as error:
        refuse_existing_run(models, None, None)
    assert f"--load-dir {models}" in str(error.value)
    refuse_existing_run(models, models, None)
    refuse_existing_run(models, None, models / "step-000000004.ckpt")
    with pytest.raises(BytesplatError):
        refuse_existing_run(models, tmp_path / "elsewhere", None)


def test_divergence_guard_names_the_step_and_the_group_and_reads_the_flag_only_when_checked():
    guard = DivergenceGuard(interval=5)
    params = {"means": [torch.zeros(3)], "opacities": [torch.zeros(3)]}
    guard.observe(1, torch.tensor(1.0))
    guard.observe(2, torch.tensor(float("nan")))  # no error yet: nothing read
    guard.observe(3, torch.tensor(1.0))
    assert [guard.due(s) for s in (3, 4, 5)] == [False, False, True]
    with pytest.raises(DivergenceError, match="loss became NaN/inf between steps 1 and 5"):
        guard.check(5, params)
    guard.observe(6, torch.tensor(1.0))
    guard.check(6, params)  # the flag was reset by the check
    params["opacities"][0][1] = float("inf")
    with pytest.raises(DivergenceError, match="parameter group 'opacities' holds NaN/inf values at step 7"):
        guard.check(7, params)


def test_divergence_guard_sees_opposite_infinities_in_one_window():
    """The guard sums the window's losses on the device: +inf and -inf make NaN, still caught."""
    guard = DivergenceGuard(interval=3)
    for step, value in ((1, float("inf")), (2, -float("inf")), (3, 0.5)):
        guard.observe(step, torch.tensor(value))
    with pytest.raises(DivergenceError, match="between steps 1 and 3"):
        guard.check(3, {"means": [torch.zeros(2)]})
    guard.observe(4, torch.tensor(1e30))  # large but finite: no error
    guard.check(4, {"means": [torch.zeros(2)]})


# ---- through the CLIs ------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A finished tiny run: (workdir, its run directory)."""
    tmp = tmp_path_factory.mktemp("ckpt")
    result = train(tmp, tmp / "out", 4, "--steps-per-save", "2")
    assert result.returncode == 0, describe(result)
    return tmp, run_dir(tmp / "out")


def _good_bytes(run: Path) -> bytes:
    checkpoints = sorted((run / "nerfstudio_models").iterdir())
    return checkpoints[-1].read_bytes()


def _nan_checkpoint(run: Path) -> bytes:
    import io

    state = torch.load(sorted((run / "nerfstudio_models").iterdir())[-1])
    state["pipeline"]["_model.gauss_params.means"][0, 0] = float("nan")
    buffer = io.BytesIO()
    torch.save(state, buffer)
    return buffer.getvalue()


BAD_CASES = {
    "empty": (lambda run: [("step-000000003.ckpt", b"")], "is empty (0 bytes)"),
    "truncated": (lambda run: [("step-000000003.ckpt", _good_bytes(run)[:3000])], "truncated, corrupt or not a checkpoint"),
    "random": (lambda run: [("step-000000003.ckpt", random.Random(0).randbytes(4000))], "truncated, corrupt or not a checkpoint"),
    "no-checkpoint": (lambda run: [], "No checkpoint (step-XXXXXXXXX.ckpt)"),
    "stray-file": (lambda run: [("notes.txt", b"x")], "No checkpoint (step-XXXXXXXXX.ckpt)"),
    "non-finite": (lambda run: [("step-000000003.ckpt", _nan_checkpoint(run))], "non-finite (NaN/inf) values in _model.gauss_params.means"),
}


@pytest.fixture(scope="module")
def bad_checkpoint_runs(trained, request):
    """The tools on bad copies of the run, for every selected case of the two tests below, all side by side
    (each process spends most of its time importing): ns-eval and ns-export on ``bad-<case>``, ns-viewer on
    ``viewer-<case>``. (tool, case) -> the finished process (ns-viewer: viewer_outcome's result)."""
    tmp, good = trained
    env = cli_env(tmp / "cache")
    jobs = {}
    for case in selected_params(request, "case", test="test_ns_eval_and_ns_export_give_one_clear_line_for_a_bad_checkpoint"):
        files, _ = BAD_CASES[case]
        bad = copy_run_with(good, f"bad-{case}", files(good))
        eval_args = ["ns-eval", "--load-config", str(bad / "config.yml"), "--output-path", str(bad / "m.json")]
        export_args = ["ns-export", "gaussian-splat", "--load-config", str(bad / "config.yml"),
                       "--output-dir", str(bad / "export")]
        jobs["ns-eval", case] = functools.partial(run_cli, eval_args, env, 300)
        jobs["ns-export", case] = functools.partial(run_cli, export_args, env, 300)
    for case in selected_params(request, "case", test="test_ns_viewer_gives_one_clear_line_for_a_bad_checkpoint"):
        files, _ = BAD_CASES[case]
        bad = copy_run_with(good, f"viewer-{case}", files(good))
        jobs["ns-viewer", case] = functools.partial(viewer_outcome, tmp, bad / "config.yml")
    return run_jobs(jobs)


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(BAD_CASES))
def test_ns_eval_and_ns_export_give_one_clear_line_for_a_bad_checkpoint(bad_checkpoint_runs, case):
    _, fragment = BAD_CASES[case]
    assert_one_clear_error(bad_checkpoint_runs["ns-eval", case], fragment)
    assert_one_clear_error(bad_checkpoint_runs["ns-export", case], fragment)


@pytest.mark.slow
@pytest.mark.parametrize("case", ["truncated", "no-checkpoint"])
def test_ns_viewer_gives_one_clear_line_for_a_bad_checkpoint(bad_checkpoint_runs, case):
    _, fragment = BAD_CASES[case]
    outcome, returncode, log = bad_checkpoint_runs["ns-viewer", case]
    assert outcome == "exited" and returncode != 0, log[-3000:]
    assert log.count("bytesplat: error:") == 1 and "Traceback" not in log, log[-3000:]
    assert fragment in log


@pytest.mark.slow
def test_bench_loader_gives_one_clear_error_for_every_bad_checkpoint(trained):
    from bytesplat_ns.bench.trained import load_run

    tmp, good = trained
    for case, (files, fragment) in sorted(BAD_CASES.items()):
        bad = copy_run_with(good, f"bench-{case}", files(good))
        with pytest.raises(BytesplatError) as error:
            load_run(bad)
        assert fragment in str(error.value), case
    # the CLI's own first check (before it asks for a GPU): an empty checkpoint folder
    result = run_cli(["bytesplat-bench", "raster", "--trained", str(good.parent / "bench-no-checkpoint")], cli_env(tmp / "cache"), 300)
    assert_one_clear_error(result, "No checkpoint")


@pytest.mark.slow
def test_a_second_run_into_the_same_run_directory_is_refused_and_changes_nothing(trained):
    tmp, good = trained
    before = {p.name: p.stat().st_mtime_ns for p in good.rglob("*") if p.is_file()}
    result = train(tmp, tmp / "out", 2)
    assert_one_clear_error(result, "already holds checkpoints", "--load-dir")
    assert {p.name: p.stat().st_mtime_ns for p in good.rglob("*") if p.is_file()} == before


@pytest.mark.slow
def test_flags_on_resume_take_effect_and_divergence_keeps_the_last_finite_checkpoint(tmp_path):
    out = tmp_path / "out"
    first = train(tmp_path, out, 4, "--steps-per-save", "2")
    assert first.returncode == 0, describe(first)
    models = run_dir(out) / "nerfstudio_models"
    assert read_checkpoint(models / "step-000000003.ckpt")["optimizers"]["opacities"]["param_groups"][0]["lr"] == 0.05

    resumed = train(tmp_path, out, 2, "--load-dir", str(models), "--optimizers.opacities.optimizer.lr", "0.0123")
    assert resumed.returncode == 0, describe(resumed)
    state = read_checkpoint(models / "step-000000005.ckpt")
    assert state["optimizers"]["opacities"]["param_groups"][0]["lr"] == pytest.approx(0.0123)

    # Absurd learning rates (given on resume, so they take effect): the periodic check stops the run
    # within --steps-per-finite-check steps, naming the step and the group, and no NaN checkpoint is written.
    huge = [f"--optimizers.{group}.optimizer.lr" for group in ("means", "scales", "opacities", "features-dc")]
    diverged = train(
        tmp_path, out, 40, "--load-dir", str(models), "--steps-per-finite-check", "4",
        "--save-only-latest-checkpoint", "True", *[x for flag in huge for x in (flag, "1e12")],
    )
    message = assert_one_clear_error(diverged, "Training diverged", "parameter group")
    stopped_at = max(int(n) for n in re.findall(r"steps? (\d+)", message.split("hint:")[0]))
    assert stopped_at % 4 == 0 and stopped_at <= 16, message
    assert sorted(p.name for p in models.iterdir()) == ["step-000000003.ckpt", "step-000000005.ckpt"]
    for path in models.iterdir():
        read_checkpoint(path)  # both are finite (raises otherwise)


@pytest.mark.slow
def test_fused_rasterizer_on_cpu_fails_before_loading_data(tmp_path):
    started = time.monotonic()
    result = train(tmp_path, tmp_path / "out", 2, "--pipeline.model.rasterizer", "fused", "--data", str(tmp_path / "none"))
    assert_one_clear_error(result, "needs a CUDA device", "--pipeline.model.rasterizer reference")
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").rglob("config.yml"))
    assert time.monotonic() - started < 120


# ---- SIGKILL at random points of saves -------------------------------------------------------------


def _kill_during_a_save(cmd, env, run: Path, rng: random.Random, timeout: float = 180.0) -> bool:
    """Start ``cmd``; once it has written a checkpoint, SIGKILL it as soon as (after a random short
    delay) a save is in progress, or at a random moment. Returns whether the kill hit a write."""
    partial_dir = run / PARTIAL_DIR_NAME
    models = run / "nerfstudio_models"
    proc = subprocess.Popen([tool(cmd[0]), *cmd[1:]], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + timeout
        seen = set(os.listdir(models)) if models.is_dir() else set()
        while time.monotonic() < deadline and proc.poll() is None:  # wait for this process's first new checkpoint
            if models.is_dir() and set(os.listdir(models)) - seen:
                break
            time.sleep(0.05)
        assert proc.poll() is None, "training ended before it was killed"
        give_up = time.monotonic() + 20.0
        while time.monotonic() < give_up:
            if partial_dir.is_dir() and os.listdir(partial_dir):
                time.sleep(rng.uniform(0.0, 0.004))  # somewhere inside the write
                break
            time.sleep(0.0005)
        hit = partial_dir.is_dir() and bool(os.listdir(partial_dir))
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        return hit
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@pytest.mark.slow
def test_sigkill_during_saves_leaves_a_run_every_tool_loads(tmp_path):
    rng = random.Random(24)
    env = cli_env(tmp_path / "cache")
    out = tmp_path / "out"
    run = run_dir(out)
    models = run / "nerfstudio_models"
    many_saves = ["--steps-per-save", "1", "--save-only-latest-checkpoint", "True"]
    hits = 0
    for attempt in range(3):
        resume = ["--load-dir", str(models)] if models.is_dir() else []
        hits += _kill_during_a_save(train_args(out, 400, *many_saves, *resume), env, run, rng)
        names = os.listdir(models)
        assert names and all(CHECKPOINT_NAME.match(n) for n in names), names  # nothing nerfstudio would misparse
        latest = max(names)
        read_checkpoint(models / latest)  # complete and finite
    assert hits >= 1, "no kill landed inside a checkpoint write"

    # The three tools only read the run: they load it side by side.
    tools = run_jobs({
        "ns-eval": functools.partial(run_cli, ["ns-eval", "--load-config", str(run / "config.yml"),
                                               "--output-path", str(tmp_path / "m.json")], env, 300),
        "ns-export": functools.partial(run_cli, ["ns-export", "gaussian-splat", "--load-config", str(run / "config.yml"),
                                                 "--output-dir", str(tmp_path / "export")], env, 300),
        "ns-viewer": functools.partial(viewer_outcome, tmp_path, run / "config.yml"),
    }, workers=3)
    evaluated = tools["ns-eval"]
    assert evaluated.returncode == 0 and (tmp_path / "m.json").is_file(), describe(evaluated)
    exported = tools["ns-export"]
    assert exported.returncode == 0 and (tmp_path / "export" / "splat.ply").is_file(), describe(exported)
    outcome, _, log = tools["ns-viewer"]
    assert outcome == "served", log[-3000:]
    before = int(CHECKPOINT_NAME.match(max(os.listdir(models))).group(1))
    resumed = run_cli(train_args(out, 2, "--load-dir", str(models)), env, 300)
    assert resumed.returncode == 0, describe(resumed)
    assert int(CHECKPOINT_NAME.match(max(os.listdir(models))).group(1)) == before + 2
