"""The sharded step's fused compositor (bytesplat's CUDA tile rasterizer) against the reference
compositor (GPU only): one view's records, and a whole sharded forward/backward in one process.
"""

from __future__ import annotations

import pytest
import torch

from tests.helpers.sharded_records import random_records, views_scored_in_one_call_vs_each_alone

pytestmark = pytest.mark.gpu


def _records(n: int, seed: int, width: int = 70, height: int = 50):
    return random_records(n, seed, width, height, device="cuda")


def _on_gpu(views):
    views.viewmats, views.Ks, views.backgrounds = views.viewmats.cuda(), views.Ks.cuda(), views.backgrounds.cuda()
    views.images = views.images.cuda()
    return views


def _run(compositor: str, recs, width, height):
    from bytesplat_ns.distributed import composite_records

    means2d, conics, colors, opacities, depths, radii, gids = [t.clone() for t in recs]
    leaves = [t.requires_grad_(True) for t in (means2d, conics, colors, opacities)]
    sink = []
    render, alpha = composite_records(means2d, conics, colors, opacities, depths, radii, gids, width, height,
                                      absgrad_sink=sink, compositor=compositor)
    target = torch.rand(render.shape, generator=torch.Generator(device="cuda").manual_seed(1), device="cuda")
    ((render - target) ** 2).mean().add(alpha.mean()).backward()
    return render.detach(), alpha.detach(), [leaf.grad for leaf in leaves], sink[0]


@pytest.mark.parametrize("n", [1, 300, 5000])
def test_fused_compositor_equals_reference(n):
    recs, W, H = _records(n, seed=n)
    ref = _run("reference", recs, W, H)
    fused = _run("fused", recs, W, H)
    for a, b in zip(ref[:2], fused[:2]):
        assert (a - b).abs().max().item() <= 1e-5 * max(1.0, a.abs().max().item())
    for a, b in zip(ref[2], fused[2]):
        assert (a - b).abs().max().item() <= 1e-4 * max(1e-6, a.abs().max().item())
    assert (ref[3] - fused[3]).abs().max().item() <= 1e-4 * max(1e-6, ref[3].abs().max().item())  # absgrad


@pytest.mark.parametrize("grouped", [False, True])
def test_sharded_forward_backward_with_the_fused_compositor(monkeypatch, grouped):
    """One process: the whole sharded step (projection, exchange to itself, compositing, loss, sparse-grad
    backward) gives the same loss and gradients with either compositor. ``grouped``: the joint
    binning's memory budget is shrunk to about two views' tile pairs, so the fused kernels score
    the views in several consecutive calls (``step._view_groups``), as at capacity sizes."""
    from bytesplat_ns.distributed import make_communicator, sharded_render_loss
    from bytesplat_ns.distributed import step as S
    from bytesplat_ns.raster.fused import tile_intersections, tile_radii
    from bytesplat_ns.raster.options import DEFAULT_OPTIONS
    from tests.helpers import distributed_worker as W

    calls = []
    if grouped:
        views = W.make_views()
        proj = S.project_shard({k: v.cuda() for k, v in W.make_gaussians(W.N_GAUSSIANS, W.SEED).items()},
                               _on_gpu(views), W.SH_DEGREE)
        reach = tile_radii(proj.radii, proj.conics, proj.opacities, DEFAULT_OPTIONS)  # what the step bins with
        per_view = tile_intersections(proj.means2d, reach, views.width, views.height).tolist()
        monkeypatch.setattr(S, "joint_binning_budget", lambda device: 2 * max(per_view))
        scored = S._score_padded_views
        monkeypatch.setattr(S, "_score_padded_views", lambda padded, *a, **k: calls.append(padded[0].shape[0]) or scored(padded, *a, **k))
    out = {}
    for compositor in ("reference", "fused"):
        params = {k: torch.nn.Parameter(v.cuda()) for k, v in W.make_gaussians(W.N_GAUSSIANS, W.SEED).items()}
        views = _on_gpu(W.make_views())
        fwd = sharded_render_loss(params, views, make_communicator("sparse-grad"), W.SH_DEGREE, compositor=compositor)
        fwd.local_loss.backward()
        out[compositor] = (fwd.local_loss.item(), {k: p.grad.clone() for k, p in params.items()})
    if grouped:  # several calls, every view scored once
        assert len(calls) > 1 and sum(calls) == views.num_views, calls
    (l_ref, g_ref), (l_fused, g_fused) = out["reference"], out["fused"]
    assert abs(l_ref - l_fused) <= 1e-5 * abs(l_ref)
    for k in g_ref:
        scale = g_ref[k].abs().max().item()
        assert (g_ref[k] - g_fused[k]).abs().max().item() <= 1e-3 * max(scale, 1e-12), k


@pytest.mark.parametrize("n", [300, 5000])
def test_fused_loss_compositor_equals_reference_and_splatfacto_loss(n):
    """One view's records scored inside the fused kernel (composite_records_fused_loss) against the
    reference compositor + background + splatfacto_loss (pytorch_msssim), through autograd: loss,
    record gradients and absgrad, with records arriving out of gid order."""
    from bytesplat_ns.distributed.step import (
        composite_records, composite_records_fused_loss, rgb_with_background, splatfacto_loss,
    )

    recs, W, H = _records(n, seed=n)
    g = torch.Generator(device="cuda").manual_seed(3)
    gt = torch.rand(H, W, 3, device="cuda", generator=g)
    bg = torch.rand(3, device="cuda", generator=g)
    out = {}
    for kind in ("reference", "fused-loss"):
        means2d, conics, colors, opacities, depths, radii, gids = [t.clone() for t in recs]
        leaves = [t.requires_grad_(True) for t in (means2d, conics, colors, opacities)]
        sink = []
        if kind == "reference":
            render, alpha = composite_records(means2d, conics, colors, opacities, depths, radii, gids, W, H,
                                              absgrad_sink=sink, compositor="reference")
            rgb = rgb_with_background(render, alpha, bg)
            loss = splatfacto_loss(rgb, gt)
        else:
            loss, rgb = composite_records_fused_loss(means2d, conics, colors, opacities, depths, radii, gids, W, H,
                                                     gt, bg, absgrad_sink=sink)
        (0.5 * loss).backward()
        out[kind] = (loss.item(), rgb.detach(), [leaf.grad for leaf in leaves], sink[0])
    (l_r, rgb_r, g_r, a_r), (l_f, rgb_f, g_f, a_f) = out["reference"], out["fused-loss"]
    assert abs(l_r - l_f) <= 1e-5 * abs(l_r)
    assert (rgb_r - rgb_f).abs().max().item() <= 1e-5
    for a, b in zip(g_r, g_f):
        assert (a - b).norm().item() <= 1e-4 * max(a.norm().item(), 1e-12)
    assert (a_r - a_f).norm().item() <= 1e-4 * max(a_r.norm().item(), 1e-12)


def test_views_scored_in_one_call_equal_each_view_alone():
    """The fused kernels themselves (tests/helpers/sharded_records.py has the comparison; the CPU twin runs
    it on the kernels' torch stand-in)."""
    views_scored_in_one_call_vs_each_alone("cuda")


def test_sharded_forward_reads_the_device_once():
    """The sharded forward's host reads (torch's sync debug mode reports them): one, the step's
    gather of shard sizes, records per view and the tiles those records reach. The record exchange,
    the per-view record ranges, the global-id order and the tile binning (its size is the gathered
    tiles' sum) need none. Each read empties the GPU's queue, which is what held the 1M two-GPU
    step back. This forward made 12 reads here (4 views) before the gather, then 1 + one per view
    until the views were scored in one call, then 2 until the binning's size came with the gather.
    A variant that binned every view before rendering (reverted) showed one more read, earlier than
    the gather, in a torch/cuda/__init__.py frame, so the test prints every read's stack."""
    import traceback
    import warnings

    from bytesplat_ns.distributed import make_communicator, sharded_render_loss
    from tests.helpers import distributed_worker as W

    params = {k: torch.nn.Parameter(v.cuda()) for k, v in W.make_gaussians(W.N_GAUSSIANS, W.SEED).items()}
    views = _on_gpu(W.make_views())

    def forward():
        return sharded_render_loss(params, views, make_communicator("dense"), W.SH_DEGREE, compositor="fused")

    forward().local_loss.backward()  # builds, first-use allocations
    torch.cuda.synchronize()
    reads = []

    def note(message, category, filename, lineno, file=None, line=None):
        if "synchroniz" in str(message):
            reads.append(f"{filename}:{lineno}\n" + "".join(traceback.format_stack(limit=12)[:-1]))

    with warnings.catch_warnings():
        warnings.simplefilter("always")
        # Set the mode before listening: its first use in a process emits a one-time warning of its
        # own (which a run of this file alone counted as a read; the full GPU suite had used it earlier).
        torch.cuda.set_sync_debug_mode("warn")
        warnings.showwarning = note
        try:
            fwd = forward()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    print(f"{len(reads)} host reads in the forward for {views.num_views} views:")
    for r in reads:
        print(r)
    assert views.num_views > 1 and len(reads) == 1, [r.split("\n")[0] for r in reads]
    fwd.local_loss.backward()




@pytest.mark.gpu(count=2)
def test_nccl_sharded_fused_step_equals_one_process(tmp_path):
    """Two ranks, one GPU each (NCCL): the record exchange with the fused compositor, each rank's
    views padded and scored in one call, gives one process's loss,
    gradients, densification statistic (absgrad) and renders (the reference compositor on all
    Gaussians), with dense and with sparse-grad."""
    import os
    import sys
    from pathlib import Path

    from bytesplat_ns.distributed import make_communicator, sharded_render_loss
    from bytesplat_ns.distributed.launch import launch_local
    from tests.helpers import distributed_worker as W

    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    results = launch_local([sys.executable, "-m", "tests.helpers.distributed_worker", "fused-nccl", str(tmp_path)], 2, 240,
                           env=env, cwd=Path(__file__).resolve().parents[2])
    assert all(r.returncode == 0 for r in results), [r.stderr[-2000:] for r in results]
    ranks = [torch.load(tmp_path / f"fused-rank{r}.pt", weights_only=False) for r in range(2)]

    params = {k: torch.nn.Parameter(v.cuda()) for k, v in W.make_gaussians(W.N_GAUSSIANS, W.SEED).items()}
    views = _on_gpu(W.make_views())
    ref = sharded_render_loss(params, views, make_communicator("dense"), W.SH_DEGREE, absgrad=True, compositor="reference")
    ref.local_loss.backward()
    for name in ("dense", "sparse-grad"):
        got = [r[name] for r in ranks]
        assert abs(sum(g["loss"] for g in got) - ref.local_loss.item()) <= 1e-5 * abs(ref.local_loss.item()), name
        for k, p in params.items():
            g = torch.cat([r["grads"][k] for r in got]).cuda()
            assert (g - p.grad).abs().max().item() <= 1e-3 * max(p.grad.abs().max().item(), 1e-12), (name, k)
        a = torch.cat([r["absgrad"] for r in got], dim=1).cuda()
        want = ref.info["means2d"].absgrad
        assert (a - want).abs().max().item() <= 1e-3 * want.abs().max().item(), name
        renders = {v: img for r in got for v, img in r["renders"].items()}
        assert sorted(renders) == list(range(views.num_views))
        for v, img in renders.items():
            assert (img.cuda() - ref.renders[v]).abs().max().item() <= 1e-4, (name, v)
