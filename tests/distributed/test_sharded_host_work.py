"""Host work only a sharded run pays, per step (issue 26): counted on 2 gloo ranks for every exchange.

``tests.helpers.collective_counts`` runs ``python -m bytesplat_ns.train`` on 2 ranks and counts, per
training iteration, the collectives, the host reads of tensor values made by ``bytesplat_ns/distributed``
code, and the pixel exchange's device syncs. Between the steps nerfstudio logs, a step runs only what
its math needs (docs/distributed.md, "Host work per step", says why each entry stays): the exchange's
own collectives and the reads of the sizes they carry. The batch-loss and communication-statistics
all_reduces, their reads and the pixel exchange's timing syncs run on logged steps only; the record
exchange's shard-size gather only on the densification's refine steps. On logged steps the values
written are those of a run that logs every step.
"""

from __future__ import annotations

import json
import os
import sys
from collections import Counter
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
QUIET = (1, 2, 5)  # neither logged nor a refine step

# Every step of every exchange: the batch's views (an epoch's permutation, drawn every step with 2
# views and a batch of 2) and the cameras' size (host tensors: no device wait).
BATCH = {"read pipeline.py:_sample_views": 1, "read pipeline.py:_camera_views": 2}
# dense / sparse-grad: one all_gather of shard sizes and records per view (the messages' sizes), read
# once; the forward records and the gradients (point to point); on the CPU only, the renderer
# checks the records' global-id order (skipped on the GPU).
RECORDS = {**BATCH, "all_gather": 1, "read exchange.py:all_gather_rows": 1, "batch_isend_irecv": 2,
           "read sharding.py:gather_layout_and_view_counts": 1, "read step.py:_out_of_gid_order": 1}
QUIET_WORK = {
    "dense": RECORDS,
    # + the sparse gradients' sizes: an all_gather, read once
    "sparse-grad": {**RECORDS, "all_gather": 2, "read exchange.py:all_gather_rows": 2, "read exchange.py:exchange": 1},
    # one kd cell per rank, 2 views x 2 cells: the cells' bounds (an all_reduce) and the schedule and
    # crops computed from them on the host, each view's cell order, the rectangles received, the
    # render leaking out of its predicted rectangle; the partials' sizes (an all_gather); after the
    # step, the cells' sizes with the densification statistics every rank has (one all_gather), the
    # migration's optimizer-state agreement (an all_reduce) and its message sizes (an all_gather)
    "pixel": {**BATCH, "all_gather": 3, "read exchange.py:all_gather_rows": 3, "read exchange.py:exchange": 2,
              "all_reduce": 2, "read pixel.py:pixel_render_loss": 18, "read pixel.py:project_box_rect": 22,
              "read pixel.py:<listcomp>": 2, "read pixel.py:forward": 2, "read pixel.py:_count_outside": 4,
              "read batch_exchange.py:_sizes_and_strategy_rows": 1, "read cells.py:migrate": 2},
}
# On logged steps: the batch loss and the communication statistics summed (two all_reduces, one read
# of the statistics); the pixel exchange times its render and its 3 exchanges (7 device syncs).
LOGGED_WORK = {"all_reduce": 2, "read pipeline.py:_log_communication": 2}
PIXEL_TIMING = {"device sync": 7}
# The record exchange's refine steps: the shard sizes gathered for the rebalance.
REFINE_WORK = {"all_gather": 1, "read exchange.py:all_gather_rows": 1, "read sharding.py:gather_layout": 1}
TIMING_KEYS = ("throughput/", "idle_seconds", "Train Iter", "ETA", "Train Rays", "Train Total")


def added(*works):
    total = Counter()
    for work in works:
        total.update(work)
    return dict(total)


def without_messages(counts):
    """``counts`` without the point-to-point batches (how many depends on what moves: checked apart)."""
    return {k: v for k, v in counts.items() if k != "batch_isend_irecv"}


@pytest.fixture(scope="module")
def train_runs(tmp_path_factory):
    """(communicator, steps per log, extra arguments) -> (counts, logged) per rank, each run once."""
    done = {}

    def run(communicator, steps_per_log=STEPS_PER_LOG, *extra):
        key = (communicator, steps_per_log, extra)
        if key not in done:
            tmp = tmp_path_factory.mktemp(f"{communicator}-{steps_per_log}")
            done[key] = _train(tmp, communicator, steps_per_log, list(extra))
        return done[key]

    return run


def _train(tmp: Path, communicator: str, steps_per_log: int, extra):
    out = tmp / "counts"
    out.mkdir()
    args = [
        sys.executable, "-m", "tests.helpers.collective_counts", str(out), "bytesplat",
        "--output-dir", str(tmp / "out"), "--experiment-name", "c", "--timestamp", "run",
        "--vis", "tensorboard", "--max-num-iterations", str(ITERS), "--steps-per-save", "1000",
        "--logging.steps-per-log", str(steps_per_log),
        "--steps-per-eval-image", "100000", "--steps-per-eval-all-images", "100000", "--steps-per-eval-batch", "0",
        "--machine.device-type", "cpu", "--pipeline.model.rasterizer", "reference",
        "--pipeline.model.background-color", "black", "--pipeline.views-per-step", "2",
        "--pipeline.communicator", communicator, *extra,
        "--pipeline.model.warmup-length", "0", "--pipeline.model.refine-every", str(REFINE_EVERY),
        "--pipeline.model.reset-alpha-every", "1000",
        "bytesplat-scene", "--num-views", "2", "--width", "48",
    ]
    env = dict(os.environ, BYTESPLAT_CACHE=str(tmp / "cache"), WANDB_MODE="disabled", OMP_NUM_THREADS="1",
               PYTHONUNBUFFERED="1", MPLBACKEND="Agg",
               PYTHONPATH=os.pathsep.join(p for p in [str(REPO), os.environ.get("PYTHONPATH", "")] if p))
    results = launch_local(args, 2, timeout_s=300, env=env, cwd=tmp)
    detail = "\n".join(f"--- rank {r.rank} exit {r.returncode}\n{r.stdout[-2000:]}\n{r.stderr[-4000:]}" for r in results)
    assert all(r.returncode == 0 for r in results), detail
    runs = []
    for rank in range(2):
        counts = {int(s): c for s, c in json.loads((out / f"counts-rank{rank}.json").read_text()).items()}
        logged = {int(s): v for s, v in json.loads((out / f"logged-rank{rank}.json").read_text()).items()}
        assert sorted(counts) == list(range(ITERS)), counts
        runs.append((counts, logged))
    return runs


def exchange_logged(logged) -> str:
    """The exchange a run used (``auto`` resolves at start): the name in its communication/* keys."""
    names = {k.split("/")[1] for k in logged[0] if k.startswith("communication/")}
    assert len(names) == 1, logged[0]
    return names.pop()


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


@pytest.mark.parametrize("communicator", ["dense", "sparse-grad", "pixel", "auto"])
def test_quiet_steps_do_only_the_steps_own_work(train_runs, communicator):
    extra = ("--pipeline.link-bandwidth-gbps", "0.01") if communicator == "auto" else ()
    for rank, (counts, logged) in enumerate(train_runs(communicator, STEPS_PER_LOG, *extra)):
        used = exchange_logged(logged)
        assert used == communicator or (communicator == "auto" and used in ("sparse-grad", "pixel")), used
        quiet = QUIET_WORK[used]
        for step in QUIET:
            assert without_messages(counts[step]) == without_messages(quiet), (rank, step, counts[step])
            assert counts[step]["batch_isend_irecv"] >= 2, (rank, step, counts[step])  # forward, then backward
        logged_step = added(quiet, LOGGED_WORK, PIXEL_TIMING if used == "pixel" else {})
        assert without_messages(counts[3]) == without_messages(logged_step), (rank, counts[3])
        refine = REFINE_WORK if used != "pixel" else {}  # the cells' sizes are gathered every step anyway
        assert without_messages(counts[4]) == without_messages(added(quiet, refine)), (rank, counts[4])


@pytest.mark.parametrize("communicator", ["sparse-grad", "pixel"])
def test_logged_steps_log_what_a_run_logging_every_step_logs(train_runs, communicator):
    sparse, every = train_runs(communicator, STEPS_PER_LOG), train_runs(communicator, 1)
    for rank in range(2):
        for step in (0, 3, 6):
            got, want = ({k: v for k, v in run[rank][1][step].items() if not any(t in k for t in TIMING_KEYS)}
                         for run in (sparse, every))
            for key in (f"communication/{communicator}/forward_bytes", "Train Loss", "Train Metrics Dict/gaussian_count"):
                assert key in got, (rank, step, got)
            assert got == want, (rank, step)
