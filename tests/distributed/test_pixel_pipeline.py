"""``--pipeline.communicator {pixel,auto}`` through nerfstudio's trainer (``python -m bytesplat_ns.train``,
2 gloo ranks on CPU, the launcher of tests/distributed/test_distributed_train.py).

P: 2 ranks, ``pixel``, 16 steps of 2 views on the tiny built-in scene at full resolution, with
densification early (warm-up 4, refine every 4, a low gradient threshold) so Gaussians are pruned,
split and duplicated on their owner and the kd cells are rebuilt and Gaussians migrate with their
Adam state and statistics. Checked: the run trains (PSNR of the final checkpoint over the training
views better than after the second step), every Gaussian is in rank 0's checkpoint (with Adam rows),
it loads and renders in one process, bytes per step reach nerfstudio's writer, and the checkpoint
resumes on 1 process (re-partitioned). A: ``auto`` logs its choice and the reason.

Exactness of the composite (scenes without border-crossing Gaussians) is covered by
tests/distributed/test_pixel_exchange.py; here the scene's Gaussians do cross the cells' borders.
Every launch is bounded by ``launch_local``'s wall clock (55 s).
"""

from __future__ import annotations

import math

import pytest
import torch

from tests.helpers.pixel_train_runs import DENSIFY, NAMES, checkpoints, gaussians, load, scalars, train

pytestmark = pytest.mark.slow



ITERS = 16


@pytest.fixture(scope="module")
def pixel_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("pixel-train")
    run_dir, _ = train(tmp, "p", 2, ITERS, ["--pipeline.communicator", "pixel", "--steps-per-save", "1",
                                             "--save-only-latest-checkpoint", "False", *DENSIFY])
    return tmp, run_dir


def test_pixel_trains_and_checkpoints_every_gaussian(pixel_run):
    from nerfstudio.utils.eval_utils import eval_setup

    tmp, run_dir = pixel_run
    ckpts = checkpoints(run_dir)
    final = load(ckpts[ITERS - 1])
    g = gaussians(final)
    counts = scalars(run_dir, "Train Metrics Dict/gaussian_count")
    shard = scalars(run_dir, "Train Metrics Dict/shard_gaussians")
    # Densification changed the count (prune and split/duplicate, per rank on the owner) ...
    assert len(set(counts.values())) > 1, counts
    # ... and the checkpoint holds every Gaussian of the last step, with its Adam rows.
    n = g["means"].shape[0]
    assert n == counts[ITERS - 1], (n, counts)
    assert 0 < shard[ITERS - 1] < n  # rank 0 owned a part only
    for name in NAMES:
        assert final["optimizers"][name]["state"][0]["exp_avg"].shape == g[name].shape
        assert torch.isfinite(g[name]).all()
    # Loads in one process and renders; and the training improved the fit of the training views.
    config, pipeline, _, step = eval_setup(run_dir / "config.yml", test_mode="test")
    assert step == ITERS - 1
    model = pipeline.model
    assert model.gauss_params["means"].shape[0] == n
    assert torch.equal(model.gauss_params["means"].detach().cpu(), g["means"])
    dataset = pipeline.datamanager.train_dataset

    def psnr(params) -> float:
        for name in NAMES:
            model.gauss_params[name] = torch.nn.Parameter(params[name].clone().to(pipeline.device))
        model.eval()
        values = []
        with torch.no_grad():
            for i in range(len(dataset)):
                out = model.get_outputs_for_camera(dataset.cameras[i : i + 1].to(pipeline.device))
                gt = model.composite_with_background(model.get_gt_img(dataset[i]["image"].to(pipeline.device)), torch.zeros(3))
                assert out["rgb"].shape == gt.shape and torch.isfinite(out["rgb"]).all()
                mse = ((out["rgb"] - gt) ** 2).mean().item()
                values.append(-10 * math.log10(max(mse, 1e-12)))
        return sum(values) / len(values)

    early, last = psnr(gaussians(load(ckpts[1]))), psnr(g)
    print(f"PSNR over the training views: after step 1 {early:.3f} dB, after step {ITERS - 1} {last:.3f} dB")
    assert last > early + 0.1, (early, last)


def test_pixel_bytes_and_idle_time_reach_the_writer(pixel_run):
    _, run_dir = pixel_run
    fwd = scalars(run_dir, "communication/pixel/forward_bytes")
    bwd = scalars(run_dir, "communication/pixel/backward_bytes")
    unpruned = scalars(run_dir, "communication/pixel/unpruned_bytes")
    migration = scalars(run_dir, "communication/pixel/migration_bytes")
    assert len(fwd) == len(bwd) == ITERS
    assert all(v > 0 for v in fwd.values()) and all(v > 0 for v in bwd.values())
    assert all(fwd[s] + bwd[s] <= unpruned[s] for s in fwd)  # pruning never sends more than full images
    assert max(migration.values()) > 0  # Gaussians migrated between cells
    for r in range(2):
        idle = scalars(run_dir, f"communication/pixel/idle_seconds_rank{r}")
        assert len(idle) == ITERS and all(v >= 0 for v in idle.values())
    vps = scalars(run_dir, "throughput/views_per_second")
    assert len(vps) == ITERS and all(v > 0 for v in vps.values())
    assert scalars(run_dir, "communication/sparse-grad/forward_bytes") is None


def test_pixel_checkpoint_resumes_on_another_rank_count(pixel_run):
    tmp, run_dir = pixel_run
    before = gaussians(load(checkpoints(run_dir)[ITERS - 1]))
    resumed_dir, _ = train(tmp, "p-resume", 1, 2, ["--pipeline.communicator", "pixel", "--steps-per-save", "1000",
                                                   "--load-dir", str(run_dir / "nerfstudio_models")])
    ckpts = checkpoints(resumed_dir)
    after = load(ckpts[max(ckpts)])
    assert after["step"] == ITERS + 1
    g = gaussians(after)
    assert g["means"].shape[0] == before["means"].shape[0]  # no densification in two steps after warm-up 500
    assert after["optimizers"]["means"]["state"][0]["exp_avg"].shape == g["means"].shape
    assert all(torch.isfinite(g[n]).all() for n in NAMES)
    assert scalars(resumed_dir, "communication/pixel/forward_bytes") is not None


def test_auto_logs_its_choice(tmp_path):
    run_dir, results = train(tmp_path, "a", 2, 1, ["--pipeline.communicator", "auto", "--steps-per-save", "1000"])
    line = [ln for ln in results[0].stdout.splitlines() if "auto communicator:" in ln]
    assert len(line) == 1, results[0].stdout[-3000:]
    assert not any("auto communicator:" in ln for ln in results[1].stdout.splitlines())  # rank 0 logs it
    chosen = line[0].split("auto communicator: ")[1].split(" ")[0]
    print(line[0])
    assert chosen in ("pixel", "sparse-grad")
    assert "MiB/step" in line[0] and "Gaussians visible per view" in line[0] and "cell pixels per view" in line[0]
    assert "modelled" in line[0] and "(probe)" in line[0]  # decided on time, over the link the ranks measured
    # The run used the chosen communicator (its bytes are logged under its name).
    assert scalars(run_dir, f"communication/{chosen}/forward_bytes") is not None


def test_pixel_with_the_fused_compositor_on_cpu_is_a_clear_error(tmp_path):
    """The fused cell renderer needs CUDA: ``--pipeline.compositor fused`` on the CPU stops at start."""
    _, results = train(tmp_path, "f", 1, 1, ["--pipeline.communicator", "pixel", "--pipeline.compositor", "fused"],
                       expect_ok=False)
    err = results[0].stderr
    assert results[0].returncode not in (0, None), err[-3000:]
    assert "bytesplat: error:" in err and "--pipeline.compositor fused needs CUDA GPUs" in err, err[-3000:]
    assert "--pipeline.compositor reference" in err, err[-3000:]  # the hint
    assert "Traceback" not in err, err[-3000:]
