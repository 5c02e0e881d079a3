"""Pixel exchange (Splaxel) on GPUs: the ``fused`` cell renderer (bytesplat's CUDA tile rasterizer)
against the ``reference`` one, the whole pixel step with every tensor on the GPU, the nerfstudio
pipeline with ``--pipeline.communicator pixel --machine.device-type cuda``, and (2 GPUs) NCCL.

GPU only (skipped without CUDA; the 2-process tests also need 2 visible GPUs). The scenes and the
one-process oracle are those of tests/distributed/test_pixel_exchange.py (tests/helpers/pixel_worker.py): 32x24 views,
SH degree 3, kd cells without border-crossing Gaussians where exactness is checked.

Tolerances: the reference renderer on the GPU against itself on the CPU: rounding only (1e-5). The
fused renderer against the reference on the SAME cell with the SAME (torch) projection: partial
color and transmittance to 1e-5, gradients to 1e-4 (norm-relative; the kernel's backward sums in
another order). With gsplat's CUDA projection (the fused default when gsplat is importable) the
projection and SH also differ in rounding: 1e-3 on gradients. The whole step against one process:
1e-4 on images/loss and 1e-3 on gradients with ``fused``.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest
import torch

from tests.helpers import pixel_worker as P

pytestmark = pytest.mark.gpu

REPO = Path(__file__).resolve().parents[2]


def nrel(a: torch.Tensor, b: torch.Tensor) -> float:
    """|a - b| / |b| (norms), 0 when both are 0."""
    a, b = a.detach().double().cpu(), b.detach().double().cpu()
    den = b.norm().item()
    return (a - b).norm().item() / den if den > 0 else (a - b).norm().item()


def max_abs(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a.detach().double().cpu() - b.detach().double().cpu()).abs().max().item()


# ---------------------------------------------------------------------------------------------
# One cell: fused vs reference partials and gradients


def _render_one_cell(renderer: str, g, rows, views, projection: str = "auto"):
    from bytesplat_ns.distributed.pixel import render_cell
    from bytesplat_ns.raster.options import FusedOptions

    params = {k: torch.nn.Parameter(v.clone().cuda()) for k, v in g.items()}
    C, T, info = render_cell(params, rows.cuda(), views, P.SH_DEGREE, absgrad=True, with_info=True, renderer=renderer,
                             fused_options=FusedOptions(projection=projection))
    gen = torch.Generator(device="cuda").manual_seed(5)
    dC = torch.randn(C.shape, generator=gen, device="cuda")
    dT = torch.randn(T.shape, generator=gen, device="cuda")
    ((C * dC).sum() + (T * dT).sum()).backward()  # arbitrary dL/dC_k, dL/dT_k, as the exchange returns them
    return {
        "C": C.detach(), "T": T.detach(), "grads": {k: p.grad.clone() for k, p in params.items()},
        "means2d_grad": info["means2d"].grad.clone(), "absgrad": info["means2d"].absgrad.clone(), "radii": info["radii"],
        "rows": info["rows"],
    }


@pytest.mark.parametrize("projection", ["torch", "gsplat"])
def test_fused_cell_render_equals_reference(projection):
    """The same cell rendered by both renderers: the same partial color/transmittance contract
    (premultiplied color without background, T = 1 - alpha), the same gradients for the same
    dL/dC_k, dL/dT_k, and the same densification info (means2d gradient, absgrad, radii)."""
    if projection == "gsplat":
        pytest.importorskip("gsplat.cuda._wrapper")
    g, tree = P.make_scene(400, 4, crossing=False)
    views = P.views_on(P.make_views(), "cuda")
    rows = torch.nonzero(tree.locate(g["means"]) == 1).squeeze(1)
    assert rows.numel() > 20
    ref = _render_one_cell("reference", g, rows, views)
    fused = _render_one_cell("fused", g, rows, views, projection)
    assert fused["C"].shape == ref["C"].shape == (P.NUM_VIEWS, P.HEIGHT, P.WIDTH, 3)
    assert fused["T"].shape == ref["T"].shape == (P.NUM_VIEWS, P.HEIGHT, P.WIDTH)
    assert fused["C"].device.type == fused["T"].device.type == "cuda"
    assert max_abs(fused["C"], ref["C"]) <= 1e-5 and max_abs(fused["T"], ref["T"]) <= 1e-5
    # Untouched pixels are exactly C = 0, T = 1 in both (what the exchange's rectangle check reads).
    untouched = (ref["T"] == 1) & (ref["C"] == 0).all(-1)
    assert untouched.any() and bool((fused["T"][untouched] == 1).all()) and bool((fused["C"][untouched] == 0).all())
    tol = 1e-4 if projection == "torch" else 1e-3
    for k in ref["grads"]:
        assert nrel(fused["grads"][k], ref["grads"][k]) <= tol, (k, nrel(fused["grads"][k], ref["grads"][k]))
    assert nrel(fused["means2d_grad"], ref["means2d_grad"]) <= tol
    assert nrel(fused["absgrad"], ref["absgrad"]) <= tol
    if projection == "torch":
        assert torch.equal(fused["radii"].cpu().int(), ref["radii"].cpu().int())
    assert torch.equal(fused["rows"].cpu(), rows)


def test_fused_renderer_refuses_cpu_tensors_and_non_rgb():
    from bytesplat_ns.distributed.pixel import render_cell, resolve_renderer
    from bytesplat_ns.errors import BytesplatError

    assert resolve_renderer("auto", torch.device("cuda", 0)) == "fused"
    assert resolve_renderer("auto", torch.device("cpu")) == "reference"
    with pytest.raises(BytesplatError, match="CUDA"):
        resolve_renderer("fused", torch.device("cpu"))
    g, _ = P.make_scene(50, 1, crossing=True)
    params = {k: v.cuda() for k, v in g.items()}
    params["features_dc"] = torch.zeros(50, 4, device="cuda")  # 4 channels, no SH
    params["features_rest"] = torch.zeros(50, 0, 4, device="cuda")
    with pytest.raises(BytesplatError, match="RGB only"):
        render_cell(params, torch.arange(50), P.views_on(P.make_views(), "cuda"), None, renderer="fused")


# ---------------------------------------------------------------------------------------------
# The whole step in one process (a world of 1, several cells), every tensor on the GPU


@pytest.mark.parametrize("transmittance", [False, True])
def test_pixel_step_on_cuda_equals_one_process(transmittance):
    from bytesplat_ns.distributed.pixel import PixelConfig
    from tests.helpers.pixel_results import gathered, oracle

    g, tree = P.make_scene(400, 4, crossing=False)  # 4 cells, all on rank 0
    want_img, want_loss, want_grads = oracle(g)  # one process, all Gaussians, reference on the CPU
    views_cpu = P.make_views()
    views = P.views_on(views_cpu, "cuda")
    cfg = PixelConfig(transmittance=transmittance)
    got = {}
    for name, device, renderer, v in (("cuda-reference", "cuda", "reference", views), ("fused", "cuda", "fused", views),
                                      ("auto", "cuda", "auto", views)):
        run = P.run_once(g, tree, 0, 1, v, cfg, device=device, renderer=renderer)
        assert run["stats"]["forward_bytes"] == run["stats"]["backward_bytes"] == 0  # nothing leaves the rank
        got[name] = gathered([{"k": run}], "k")
    img, loss, grads = got["cuda-reference"]
    assert max_abs(img, want_img) <= 1e-5 and loss == pytest.approx(want_loss, rel=1e-5)
    for k in want_grads:
        assert nrel(grads[k], want_grads[k]) <= 1e-4, k
    for name in ("fused", "auto"):  # auto is fused on CUDA
        img, loss, grads = got[name]
        assert max_abs(img, want_img) <= 1e-4 and loss == pytest.approx(want_loss, rel=1e-4), name
        for k in want_grads:
            assert nrel(grads[k], want_grads[k]) <= 1e-3, (name, k, nrel(grads[k], want_grads[k]))


def test_pixel_training_steps_and_migration_on_cuda():
    from bytesplat_ns.distributed import SPLATFACTO_LRS, make_adam_optimizers
    from bytesplat_ns.distributed.cells import migrate
    from bytesplat_ns.distributed.pixel import pixel_step

    g, tree = P.make_scene(240, 4, crossing=True)
    views = P.views_on(P.make_views(), "cuda")
    params, gids, cells = P.local_part(g, tree, 0, 1, "cuda")
    opts = make_adam_optimizers(params, SPLATFACTO_LRS, P.NUM_VIEWS)
    losses = [pixel_step(params, opts, cells, views, P.SH_DEGREE, renderer="fused").loss for _ in range(3)]
    assert all(torch.isfinite(torch.tensor(losses))) and losses[-1] < losses[0], losses
    with torch.no_grad():
        params["means"][:, 0] += 0.25  # some Gaussians leave their cell
    cell_of, sent = migrate(params, opts, tree, cells.ranks_of_cells)
    assert sent == 0 and cell_of.device.type == "cuda"  # one rank: every cell is local
    assert torch.equal(cell_of.cpu(), tree.locate(params["means"].detach().cpu()))
    cells.cell_of = cell_of
    res = pixel_step(params, opts, cells, views, P.SH_DEGREE, renderer="fused")
    assert torch.isfinite(torch.tensor(res.loss))
    assert all(p.device.type == "cuda" and bool(torch.isfinite(p).all()) for p in params.values())


# ---------------------------------------------------------------------------------------------
# Through nerfstudio's trainer on CUDA (one process; two with 2 GPUs)


PIPELINE_ITERS = 10


def _train_cuda(tmp: Path, name: str, nprocs: int):
    from tests.helpers.pixel_train_runs import DENSIFY, train

    return train(tmp, name, nprocs, PIPELINE_ITERS, ["--pipeline.communicator", "pixel", "--steps-per-save", "1000", *DENSIFY],
                 device="cuda", rasterizer="auto", wall_s=240)


def _check_pipeline_run(run_dir: Path, nprocs: int):
    from tests.helpers.pixel_train_runs import NAMES, checkpoints, gaussians, load, scalars

    ckpts = checkpoints(run_dir)
    final = load(ckpts[max(ckpts)])
    g = gaussians(final)
    counts = scalars(run_dir, "Train Metrics Dict/gaussian_count")
    assert g["means"].shape[0] == counts[PIPELINE_ITERS - 1]
    assert all(torch.isfinite(g[n]).all() for n in NAMES)
    fwd = scalars(run_dir, "communication/pixel/forward_bytes")
    assert fwd is not None and len(fwd) == PIPELINE_ITERS
    if nprocs > 1:
        assert all(v > 0 for v in fwd.values())
        assert max(scalars(run_dir, "communication/pixel/migration_bytes").values()) > 0
    losses = scalars(run_dir, "Train Loss")
    assert losses is not None and all(torch.isfinite(torch.tensor(list(losses.values()))))


def test_pipeline_pixel_on_one_gpu(tmp_path):
    run_dir, _ = _train_cuda(tmp_path, "g1", 1)
    _check_pipeline_run(run_dir, 1)


@pytest.mark.gpu(count=2)
def test_pipeline_pixel_on_two_gpus_nccl(tmp_path):
    run_dir, _ = _train_cuda(tmp_path, "g2", 2)
    _check_pipeline_run(run_dir, 2)


# ---------------------------------------------------------------------------------------------
# Two processes, one GPU each, NCCL (tests/helpers/pixel_worker.py, scenario "nccl")


@pytest.fixture(scope="module")
def nccl_ranks(tmp_path_factory):
    from bytesplat_ns.distributed.launch import launch_local
    from tests.helpers.pixel_results import describe

    out = tmp_path_factory.mktemp("nccl")
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", PIXEL_TEST_BACKEND="nccl")
    start = time.monotonic()
    results = launch_local([sys.executable, "-m", "tests.helpers.pixel_worker", "nccl", str(out)], 2, 240, env=env, cwd=REPO)
    assert all(r.returncode == 0 for r in results), describe(results)
    print(f"nccl workers: {time.monotonic() - start:.1f}s")
    return [torch.load(out / f"nccl-rank{r}.pt", weights_only=False) for r in range(2)]


@pytest.mark.gpu(count=2)
def test_nccl_composite_equals_one_process_with_both_renderers(nccl_ranks):
    from tests.helpers.pixel_results import gathered, oracle

    g, _ = P.make_scene(400, P.CELLS_PER_RANK * 2, crossing=False)
    want_img, want_loss, want_grads = oracle(g)
    for key, img_tol, grad_tol in (("reference", 1e-5, 1e-4), ("fused", 1e-4, 1e-3)):
        img, loss, grads = gathered(nccl_ranks, key)
        assert max_abs(img, want_img) <= img_tol and loss == pytest.approx(want_loss, rel=10 * img_tol), key
        for k in want_grads:
            assert nrel(grads[k], want_grads[k]) <= grad_tol, (key, k, nrel(grads[k], want_grads[k]))
        assert all(r[key]["stats"]["forward_bytes"] > 0 and r[key]["stats"]["backward_bytes"] > 0 for r in nccl_ranks)


@pytest.mark.gpu(count=2)
def test_nccl_pruning_keeps_the_image_and_bytes_match_the_wire(nccl_ranks):
    from tests.helpers.pixel_results import gathered as gathered_of

    for renderer in ("reference", "fused"):
        base_img, _, base_grads = gathered_of(nccl_ranks, renderer)
        for key in (f"{renderer}_nogeo", f"{renderer}_t"):
            img, _, grads = gathered_of(nccl_ranks, key)
            assert max_abs(img, base_img) <= 1e-6, key
            for k in grads:
                assert nrel(grads[k], base_grads[k]) <= 1e-5, (key, k)
        for key in (renderer, f"{renderer}_nogeo", f"{renderer}_t"):
            for r in nccl_ranks:
                s = r[key]["stats"]
                assert s["forward_bytes"] + s["backward_bytes"] == r[key]["wire"], key
        for r in nccl_ranks:
            s = r[f"{renderer}_nogeo"]["stats"]
            assert s["forward_bytes"] + s["backward_bytes"] == s["unpruned_bytes"] > 0


@pytest.mark.gpu(count=2)
def test_nccl_rank_without_gaussians_training_and_migration(nccl_ranks):
    from tests.helpers.pixel_results import gathered, oracle

    g, tree = P.make_scene(400, P.CELLS_PER_RANK * 2, crossing=False)
    want_img, want_loss, _ = oracle(P.only_rank0_cells(g, tree, 2))
    assert nccl_ranks[1]["empty_rank"]["gids"].numel() == 0
    img, loss, _ = gathered(nccl_ranks, "empty_rank")
    assert max_abs(img, want_img) <= 1e-4 and loss == pytest.approx(want_loss, rel=1e-3)
    for rank, r in enumerate(nccl_ranks):
        t = r["train"]
        assert t["device"].startswith("cuda") and t["finite"]
        assert all(torch.isfinite(torch.tensor(t["losses"])))
        assert t["losses"][P.TRAIN_STEPS - 1] < t["losses"][0], t["losses"]
        ranks_of = torch.tensor(t["ranks"])
        assert bool((ranks_of[t["cells"]] == rank).all())  # after the migration every Gaussian is on its cell's rank
    gids = torch.sort(torch.cat([r["train"]["gids"] for r in nccl_ranks])).values
    assert torch.equal(gids, torch.arange(gids.numel()))  # none lost or duplicated
    assert sum(r["train"]["sent"] for r in nccl_ranks) > 0
