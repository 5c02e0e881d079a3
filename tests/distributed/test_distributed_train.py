"""nerfstudio integration of sharded training on CPU: ``python -m bytesplat_ns.train`` under a
torchrun-style launcher with gloo.

One chain of short runs on a tiny built-in scene (black background, so runs are deterministic):
A: 2 ranks, 3 steps of 2 views; B: 1 process, the same 3 steps -> same Gaussians;
C: resume A with 1 process, D: resume B with 4 ranks, 2 more steps each -> the same Gaussians again
(resharding of parameters and Adam state on load). Checks the checkpoint holds every rank's
Gaussians, bytes per step reach nerfstudio's writer, and the checkpoint loads in one process.
A also runs the viewer and an evaluation at step 2: rank 0's full copy equals the concatenated
shards, the viewer renders it, and its renders/eval metrics equal B's (one process). E runs A's
training through ns-train's own multi-process worker (``--machine.num-devices 2``) and must
give A's checkpoint; on CPU ns-train's launcher is refused with a clear message.
"""

from __future__ import annotations

import glob
import os
import sys
from pathlib import Path

import pytest
import torch

from bytesplat_ns.distributed.launch import free_port, launch_local

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
NAMES = ("means", "scales", "quats", "features_dc", "features_rest", "opacities")


def train(tmp: Path, name: str, nprocs: int, iterations: int, extra=(), runner: str = "module"):
    """One run. runner: ``module`` = ``python -m bytesplat_ns.train`` (torchrun's entry), ``dump`` = the
    same, then every rank dumps its shard and rank 0 its full copy (tests.distributed_worker),
    ``nerfstudio`` = ``ns-train bytesplat-distributed --machine.num-devices N`` through nerfstudio's own
    worker and train_loop."""
    dump = tmp / f"dump-{name}"
    dump.mkdir(parents=True, exist_ok=True)
    method = "bytesplat"
    if runner == "module":
        head = [sys.executable, "-m", "bytesplat_ns.train"]
    elif runner == "dump":
        head = [sys.executable, "-m", "tests.helpers.distributed_worker", "train-and-dump", str(dump)]
    else:
        head = [sys.executable, "-m", "tests.helpers.distributed_worker", "nerfstudio-launcher", str(dump)]
        method = "bytesplat-distributed"
        extra = [*extra, "--machine.num-devices", str(nprocs)]
    args = [
        *head, method,
        "--output-dir", str(tmp / "out"), "--experiment-name", name, "--timestamp", "run",
        "--vis", "tensorboard", "--max-num-iterations", str(iterations), "--steps-per-save", "1000",
        "--steps-per-eval-image", "100000", "--steps-per-eval-all-images", "100000", "--steps-per-eval-batch", "0",
        "--machine.device-type", "cpu", "--pipeline.model.rasterizer", "reference",
        "--pipeline.model.background-color", "black", "--pipeline.views-per-step", "2",
        *extra,
        "bytesplat-scene", "--num-views", "8", "--width", "48",
    ]
    env = dict(os.environ, BYTESPLAT_CACHE=str(tmp / "cache"), WANDB_MODE="disabled", OMP_NUM_THREADS="1",
               PYTHONUNBUFFERED="1", MPLBACKEND="Agg", PYTHONPATH=os.pathsep.join(p for p in [str(REPO), os.environ.get("PYTHONPATH", "")] if p))
    results = launch_local(args, nprocs, timeout_s=240, env=env, cwd=tmp)
    detail = "\n".join(f"--- rank {r.rank} exit {r.returncode}\n{r.stdout[-2000:]}\n{r.stderr[-4000:]}" for r in results)
    assert all(r.returncode == 0 for r in results), detail
    run_dir = tmp / "out" / name / method / "run"
    ckpts = sorted((run_dir / "nerfstudio_models").glob("step-*.ckpt"))
    assert ckpts, detail
    return run_dir, torch.load(ckpts[-1], map_location="cpu", weights_only=False)


def gaussians(state):
    return {n: state["pipeline"][f"_model.gauss_params.{n}"] for n in NAMES}


def assert_close(a, b, tol=1e-5, per_name=None):
    for n in a:
        assert a[n].shape == b[n].shape, n
        rel = ((a[n] - b[n]).norm() / b[n].norm().clamp_min(1e-12)).item()  # features_rest stays 0 at SH degree 0
        assert rel <= (per_name or {}).get(n, tol), f"{n}: relative error {rel:.3g}"


# Two resumed runs start from checkpoints that differ by float noise (written by 1 and by 4 ranks).
# Adam's eps of 1e-15 turns noise in a near-zero gradient into a whole +-lr step: a quaternion whose
# gradient is ~0 moves by up to lr in a direction the noise decides. How many are in that state depends
# on the run's random draws: 4e-8 with one stream, 2e-5 with another (measured when the offline LPIPS
# check stopped drawing a backbone's initial weights from it); a real mismatch is orders larger.
RESUMED_QUATS_TOL = 1e-4


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("dist-train")
    # A also runs the viewer on rank 0 (full copy refreshed every step) and evaluates one image at
    # step 2 from the full copy; B (one process) evaluates the same image.
    viewer = ["--vis", "viewer+tensorboard", "--viewer.websocket-port", str(free_port()),
              "--viewer.quit-on-train-completion", "True", "--pipeline.full-copy-steps", "1"]
    # A logs every step (the communication statistics are summed on logged steps only).
    a_dir, a = train(tmp, "a", 2, 3, ["--pipeline.communicator", "sparse-grad", "--steps-per-eval-image", "2",
                                      "--logging.steps-per-log", "1", *viewer], runner="dump")
    b_dir, b = train(tmp, "b", 1, 3, ["--steps-per-eval-image", "2"], runner="dump")
    return tmp, a_dir, a, b_dir, b


def test_two_ranks_train_like_one_process_and_checkpoint_every_gaussian(runs):
    tmp, a_dir, a, b_dir, b = runs
    assert a["step"] == b["step"] == 2
    ga, gb = gaussians(a), gaussians(b)
    assert ga["means"].shape[0] == 4000  # every rank's shard is in rank 0's checkpoint
    assert_close(ga, gb)
    # Adam state was gathered too, and the learning rate is scaled by sqrt(2 views).
    for n in NAMES:
        st = a["optimizers"][n]["state"][0]
        assert st["exp_avg"].shape == ga[n].shape
        assert torch.allclose(st["exp_avg"], b["optimizers"][n]["state"][0]["exp_avg"], rtol=1e-4, atol=1e-9)
    assert a["optimizers"]["opacities"]["param_groups"][0]["lr"] == pytest.approx(0.05 * 2**0.5)


def test_bytes_per_step_are_logged_to_the_writer(runs):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    _, a_dir, _, _, _ = runs
    events = EventAccumulator(glob.glob(str(a_dir / "events.out.tfevents.*"))[0])
    events.Reload()
    tags = events.Tags()["scalars"]
    for key in ("forward_bytes", "backward_bytes", "forward_records", "backward_records"):
        assert f"communication/sparse-grad/{key}" in tags
    fwd = [e.value for e in events.Scalars("communication/sparse-grad/forward_bytes")]
    bwd = [e.value for e in events.Scalars("communication/sparse-grad/backward_bytes")]
    recs = [e.value for e in events.Scalars("communication/sparse-grad/forward_records")]
    assert len(fwd) == 3 and all(v > 0 for v in fwd)
    # Forward bytes: 48 bytes per record (float32, RGB) plus a 4-byte per-view header per message.
    assert all(f >= 48 * r for f, r in zip(fwd, recs))
    assert all(0 < v for v in bwd)
    # Step time and views/s of the sharded step (views per step / step seconds).
    vps = [e.value for e in events.Scalars("throughput/views_per_second")]
    secs = [e.value for e in events.Scalars("throughput/step_seconds")]
    assert len(vps) == 3 and all(v > 0 for v in vps)
    assert all(abs(v * s - 2) < 1e-3 for v, s in zip(vps, secs))


def test_resume_with_other_rank_counts_gives_the_same_training(runs):
    tmp, a_dir, a, b_dir, b = runs
    _, c = train(tmp, "c", 1, 2, ["--load-dir", str(a_dir / "nerfstudio_models")])
    _, d = train(tmp, "d", 4, 2, ["--load-dir", str(b_dir / "nerfstudio_models")])
    assert c["step"] == d["step"] == 4
    assert gaussians(c)["means"].shape[0] == gaussians(d)["means"].shape[0] == 4000
    assert_close(gaussians(c), gaussians(d), per_name={"quats": RESUMED_QUATS_TOL})
    # ... and training moved on after the resume.
    assert (gaussians(c)["means"] - gaussians(a)["means"]).abs().max() > 0


def test_checkpoint_loads_in_one_process(runs):
    from nerfstudio.utils.eval_utils import eval_setup

    _, a_dir, a, _, _ = runs
    config, pipeline, _, step = eval_setup(a_dir / "config.yml", test_mode="test")
    assert step == 2
    assert pipeline.model.gauss_params["means"].shape[0] == 4000
    assert torch.equal(pipeline.model.gauss_params["means"].detach().cpu(), gaussians(a)["means"])
    camera = pipeline.datamanager.eval_dataset.cameras[0:1].to(pipeline.device)
    outputs = pipeline.model.get_outputs_for_camera(camera)
    assert outputs["rgb"].shape[-1] == 3 and torch.isfinite(outputs["rgb"]).all()


def _scalars(run_dir: Path, tag: str):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(glob.glob(str(run_dir / "events.out.tfevents.*"))[0])
    events.Reload()
    return {e.step: e.value for e in events.Scalars(tag)}


def test_rank0_full_copy_is_the_concatenated_shards_and_renders_like_one_process(runs):
    tmp, a_dir, a, b_dir, b = runs
    full = torch.load(tmp / "dump-a" / "full-copy.pt", weights_only=False)
    shards = [torch.load(tmp / "dump-a" / f"shard-rank{r}.pt", weights_only=False) for r in range(2)]
    assert full["step"] == 2
    assert shards[0]["means"].shape[0] + shards[1]["means"].shape[0] == 4000
    for n in NAMES:
        assert torch.equal(full["params"][n], torch.cat([shards[0][n], shards[1][n]])), n
    assert full["viewer_renders_copy"] is True
    assert full["copy_in_state_dict"] is False
    one = torch.load(tmp / "dump-b" / "full-copy.pt", weights_only=False)
    assert one["render"].shape == full["render"].shape
    assert (one["render"] - full["render"]).abs().max().item() <= 1e-4
    # The evaluation during training (step 2) rendered the full copy on rank 0: B's metrics.
    psnr_a = _scalars(a_dir, "Eval Images Metrics/psnr")
    psnr_b = _scalars(b_dir, "Eval Images Metrics/psnr")
    assert set(psnr_a) == set(psnr_b) == {2}
    assert abs(psnr_a[2] - psnr_b[2]) <= 1e-3, (psnr_a, psnr_b)


def test_ns_train_num_devices_runs_our_sharded_pipeline(runs):
    """nerfstudio's launcher path (its _distributed_worker + train_loop, gloo) trains like torchrun."""
    tmp, a_dir, a, _, _ = runs
    e_dir, e = train(tmp, "e", 2, 3, ["--pipeline.communicator", "sparse-grad"], runner="nerfstudio")
    assert not any(".module." in k for k in e["pipeline"])  # no DDP wrap
    assert gaussians(e)["means"].shape[0] == 4000  # rank 0 wrote every rank's Gaussians
    assert e["optimizers"]["means"]["state"][0]["exp_avg"].shape[0] == 4000  # ShardedTrainer's gathered Adam state
    assert_close(gaussians(e), gaussians(a))


# Densification within the run: warm-up 2, refine every 3 (paused until step 11 after the step-0
# "reset": 8 views + 3), so step 12 refines. Splits are off (size thresholds out of reach), since they
# draw random samples from per-process generators; duplication and opacity pruning are deterministic.
REFINE_STEP = 12
DENSIFY = ["--pipeline.model.warmup-length", "2", "--pipeline.model.refine-every", "3",
           "--pipeline.model.reset-alpha-every", "1000", "--pipeline.model.densify-grad-thresh", "1e-4",
           "--pipeline.model.densify-size-thresh", "1e9", "--pipeline.model.split-screen-size", "1e9",
           "--pipeline.model.stop-screen-size-at", "0"]


def by_position(g):
    """Rows reordered by (x, y, z) of their means: shards concatenate in rank order and each owner
    appends its duplicates to its own shard, so equal sets of Gaussians come in different orders."""
    import numpy as np

    order = torch.as_tensor(np.lexsort(g["means"].numpy().T[::-1].copy()))
    return {n: v[order] for n, v in g.items()}


def test_adam_on_visible_gaussians_only_on_two_ranks_trains_like_one_process(runs):
    """--pipeline.model.optimize-visible-only with sharded Gaussians: each rank updates its Gaussians that
    any view of the batch shows, so two ranks end where one process does, and away from Adam on all rows."""
    tmp = runs[0]
    visible_only = ["--pipeline.model.optimize-visible-only", "True"]
    _, a = train(tmp, "visible-a", 2, 3, ["--pipeline.communicator", "sparse-grad", *visible_only])
    _, b = train(tmp, "visible-b", 1, 3, visible_only)
    ga, gb = gaussians(a), gaussians(b)
    assert_close(ga, gb)
    # the switch took effect: against the same 3 steps with Adam on every row, some Gaussians end
    # elsewhere (moved by their moments while hidden there), while the never-shown ones match
    all_rows = gaussians(runs[4])
    differs = (ga["means"] != all_rows["means"]).any(1)
    assert 0 < int(differs.sum()) < ga["means"].shape[0]
    assert (ga["means"] - all_rows["means"]).abs().max().item() > 1e-6


def test_densification_on_two_ranks_gives_one_process_gaussians(tmp_path):
    """Issue 5, item 3: each owner duplicates and prunes its shard from statistics gathered over every
    rank's views; after a refine step the two ranks together hold the one process's Gaussians."""
    _, a = train(tmp_path, "dens-a", 2, REFINE_STEP + 1, ["--pipeline.communicator", "sparse-grad", *DENSIFY])
    _, b = train(tmp_path, "dens-b", 1, REFINE_STEP + 1, DENSIFY)
    ga, gb = by_position(gaussians(a)), by_position(gaussians(b))
    n = gb["means"].shape[0]
    assert a["step"] == b["step"] == REFINE_STEP
    twins = int((gb["means"][1:] == gb["means"][:-1]).all(1).sum())
    assert twins > 100 and n < 4000 + twins  # both duplicated and pruned Gaussians
    assert ga["means"].shape[0] == n
    # Quaternions: 13 Adam steps turn float-order noise in near-zero gradients into steps of the
    # learning rate (1e-3) for a few Gaussians; everything else to the steps-equality tolerance.
    assert_close({k: v for k, v in ga.items() if k != "quats"}, {k: v for k, v in gb.items() if k != "quats"})
    assert ((ga["quats"] - gb["quats"]).norm() / gb["quats"].norm()).item() <= 1e-3


def test_ns_train_num_devices_on_cpu_points_to_torchrun(tmp_path, monkeypatch):
    """ns-train's main() with --machine.num-devices 2 on CPU stops before spawning, naming torchrun
    (nerfstudio's worker would otherwise fail an `assert torch.cuda.is_available()` in every process)."""
    import tyro
    from nerfstudio.configs.method_configs import AnnotatedBaseConfigUnion
    from nerfstudio.scripts import train as ns_train

    from bytesplat_ns.errors import BytesplatError

    def no_spawn(*args, **kwargs):
        raise AssertionError("nerfstudio's launcher was reached")

    monkeypatch.setattr(ns_train.mp, "spawn", no_spawn)
    config = tyro.cli(AnnotatedBaseConfigUnion, args=[
        "bytesplat-distributed", "--machine.num-devices", "2", "--machine.device-type", "cpu",
        "--output-dir", str(tmp_path / "out"), "--vis", "tensorboard", "bytesplat-scene"])
    with pytest.raises(BytesplatError, match="torchrun --nproc-per-node N -m bytesplat_ns.train"):
        ns_train.main(config)
    assert not (tmp_path / "out").exists()  # stopped before writing anything


def test_ranks_of_nerfstudios_launcher_share_the_cores(monkeypatch):
    """torchrun gives its workers OMP_NUM_THREADS=1; nerfstudio's launcher gives nothing, so each
    sharded rank takes its share of the cores instead of one thread per core."""
    from bytesplat_ns.distributed.runtime import cpu_threads_per_rank

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert cpu_threads_per_rank(2, cpu_count=32) == 16
    assert cpu_threads_per_rank(3, cpu_count=32) == 10
    assert cpu_threads_per_rank(4, cpu_count=2) == 1
    assert cpu_threads_per_rank(1, cpu_count=32) is None  # one process keeps torch's default
    monkeypatch.setenv("OMP_NUM_THREADS", "4")
    assert cpu_threads_per_rank(2, cpu_count=32) is None  # the user's setting wins
