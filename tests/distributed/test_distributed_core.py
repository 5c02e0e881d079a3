"""Sharded training core on CPU with gloo (2 and 4 processes), checked against one process.

The workers (tests/helpers/distributed_worker.py) are launched with torchrun's environment contract by
``bytesplat_ns.distributed.launch.launch_local``, which also enforces each test's wall-clock bound.
The single-process oracle renders through the public ``rasterize(backend="reference")``.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest
import torch

from bytesplat_ns.distributed import (
    CommStats,
    ShardLayout,
    SparseGradCommunicator,
    assign_views,
    dense_grad_record_bytes,
    forward_record_bytes,
    pack,
    scale_adam_for_batch,
    single_process_loss,
    sparse_grad_record_bytes,
    unpack,
)
from bytesplat_ns.distributed import communicators
from bytesplat_ns.distributed.launch import launch_local
from tests.helpers import distributed_worker as W

REPO = Path(__file__).resolve().parents[2]
REL_TOL = 1e-5


def run_workers(scenario: str, world: int, out: Path, timeout_s: float, extra_env=None):
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    env.update(extra_env or {})
    start = time.monotonic()
    results = launch_local([sys.executable, "-m", "tests.helpers.distributed_worker", scenario, str(out)], world, timeout_s, env=env, cwd=REPO)
    return results, time.monotonic() - start


def describe(results) -> str:
    return "\n".join(f"--- rank {r.rank}: exit {r.returncode} after {r.seconds:.1f}s\n{r.stdout[-1500:]}\n{r.stderr[-3000:]}" for r in results)


@pytest.fixture(scope="module")
def oracle():
    torch.set_num_threads(1)
    params, losses, states = W.single_process_run()
    return {"params": params, "losses": losses, "exp_avg": states}


@pytest.fixture(scope="module")
def core_runs(tmp_path_factory):
    """Each world size's 'core' scenario runs once (all checks read its outputs)."""
    cache = {}

    def get(world: int) -> Path:
        if world not in cache:
            out = tmp_path_factory.mktemp(f"core{world}")
            results, _ = run_workers("core", world, out, timeout_s=90)
            assert all(r.returncode == 0 for r in results), describe(results)
            cache[world] = out
        return cache[world]

    return get


def load(out: Path, name: str, world: int):
    return [torch.load(out / f"{name}-rank{r}.pt", weights_only=False) for r in range(world)]


def assert_params_close(got, want, tol=REL_TOL):
    assert set(got) == set(want)
    for k in want:
        assert got[k].shape == want[k].shape, k
        rel = ((got[k] - want[k]).norm() / want[k].norm()).item()
        assert rel <= tol, f"{k}: relative error {rel:.3g} > {tol}"


def initial_visibility():
    """Independent of the sharded path: which (view, Gaussian) pairs survive culling, and which have a
    non-zero 2D gradient in the first step (single process, public reference rasterizer)."""
    views = W.make_views()
    params = W.to_params(W.make_gaussians(W.N_GAUSSIANS, W.SEED))
    loss, info = single_process_loss(params, views, W.SH_DEGREE)
    info["means2d"].retain_grad()
    info["conics"].retain_grad()
    loss.backward()
    visible = info["radii"] > 0
    nonzero = (info["means2d"].grad != 0).any(-1) | (info["conics"].grad != 0).any(-1)
    return visible, nonzero


# ---------------------------------------------------------------------------------------------
# In-process unit checks (no processes)


def test_pack_unpack_roundtrip_and_layouts():
    a = torch.randn(5, 3, dtype=torch.float64)
    b = torch.arange(7, dtype=torch.int32)
    c = torch.randn(4)
    msg = pack([a, b, c])
    assert msg.dtype == torch.uint8 and msg.numel() == 5 * 3 * 8 + 7 * 4 + 4 * 4
    a2, b2, c2 = unpack(msg, [(torch.float64, (5, 3)), (torch.int32, (7,)), (torch.float32, (4,))])
    assert torch.equal(a, a2) and torch.equal(b, b2) and torch.equal(c, c2)  # c starts misaligned for 8 bytes
    with pytest.raises(ValueError):
        unpack(msg, [(torch.float64, (5, 3))])

    assert ShardLayout.even(10, 4).counts == (3, 3, 2, 2)
    assert not ShardLayout((53, 47)).needs_rebalance(0.1)
    assert ShardLayout((70, 30)).needs_rebalance(0.1)
    assert ShardLayout((3, 3, 2, 2)).owner_of(torch.tensor([0, 2, 3, 5, 6, 9])).tolist() == [0, 0, 1, 1, 2, 3]
    assert assign_views(5, 2) == [[0, 1, 2], [3, 4]]
    assert assign_views(2, 4) == [[0], [1], [], []]
    lr, betas = scale_adam_for_batch(0.01, (0.9, 0.999), 4)
    assert lr == pytest.approx(0.02) and betas == pytest.approx((0.9**4, 0.999**4))
    assert scale_adam_for_batch(0.01, (0.9, 0.999), 1) == (0.01, (0.9, 0.999))
    assert forward_record_bytes(3) == 48 and dense_grad_record_bytes(3) == 36 and sparse_grad_record_bytes(3) == 40


def test_sparse_encode_decode_equals_dense_add():
    comm = SparseGradCommunicator()
    grad = torch.zeros(6, 9)
    grad[1, 3] = 2.0
    grad[4] = torch.arange(9.0)
    index, values = comm.encode(grad)
    assert index.tolist() == [1, 4] and index.dtype == torch.int32
    sent_index = torch.tensor([10, 3, 7, 0, 5, 8])
    sparse_buf = torch.ones(12, 9)
    dense_buf = torch.ones(12, 9)
    comm.decode(index, values, sent_index, sparse_buf)
    dense_buf.index_add_(0, sent_index, grad)
    assert torch.equal(sparse_buf, dense_buf)


def test_sparse_grad_sends_dense_rows_when_indices_cost_more(monkeypatch):
    """A message goes sparse only when k (G*4 + 4) < m G*4 bytes (G = 9: k < 0.9 m); otherwise the
    dense rows, which the owner recognises by their size. Both decode to what dense adds."""
    comm = SparseGradCommunicator()
    G = 9
    assert not SparseGradCommunicator.sends_dense(8, 10, G, torch.float32)  # 320 < 360 bytes
    assert SparseGradCommunicator.sends_dense(9, 10, G, torch.float32)  # 360 = 360: dense
    assert SparseGradCommunicator.sends_dense(0, 0, G, torch.float32) and not SparseGradCommunicator.sends_dense(0, 1, G, torch.float32)
    sent_index = torch.tensor([10, 3, 7, 0, 5, 8, 1, 2, 4, 6])
    for nonzero_rows in (range(8), range(9), range(10), range(0)):  # sparse, dense, dense, empty
        grad = torch.zeros(10, G)
        for i in nonzero_rows:
            grad[i, i % G] = i + 1.0
        buf, want = torch.ones(12, G), torch.ones(12, G)
        want.index_add_(0, sent_index, grad)
        stats = CommStats()
        comm.return_gradients([grad], [sent_index], buf, stats)  # one process: its message to itself
        assert torch.equal(buf, want)
        assert stats.backward_bytes == 0  # a rank's message to itself is not counted
    # 10 records sent, a message of 11 dense rows' size: neither form
    monkeypatch.setattr(communicators, "exchange", lambda msgs, *a, **k: [torch.zeros(11 * G * 4, dtype=torch.uint8)])
    with pytest.raises(ValueError, match="malformed sparse gradient message"):
        comm.return_gradients([torch.zeros(10, G)], [sent_index], torch.zeros(12, G), CommStats())


def test_sparse_kernels_serve_cuda_float_tensors_only():
    # CPU tensors (and half precision) always take the torch implementation; the GPU kernels are
    # compared with it in tests/distributed/test_sparse_kernels_gpu.py.
    from bytesplat_ns.distributed import sparse_kernels

    assert not sparse_kernels.usable(torch.zeros(4, 9))
    assert not sparse_kernels.usable(torch.zeros(4, 9, dtype=torch.float16))


# ---------------------------------------------------------------------------------------------
# Multi-process runs


@pytest.mark.parametrize("world", [2, 4])
def test_sharded_steps_equal_single_process(world, core_runs, oracle):
    out = core_runs(world)
    for name in ("dense", "sparse"):
        ranks = load(out, name, world)
        assert_params_close(ranks[0]["params"], oracle["params"])
        # The batch loss each step is the mean of the per-view losses, summed over ranks.
        got = [s["loss"] for s in ranks[0]["steps"]]
        assert got == pytest.approx(oracle["losses"], rel=1e-5)
        # ... and the parameters did move (the comparison is not trivially true).
        init = W.make_gaussians(W.N_GAUSSIANS, W.SEED)
        assert (ranks[0]["params"]["means"] - init["means"]).abs().max() > 1e-5


@pytest.mark.parametrize("world", [2, 4])
def test_dense_and_sparse_grad_give_identical_parameters(world, core_runs):
    out = core_runs(world)
    dense, sparse = load(out, "dense", world)[0], load(out, "sparse", world)[0]
    for k in dense["params"]:
        assert torch.equal(dense["params"][k], sparse["params"][k]), k


@pytest.mark.parametrize("world", [2, 4])
def test_bytes_counted_equal_records_sent(world, core_runs):
    out = core_runs(world)
    visible, nonzero = initial_visibility()
    layout = ShardLayout.even(W.N_GAUSSIANS, world)
    views_of = assign_views(W.NUM_VIEWS, world)
    fwd_rec, dense_rec, sparse_rec = forward_record_bytes(3), dense_grad_record_bytes(3), sparse_grad_record_bytes(3)

    def pairs(mask, owner, renderer):
        a, b = layout.range(owner)
        return int(sum(mask[v, a:b].sum().item() for v in views_of[renderer]))

    dense, sparse = load(out, "dense", world), load(out, "sparse", world)
    total_dense_bwd = total_sparse_bwd = 0
    for r in range(world):
        others = [d for d in range(world) if d != r]
        m_out = sum(pairs(visible, r, d) for d in others)  # records r sends as owner
        m_in = sum(pairs(visible, s, r) for s in others)  # records r renders for other owners
        k_in = sum(pairs(nonzero, s, r) for s in others)
        # per source, the sparse message or, where it would not be smaller, the dense rows
        sparse_in = 0
        for s in others:
            k_s, m_s = pairs(nonzero, s, r), pairs(visible, s, r)
            dense_form = SparseGradCommunicator.sends_dense(k_s, m_s, communicators.grad_columns(3), torch.float32)
            sparse_in += m_s * dense_rec if dense_form else k_s * sparse_rec
        for runs in (dense, sparse):
            st = runs[r]["steps"][0]["stats"]
            assert st["forward_records"] == m_out
            assert st["forward_bytes"] == m_out * fwd_rec  # no header: the counts travel in the step's one gather
            assert st["meta_bytes"] >= 8 * (1 + W.NUM_VIEWS)  # that gather: shard size + records per view
        d0, s0 = dense[r]["steps"][0], sparse[r]["steps"][0]
        assert d0["stats"]["backward_records"] == m_in
        assert d0["stats"]["backward_bytes"] == m_in * dense_rec
        assert s0["stats"]["backward_records"] == k_in
        assert s0["stats"]["backward_bytes"] == sparse_in <= min(k_in * sparse_rec, m_in * dense_rec)
        # What the counters report is what isend was handed, every step.
        for runs in (dense, sparse):
            for step in runs[r]["steps"]:
                assert step["stats"]["forward_bytes"] + step["stats"]["backward_bytes"] == step["wire"]
        total_dense_bwd += d0["stats"]["backward_bytes"]
        total_sparse_bwd += s0["stats"]["backward_bytes"]
    # A third of this scene's Gaussians are transparent: sparse-grad must send clearly less.
    assert total_sparse_bwd < 0.8 * total_dense_bwd


@pytest.mark.parametrize("world", [2, 4])
def test_densification_statistics_reach_the_owner(world, core_runs):
    """Each owner's means2d.grad / absgrad / radii [B, shard, ...] equal the single-process ones."""
    from bytesplat_ns.raster import rasterize
    from bytesplat_ns.distributed.step import gaussian_colors, rgb_with_background, splatfacto_loss

    out = core_runs(world)
    views = W.make_views()
    p = W.to_params(W.make_gaussians(W.N_GAUSSIANS, W.SEED))
    render, alpha, info = rasterize(
        p["means"], p["quats"], torch.exp(p["scales"]), torch.sigmoid(p["opacities"]).squeeze(-1),
        gaussian_colors(p, W.SH_DEGREE), views.viewmats, views.Ks, W.WIDTH, W.HEIGHT,
        backend="reference", sh_degree=W.SH_DEGREE, absgrad=True,
    )
    info["means2d"].retain_grad()
    loss = sum(splatfacto_loss(rgb_with_background(render[b], alpha[b], views.backgrounds[b]), views.images[b]) for b in range(W.NUM_VIEWS)) / W.NUM_VIEWS
    loss.backward()
    ranks = [torch.load(out / f"stats-rank{r}.pt") for r in range(world)]
    for key, want in (("grad", info["means2d"].grad), ("absgrad", info["means2d"].absgrad), ("radii", info["radii"])):
        got = torch.cat([r[key] for r in ranks], dim=1)
        assert got.shape == want.shape
        if key == "radii":
            assert torch.equal(got, want)
        else:
            assert want.abs().max() > 0
            assert ((got - want).norm() / want.norm()).item() <= REL_TOL, key


def test_rebalance_moves_gaussians_and_adam_state(core_runs, oracle):
    world = 2
    out = core_runs(world)
    ranks = load(out, "rebalance", world)
    n0 = int(W.N_GAUSSIANS * 0.7)
    assert ranks[0]["steps"][0]["layout"] == (n0, W.N_GAUSSIANS - n0)
    reb0, reb1 = ranks[0]["rebalance"], ranks[1]["rebalance"]
    assert reb0["moved"] and reb1["moved"]
    assert reb0["layout"] == (W.N_GAUSSIANS // 2, W.N_GAUSSIANS // 2)
    assert (reb0["before"], reb0["after"], reb1["before"], reb1["after"]) == (n0, 120, W.N_GAUSSIANS - n0, 120)
    assert reb0["same_param_in_opt"] and reb1["same_param_in_opt"]
    # Rows moved from rank 0 to rank 1: the parameters and Adam's two moments, float32.
    floats_per_row = 3 + 3 + 4 + 3 + 45 + 1
    assert reb0["payload"] == reb0["wire"] == (n0 - 120) * floats_per_row * 3 * 4
    assert reb1["payload"] == 0
    # Adam state travelled with its Gaussians: equal to the single-process state after step 1.
    assert_params_close(reb0["exp_avg"], oracle["exp_avg"][0])
    assert ranks[0]["steps"][1]["layout"] == (120, 120)
    # Training after the move is the same training.
    assert_params_close(ranks[0]["params"], oracle["params"])
    # Within 10%: nothing moves.
    assert not torch.load(out / "norebalance-rank0.pt")["moved"]
    assert not torch.load(out / "norebalance-rank1.pt")["moved"]


def test_dead_rank_stops_every_rank_with_a_clear_error(tmp_path):
    bound = 45.0
    results, seconds = run_workers("die", 4, tmp_path, timeout_s=bound, extra_env={"TEST_PG_TIMEOUT": "10", "TEST_WATCHDOG": "20"})
    assert seconds < bound and not any(r.timed_out for r in results), describe(results)
    assert results[1].returncode == 9, describe(results)  # the rank that died
    for r in (0, 2, 3):
        res = results[r]
        assert res.returncode not in (0, None), describe(results)
        assert "bytesplat: error: rank " in res.stderr and "communication" in res.stderr, describe(results)
        assert "Traceback" not in res.stderr, describe(results)
        assert "finished step 0" in res.stdout and "finished step 1" not in res.stdout


def test_stalled_rank_stops_every_rank_with_a_clear_error(tmp_path):
    bound = 40.0
    pg_timeout, watchdog = 4.0, 8.0
    results, seconds = run_workers("stall", 2, tmp_path, timeout_s=bound, extra_env={"TEST_PG_TIMEOUT": str(pg_timeout), "TEST_WATCHDOG": str(watchdog)})
    assert seconds < bound and not any(r.timed_out for r in results), describe(results)
    # The waiting rank: the process-group timeout fires and it names the failed exchange.
    assert results[0].returncode == 1, describe(results)
    assert "bytesplat: error: rank 0/2" in results[0].stderr and "Timed out" in results[0].stderr, describe(results)
    # The stalled rank: its watchdog ends it with a message naming the step.
    assert results[1].returncode == 75, describe(results)
    assert "rank 1/2: training step 1 did not finish within 8 s" in results[1].stderr, describe(results)
