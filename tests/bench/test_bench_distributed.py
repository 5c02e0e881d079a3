"""``bytesplat-bench distributed`` on the CPU: 2 gloo ranks run by the benchmark itself
(torch.multiprocessing), tiny scene. Checks that it runs end to end for ``dense`` and
``sparse-grad``, that its JSON holds the fields the GPU run needs, that the bytes it reports are
the communicators' stats (and match the records the projection sends), and that the gsplat rows are
skipped on the CPU with the reason recorded.
"""

from __future__ import annotations

import json
import statistics

import pytest
import torch

N, W, H, B, REPEATS = 1200, 40, 28, 2, 3


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    from bytesplat_ns.bench.distributed import main

    out = tmp_path_factory.mktemp("bench_distributed") / "distributed.json"
    argv = ["--spawn", "2", "--device", "cpu", "--num-gaussians", str(N), "--width", str(W), "--height", str(H),
            "--views", str(B), "--warmup", "0", "--repeats", str(REPEATS), "--communicators", "dense", "sparse-grad",
            "pixel", "--out", str(out)]
    returned = main(argv)
    on_disk = json.loads(out.read_text())
    assert returned == on_disk
    return on_disk


def _row(report, impl, ranks, comm):
    rows = [r for r in report["results"] if r["impl"] == impl and r["ranks"] == ranks and r["communicator"].startswith(comm)]
    assert len(rows) == 1, (impl, ranks, comm, [(r["impl"], r["ranks"], r["communicator"]) for r in report["results"]])
    return rows[0]


def test_json_has_the_fields(report):
    assert report["benchmark"] == "bytesplat-bench distributed"
    assert "--spawn 2" in report["command"] and "--num-gaussians 1200" in report["command"]
    env = report["environment"]
    for key in ("date", "python", "torch", "gsplat", "nerfstudio", "cuda", "backend", "devices", "world_size", "NCCL_NVLS_ENABLE"):
        assert key in env, key
    assert env["backend"] == "gloo" and env["world_size"] == 2 and len(env["devices"]) == 2
    assert env["gsplat"] == "1.4.0"
    assert report["complete"] is True
    assert report["scene"] == {**report["scene"], "num_gaussians": [N], "width": W, "height": H, "views_per_step": B, "sh_degree": 3}
    assert report["settings"]["compositor"] == "reference" and report["settings"]["repeats"] == REPEATS
    for ranks, comm in ((1, "none"), (2, "dense"), (2, "sparse-grad")):
        r = _row(report, "bytesplat", ranks, comm)
        assert r["status"] == "ok" and r["num_gaussians"] == N
        assert len(r["step_ms"]) == REPEATS and all(t > 0 for t in r["step_ms"])
        assert r["median_step_ms"] == pytest.approx(statistics.median(r["step_ms"]))
        assert r["views_per_second"] == pytest.approx(B / (r["median_step_ms"] / 1000))
        assert len(r["peak_memory_mb"]) == ranks  # None on the CPU
        assert r["bytes_exact"] is True
        assert r["loss_last"] > 0
    one = _row(report, "bytesplat", 1, "none")
    assert one["bytes_per_step"]["forward_bytes"] == 0 and one["bytes_per_step"]["backward_bytes"] == 0
    comp = report["comparison"][str(N)]
    dense, sparse = _row(report, "bytesplat", 2, "dense"), _row(report, "bytesplat", 2, "sparse-grad")
    assert comp["sparse_vs_dense_backward_bytes"] == pytest.approx(
        sparse["bytes_per_step"]["backward_bytes"] / dense["bytes_per_step"]["backward_bytes"])
    assert comp["dense_views_per_second_2_vs_1"] == pytest.approx(dense["views_per_second"] / one["views_per_second"])
    assert comp["targets"]["sparse_vs_dense_backward_bytes_max"] == 0.35


def test_pixel_exchange_row(report):
    """``pixel`` (partial images instead of 2D records) runs through the same driver; its bytes are
    its own PixelStats (no records)."""
    r = _row(report, "bytesplat", 2, "pixel")
    assert r["status"] == "ok" and r["bytes_exact"] is True
    assert r["bytes_per_step"]["forward_bytes"] > 0 and r["bytes_per_step"]["backward_bytes"] > 0
    assert r["bytes_per_step"]["forward_records"] == 0
    assert "pixel_views_per_second_2_vs_1" in report["comparison"][str(N)]


def test_gsplat_rows_skipped_on_cpu_with_reason(report):
    for ranks, comm in ((1, "none"), (2, "gsplat distributed")):
        r = _row(report, "gsplat", ranks, comm)
        assert r["status"] == "skipped"
        assert "CUDA" in r["reason"] and "GPU" in r["reason"]
    assert "dense_vs_gsplat_distributed_views_per_second" not in report["comparison"][str(N)]


def test_bytes_are_the_communicators_stats(report):
    from bytesplat_ns.distributed import (
        SparseGradCommunicator,
        dense_grad_record_bytes,
        forward_record_bytes,
        sparse_grad_record_bytes,
    )
    from bytesplat_ns.distributed.communicators import grad_columns

    dense, sparse = _row(report, "bytesplat", 2, "dense"), _row(report, "bytesplat", 2, "sparse-grad")
    for r in (dense, sparse):
        # per-step totals are the sums of every rank's CommStats, the summary their mean
        for i, step in enumerate(r["per_step_stats"]):
            for k, v in step.items():
                assert v == sum(rank[i][k] for rank in r["per_rank_step_stats"]), (r["communicator"], i, k)
        for k, v in r["bytes_per_step"].items():
            assert v == pytest.approx(statistics.mean(s[k] for s in r["per_step_stats"]))
        for rank_steps in r["per_rank_step_stats"]:
            for s in rank_steps:
                # forward: 48 bytes per record, no header (the counts come with the step's one gather)
                assert s["forward_bytes"] == s["forward_records"] * forward_record_bytes(3)
                assert s["meta_bytes"] > 0
    # A rank's backward stats count the gradients it returns for the records it RECEIVED (2 ranks:
    # the other rank's forward records).
    r0, r1 = dense["per_rank_step_stats"]
    for mine, other in ((r0, r1), (r1, r0)):
        for s, o in zip(mine, other):
            assert s["backward_records"] == o["forward_records"]  # every forwarded record's gradient returns
            assert s["backward_bytes"] == s["backward_records"] * dense_grad_record_bytes(3)
    r0, r1 = sparse["per_rank_step_stats"]
    for mine, other in ((r0, r1), (r1, r0)):
        for s, o in zip(mine, other):
            assert 0 < s["backward_records"] <= o["forward_records"]
            # the non-zero records with their indices, or the dense rows where those would not be smaller
            k, m = s["backward_records"], o["forward_records"]
            dense_form = SparseGradCommunicator.sends_dense(k, m, grad_columns(3), torch.float32)
            assert s["backward_bytes"] == (m * dense_grad_record_bytes(3) if dense_form else k * sparse_grad_record_bytes(3))
    # Same scene, same updates (sparse-grad's owner gradients equal dense's): same records forward.
    for a, b in zip(dense["per_rank_step_stats"], sparse["per_rank_step_stats"]):
        assert [s["forward_records"] for s in a] == [s["forward_records"] for s in b]


def test_forward_records_match_the_projection(report):
    """Step 0 (no warm-up): the records sent to the other rank are exactly the (view, Gaussian)
    pairs with radius > 0 whose Gaussian lives on the other rank, from one process's projection."""
    from bytesplat_ns.bench.distributed import _views, make_scene
    from bytesplat_ns.distributed import assign_views
    from bytesplat_ns.distributed.sharding import ShardLayout
    from bytesplat_ns.distributed.step import project_shard

    scene = make_scene(N, W, H, B, 3, 0)
    with torch.no_grad():
        radii = project_shard(scene["params"], _views(scene, torch.device("cpu")), 3).radii  # [B, N]
    layout = ShardLayout.even(N, 2)
    owner = layout.owner_of(torch.arange(N))
    renderer = assign_views(B, 2)
    expected = [0, 0]  # by sending rank
    for r, views in enumerate(renderer):
        for v in views:
            for s in range(2):
                if s != r:
                    expected[s] += int(((radii[v] > 0) & (owner == s)).sum())
    assert expected[0] > 0 and expected[1] > 0
    for name in ("dense", "sparse-grad"):
        r = _row(report, "bytesplat", 2, name)
        assert [rank[0]["forward_records"] for rank in r["per_rank_step_stats"]] == expected


def test_cli_dispatches_distributed(monkeypatch):
    import bytesplat_ns.bench.distributed as bd
    from bytesplat_ns.bench import cli

    seen = []
    monkeypatch.setattr(bd, "main", lambda argv: seen.append(argv))
    assert cli.main(["distributed", "--views", "4"]) == 0
    assert seen == [["--views", "4"]]


@pytest.mark.parametrize("distributed", [False, True])
def test_gsplat_step_plumbing_with_a_stand_in_rasterizer(monkeypatch, distributed):
    """The gsplat rows cannot run on the CPU; check what the GPU run will hand to gsplat with a
    differentiable stand-in for ``gsplat.rasterization``: this rank's shard and ONLY its cameras,
    SH coefficients [n, K, 3], packed, the distributed flag; the loss over this rank's views; an
    Adam step on the shard; and the byte estimate from gsplat's (global) camera ids."""
    import gsplat

    from bytesplat_ns.bench import distributed as bd

    calls = []

    def stand_in(means, quats, scales, opacities, colors, viewmats, Ks, width, height, sh_degree=None, packed=True,
                 distributed=False):
        calls.append(dict(n=means.shape[0], C=viewmats.shape[0], viewmats=viewmats.clone(), packed=packed,
                          distributed=distributed, sh=sh_degree, colors=tuple(colors.shape)))
        C = viewmats.shape[0]
        v = torch.sigmoid(opacities.mean() + 0.1 * (means.mean() + quats.mean() + scales.mean() + colors.mean()))
        render = (v * 0.5).expand(C, height, width, 3)
        alpha = v.expand(C, height, width, 1)
        # gsplat's meta holds the packed records before its all_to_all: camera ids over ALL ranks'
        # cameras (2 per rank here), local Gaussian ids
        meta = {"gaussian_ids": torch.tensor([0, 5, 9, 3, 7], dtype=torch.int64),
                "camera_ids": torch.tensor([0, 1, 2, 3, 2], dtype=torch.int64), "radii": torch.ones(5, dtype=torch.int32),
                "means2d": torch.zeros(5, 2)}
        return render, alpha, meta

    monkeypatch.setattr(gsplat, "rasterization", stand_in)
    cpu = torch.device("cpu")
    scene = bd.make_scene(20, 16, 12, 4, 3, 0)
    params = bd._leaves(scene["params"], torch.arange(10), cpu)  # rank 0 of 2
    before = {k: v.detach().clone() for k, v in params.items()}
    views = bd._views(scene, cpu, [0, 1])
    step = bd._gsplat_step(params, bd._adam(params, 4), views, [0, 1], 3, distributed, 0, 2)
    out = step()
    (call,) = calls
    assert call["n"] == 10 and call["C"] == 2 and call["packed"] is True and call["distributed"] is distributed
    assert call["sh"] == 3 and call["colors"] == (10, 16, 3)
    assert torch.equal(call["viewmats"], scene["viewmats"][:2])
    assert out["loss"] > 0
    assert all(not torch.equal(before[k], params[k].detach()) for k in ("means", "opacities"))
    if distributed:
        # cameras 2, 3, 2 are rank 1's: 3 records go there
        assert out["forward_records"] == 3 and out["backward_records"] == 3
        assert out["forward_bytes"] == 3 * (4 + 10 * 4 + 8 + 8) and out["backward_bytes"] == 3 * 10 * 4
    else:
        assert "forward_bytes" not in out


def test_torchrun_style_launch(tmp_path):
    """Under a launcher with torchrun's environment contract (one process per rank), through the
    ``bytesplat-bench`` entry point: every rank exits 0 and rank 0 writes the JSON (with
    ``--skip-one-rank``, the all-ranks row alone)."""
    import sys

    from bytesplat_ns.distributed.launch import launch_local

    out = tmp_path / "d.json"
    cmd = [sys.executable, "-m", "bytesplat_ns.bench.cli", "distributed", "--device", "cpu", "--num-gaussians", "600",
           "--width", "32", "--height", "24", "--views", "2", "--warmup", "0", "--repeats", "1",
           "--communicators", "sparse-grad", "--skip-gsplat", "--skip-one-rank", "--out", str(out)]
    results = launch_local(cmd, 2, timeout_s=120)
    assert [r.returncode for r in results] == [0, 0], [r.stderr[-2000:] for r in results]
    report = json.loads(out.read_text())
    assert report["complete"] is True and report["command"].startswith("torchrun")
    assert [(r["impl"], r["ranks"], r["status"]) for r in report["results"]] == [("bytesplat", 2, "ok")]  # --skip-one-rank


def test_synthetic_scene_in_blocks_is_deterministic_and_keeps_its_first_block(monkeypatch):
    """Large benchmark scenes are drawn block by block in threads: the same seed gives the same
    scene, the first block is the scene a one-block draw gives, and later blocks are new draws."""
    from bytesplat_ns.bench import synthetic

    one_block = synthetic.synthetic_scene(1000, 64, 48, sh_degree=1, seed=3, device="cpu")
    monkeypatch.setattr(synthetic, "SCENE_BLOCK", 1000)
    a = synthetic.synthetic_scene(3500, 64, 48, sh_degree=1, seed=3, device="cpu")
    b = synthetic.synthetic_scene(3500, 64, 48, sh_degree=1, seed=3, device="cpu")
    other_seed = synthetic.synthetic_scene(3500, 64, 48, sh_degree=1, seed=4, device="cpu")
    keys = ("means", "scales", "quats", "opacities", "colors")
    assert all(torch.equal(a[k], b[k]) for k in keys)
    assert all(torch.equal(a[k][:1000], one_block[k]) for k in keys)
    assert not torch.equal(a["means"][1000:2000], a["means"][2000:3000])
    assert not torch.equal(a["means"][1000:], other_seed["means"][1000:])
    assert torch.equal(a["gt"], one_block["gt"])
    z = a["means"][:, 2]
    assert bool(((z >= 2.0) & (z <= 20.0)).all())  # every block fills the same frustum
