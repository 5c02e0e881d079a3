"""Host work only a sharded run pays, per step (issue 26): collectives counted on 2 gloo ranks.

Between the steps nerfstudio logs, a record-exchange step runs the exchange's own collectives only:
the all_gathers of the step's layout and view counts and of sparse-grad's gradient sizes, and the
point-to-point messages. The batch-loss
and communication-statistics all_reduces run on logged steps only, and the shard-size gather of the
rebalance only on the densification's refine steps (the only ones that change a shard's size).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
import torch
from gsplat.strategy import DefaultStrategy

from bytesplat_ns.distributed.launch import launch_local
from bytesplat_ns.strategy import SyncFreeDefaultStrategy

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
ITERS = 7
STEPS_PER_LOG = 3  # logged: 0, 3, 6 (6 also gathers the final checkpoint)
REFINE_EVERY = 2  # with 2 training views gsplat pauses for 2 + 2 steps after the step-0 reset: refines at 4, 6


def test_refines_at_is_gsplats_rule():
    seen = []
    strategy = SyncFreeDefaultStrategy.like(DefaultStrategy(refine_start_iter=3, refine_stop_iter=40, refine_every=4,
                                                            reset_every=20, pause_refine_after_reset=6))
    strategy._grow_gs = lambda params, optimizers, state, step: (seen.append(step), (0, 0))[1]
    strategy._prune_gs = lambda params, optimizers, state, step: 0
    params = {"means": torch.nn.Parameter(torch.zeros(3, 3)), "opacities": torch.nn.Parameter(torch.zeros(3))}
    optimizers = {k: torch.optim.Adam([p]) for k, p in params.items()}
    state = strategy.initialize_state()
    info = {"means2d": torch.zeros(1, 3, 2, requires_grad=True), "radii": torch.ones(1, 3, dtype=torch.int32),
            "width": 8, "height": 8, "n_cameras": 1, "gaussian_ids": None}
    info["means2d"].grad = torch.zeros(1, 3, 2)
    for step in range(48):
        strategy.step_post_backward(params, optimizers, state, step, info)
    assert seen == [s for s in range(48) if strategy.refines_at(s)] == [8, 12, 16, 28, 32, 36]


def test_quiet_steps_run_only_the_exchanges_collectives(tmp_path):
    out = tmp_path / "counts"
    out.mkdir()
    args = [
        sys.executable, "-m", "tests.helpers.collective_counts", str(out), "bytesplat",
        "--output-dir", str(tmp_path / "out"), "--experiment-name", "c", "--timestamp", "run",
        "--vis", "tensorboard", "--max-num-iterations", str(ITERS), "--steps-per-save", "1000",
        "--logging.steps-per-log", str(STEPS_PER_LOG),
        "--steps-per-eval-image", "100000", "--steps-per-eval-all-images", "100000", "--steps-per-eval-batch", "0",
        "--machine.device-type", "cpu", "--pipeline.model.rasterizer", "reference",
        "--pipeline.model.background-color", "black", "--pipeline.views-per-step", "2",
        "--pipeline.communicator", "sparse-grad",
        "--pipeline.model.warmup-length", "0", "--pipeline.model.refine-every", str(REFINE_EVERY),
        "--pipeline.model.reset-alpha-every", "1000",
        "bytesplat-scene", "--num-views", "2", "--width", "48",
    ]
    env = dict(os.environ, BYTESPLAT_CACHE=str(tmp_path / "cache"), WANDB_MODE="disabled", OMP_NUM_THREADS="1",
               PYTHONUNBUFFERED="1", MPLBACKEND="Agg",
               PYTHONPATH=os.pathsep.join(p for p in [str(REPO), os.environ.get("PYTHONPATH", "")] if p))
    results = launch_local(args, 2, timeout_s=240, env=env, cwd=tmp_path)
    detail = "\n".join(f"--- rank {r.rank} exit {r.returncode}\n{r.stdout[-2000:]}\n{r.stderr[-4000:]}" for r in results)
    assert all(r.returncode == 0 for r in results), detail
    for rank in range(2):
        counts = {int(s): c for s, c in json.loads((out / f"counts-rank{rank}.json").read_text()).items()}
        assert sorted(counts) == list(range(ITERS)), counts
        # sparse-grad's own all_gathers: the step's layout and view counts, the gradient sizes
        own = 2
        for step in (1, 2, 5):  # neither logged nor a refine step
            assert counts[step].get("all_reduce", 0) == 0, (rank, step, counts[step])
            assert counts[step]["all_gather"] == own, (rank, step, counts[step])
            assert counts[step]["batch_isend_irecv"] >= 2, (rank, step, counts[step])  # records forward, gradients back
        assert counts[3]["all_reduce"] == 2 and counts[3]["all_gather"] == own, counts[3]  # logged: loss + statistics
        assert counts[4].get("all_reduce", 0) == 0 and counts[4]["all_gather"] == own + 1, counts[4]  # refine: shard sizes
