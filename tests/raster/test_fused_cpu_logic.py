"""The fused backend's Python glue and its use by ByteSplatModel, on CPU.

The CUDA extension is replaced by ``raster._torch_impl.TorchOps``, a pure-PyTorch stand-in with the
same entry points and return values (``render_fwd``, ``render_bwd``, ``fused_loss``, ``loss_grad``),
built on the same tile lists and compositing rules, here recording each launch's switches
(tests/helpers/fused_ops_spy.py). Everything else is the real code: ``rasterize_fused``'s projection,
binning and autograd Functions (``_RasterizeFused``, ``_FusedLoss``: gradient scaling, ``absgrad``
publication, the ``RGB+ED`` depth pass), ``fused_render_loss``'s loss assembly, and the model's
fused training step (``get_outputs`` -> ``get_metrics_dict`` -> ``get_loss_dict`` -> backward ->
``step_post_backward``), all checked against the ``reference`` backend, which agrees with gsplat
(tests/raster/test_backends_gpu.py). The kernels themselves are held to the twins in
tests/raster/test_fused_gpu.py (GPU only).
"""

from __future__ import annotations

import math

import pytest
import torch

from bytesplat_ns.errors import BytesplatError
from bytesplat_ns.raster import _wrapper
from bytesplat_ns.raster import fused as F
from bytesplat_ns.raster.options import FusedOptions, FusedRasterConfig
from bytesplat_ns.raster.reference import rasterize_reference
from tests.helpers.fused_ops_spy import RecordingOps
from tests.helpers.model_steps import (
    TRAINED_OVERRIDES,
    anisotropic,
    make_camera,
    make_model,
    model_train_step,
    models_from_same_gaussians,
    seed_cloud,
    step_at_trained_state,
    target_image,
    train_views,
)

TOL = 2e-5  # float32 both sides, different summation orders


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.detach().double(), b.detach().double()
    return (a - b).abs().max().item() / max(b.abs().max().item(), 1e-12)


@pytest.fixture
def torch_ops(monkeypatch):
    """Run fused.py on CPU with the torch stand-in (CPU tensors take the torch projection)."""
    ops = RecordingOps()
    monkeypatch.setattr(_wrapper, "_ops", lambda: ops)
    monkeypatch.setattr(F, "_check", lambda *a, **k: None)
    return ops


# ---------------------------------------------------------------------------------------------
# Scenes
# ---------------------------------------------------------------------------------------------


def make_scene(N=120, C=1, W=48, H=40, seed=0, sh_degree=2):
    g = torch.Generator().manual_seed(seed)
    f = 0.9 * W
    z = 3.0 + 2.0 * torch.rand(N, generator=g)
    x = (torch.rand(N, generator=g) * 2 - 1) * 0.7 * z * W / (2 * f)
    y = (torch.rand(N, generator=g) * 2 - 1) * 0.7 * z * H / (2 * f)
    means = torch.stack([x, y, z], -1)
    quats = torch.randn(N, 4, generator=g)
    scales = torch.exp(torch.randn(N, 3, generator=g) * 0.3 + math.log(0.15))
    opacities = torch.sigmoid(torch.randn(N, generator=g) * 1.5)
    if sh_degree is None:
        colors = torch.rand(N, 3, generator=g)
    else:
        colors = torch.randn(N, 16, 3, generator=g) * 0.2
        colors[:, 0] += 0.4
    viewmats = torch.eye(4).repeat(C, 1, 1)
    for cam in range(1, C):
        viewmats[cam, :3, 3] = torch.randn(3, generator=g) * 0.05
    Ks = torch.tensor([[f, 0, W / 2], [0, f, H / 2], [0, 0, 1.0]]).repeat(C, 1, 1)
    return dict(means=means, quats=quats, scales=scales, opacities=opacities, colors=colors,
                viewmats=viewmats, Ks=Ks, width=W, height=H, sh_degree=sh_degree)


def _params(scene):
    return {k: scene[k].clone().requires_grad_(True) for k in ("means", "quats", "scales", "opacities", "colors")}


def _args(p, scene):
    return (p["means"], p["quats"], p["scales"], p["opacities"], p["colors"], scene["viewmats"], scene["Ks"],
            scene["width"], scene["height"])


# ---------------------------------------------------------------------------------------------
# rasterize_fused (eval / viewer path) and fused_render_loss (training path)
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["RGB", "RGB+ED"])
@pytest.mark.parametrize("use_bg", [False, True])
def test_rasterize_fused_glue_matches_reference(torch_ops, mode, use_bg):
    scene = make_scene(C=2, seed=1)
    C, H, W = 2, scene["height"], scene["width"]
    bg = torch.rand(C, 3, generator=torch.Generator().manual_seed(3)) if use_bg else None
    g = torch.Generator().manual_seed(4)
    D = 4 if mode == "RGB+ED" else 3
    wr, wa = torch.randn(C, H, W, D, generator=g), torch.randn(C, H, W, 1, generator=g)
    outs = {}
    for name, fn in (("fused", F.rasterize_fused), ("reference", rasterize_reference)):
        p = _params(scene)
        render, alpha, info = fn(*_args(p, scene), sh_degree=2, backgrounds=bg, render_mode=mode, absgrad=True)
        info["means2d"].retain_grad()  # as DefaultStrategy.step_pre_backward: after the forward
        ((render * wr).sum() + (alpha * wa).sum()).backward()
        outs[name] = (render, alpha, info, p)
    rf, af, inf, pf = outs["fused"]
    rr, ar, inr, pr = outs["reference"]
    assert rf.shape == rr.shape == (C, H, W, D) and af.shape == ar.shape == (C, H, W, 1)
    assert rel_err(rf[..., :3], rr[..., :3]) <= TOL
    assert rel_err(af, ar) <= TOL
    if mode == "RGB+ED":
        covered = ar[..., 0] > 1e-3
        assert rel_err(rf[..., 3][covered], rr[..., 3][covered]) <= TOL
    assert torch.equal(inf["radii"], inr["radii"])
    for k in pf:
        assert rel_err(pf[k].grad, pr[k].grad) <= 1e-4, k
    assert rel_err(inf["means2d"].grad, inr["means2d"].grad) <= 1e-4
    if mode == "RGB":
        assert rel_err(inf["means2d"].absgrad, inr["means2d"].absgrad) <= 1e-4
    else:
        # gsplat renders RGB+ED as one 4-channel pass, so its absgrad sums |d/dmean2d| of all four
        # channels per pixel; the fused backend renders depth in a second pass and its absgrad
        # counts the RGB pass only (documented). Training with fused never takes this path.
        assert inf["means2d"].absgrad.shape == (C, scene["means"].shape[0], 2)
    assert inf["n_cameras"] == C and inf["width"] == W and inf["height"] == H


def test_rasterize_fused_eval_under_no_grad(torch_ops):
    """Eval/viewer: no_grad, no backgrounds, RGB+ED; rgb composited by the caller as splatfacto does."""
    scene = make_scene(seed=2)
    with torch.no_grad():
        rf, af, _ = F.rasterize_fused(*_args(scene, scene), sh_degree=2, render_mode="RGB+ED", absgrad=True)
        rr, ar, _ = rasterize_reference(*_args(scene, scene), sh_degree=2, render_mode="RGB+ED")
        rf3, af3, _ = F.rasterize_fused(*_args(scene, scene), sh_degree=2, render_mode="RGB")
    assert rel_err(rf[..., :3], rr[..., :3]) <= TOL and rel_err(af, ar) <= TOL
    assert torch.equal(rf[..., :3], rf3) and torch.equal(af, af3)  # depth never changes the RGB part


def _through_every_entry_point(schedules, **switches):
    """rasterize_fused forward + backward, then fused_render_loss forward + backward in each of
    ``schedules``, on one small scene, all with ``FusedOptions(**switches)``; the kernel info of each
    fused_render_loss call."""
    scene = make_scene(N=40, seed=7)
    H, W = scene["height"], scene["width"]
    render, alpha, _ = F.rasterize_fused(*_args(_params(scene), scene), sh_degree=2, options=FusedOptions(**switches))
    (render.sum() + alpha.sum()).backward()
    gt = torch.rand(1, H, W, 3, generator=torch.Generator().manual_seed(8))
    infos = []
    for schedule in schedules:
        loss, _, _, info = F.fused_render_loss(*_args(_params(scene), scene), gt, sh_degree=2,
                                               options=FusedOptions(schedule=schedule, **switches))
        loss.backward()
        infos.append(info["kernel"])
    return infos


@pytest.mark.parametrize("value,expect", [(None, True), ("butterfly", True), ("shuffle", False)])
def test_bwd_reduce_flag_reaches_both_kernels(torch_ops, value, expect):
    """FusedOptions.bwd_reduce (default butterfly) picks the backward warp reduction of both entry
    points: render_bwd (rasterize_fused's backward, and the split schedule's) and fused_loss get
    butterfly=True/False."""
    infos = _through_every_entry_point(("two_launch", "split"), **({} if value is None else {"bwd_reduce": value}))
    assert torch_ops.butterfly == [("render_bwd", expect), ("fused_loss", expect), ("render_bwd", expect)]
    assert [k["bwd_reduce"] for k in infos] == ["butterfly" if expect else "shuffle"] * 2


@pytest.mark.parametrize("switches,mode", [({}, 1), ({"warp_cull": True}, 1), ({"warp_cull_rows": True}, 2),
                                           ({"warp_cull": False}, 0), ({"warp_cull": False, "warp_cull_rows": True}, 0)])
def test_warp_cull_flag_reaches_every_kernel(torch_ops, switches, mode):
    """FusedOptions.warp_cull (default on) and warp_cull_rows (default off) reach every launch of every
    schedule: the forward kernels and the fused kernel test the box (warp_cull); the plain backward tests the
    box too, or with warp_cull_rows reads masks computed once per pass (warp_masks: the rows test); the kernel
    info reports both (the rows only where the plain backward ran: split)."""
    infos = _through_every_entry_point(("one_launch", "split"), **switches)
    assert [(k["warp_cull"], k["warp_cull_rows"]) for k in infos] == [(mode > 0, False), (mode > 0, mode == 2)]
    bwd = "masks" if mode == 2 else mode > 0
    assert torch_ops.warp_cull == [("render_fwd", mode > 0), ("render_bwd", bwd), ("fused_loss", mode > 0),
                                   ("render_fwd", mode > 0), ("render_bwd", bwd)]
    assert torch_ops.masks_rows == ([True] * 2 if mode == 2 else [])


@pytest.mark.parametrize("value,expect", [(None, True), (True, True), (False, False)])
def test_fast_exp_flag_reaches_every_kernel(torch_ops, value, expect):
    """FusedOptions.fast_exp (default on) reaches every launch of every schedule, forward and backward
    alike, and the kernel info reports it."""
    infos = _through_every_entry_point(("one_launch", "split"), **({} if value is None else {"fast_exp": value}))
    assert [k["fast_exp"] for k in infos] == [expect, expect]
    assert torch_ops.fast_exp == [(k, expect) for k in ("render_fwd", "render_bwd", "fused_loss", "render_fwd",
                                                        "render_bwd")]


@pytest.mark.parametrize("value,expect", [(None, 1), (1, 1), (2, 2)])
def test_bwd_pixels_per_thread_reaches_the_plain_backward(torch_ops, value, expect):
    """FusedOptions.bwd_pixels_per_thread (default 1) reaches render_bwd from rasterize_fused and from the
    split schedule; the kernel info reports what the loss's backward ran with (the fused kernel: 1)."""
    infos = _through_every_entry_point(("one_launch", "split"),
                                       **({} if value is None else {"bwd_pixels_per_thread": value}))
    assert torch_ops.bwd_pixels == [expect, expect]
    assert [k["bwd_pixels_per_thread"] for k in infos] == [1, expect]


@pytest.mark.parametrize("value", [None, "raster", "longest_first"])
def test_tile_order_reaches_the_plain_kernels(torch_ops, value):
    """FusedOptions.tile_order (default raster: no order) reaches render_fwd and render_bwd from
    rasterize_fused and from the split schedule: one permutation of the tiles, longest list first,
    the same for a pass's forward and backward (the twin checks it is a permutation)."""
    _through_every_entry_point(("one_launch", "split"), **({} if value is None else {"tile_order": value}))
    entries = [e for e, _ in torch_ops.tile_order]
    assert entries == ["render_fwd", "render_bwd", "render_fwd", "render_bwd"]
    orders = [o for _, o in torch_ops.tile_order]
    if value in (None, "raster"):
        assert all(o is None for o in orders)
        return
    assert all(o is not None and o.dtype == torch.int32 for o in orders)
    assert torch.equal(orders[0], orders[1]) and torch.equal(orders[2], orders[3])


def test_tile_order_longest_first():
    """tiles.tile_order: the tiles by list length, longest first, each packed as tx | ty << 11 | cam << 22
    (what cuda/common.cuh block_tile reads); None for the raster order; an unknown policy is an error."""
    from bytesplat_ns.raster.tiles import tile_order, unpack_tile_order

    # two views of 40x20 pixels in 16-pixel tiles: 3x2 tiles each, lengths below
    lengths = torch.tensor([3, 0, 7, 1, 4, 2, 0, 9, 5, 6, 8, 0])
    offsets = torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)]).to(torch.int32)
    assert tile_order(offsets, "raster", 40, 20) is None
    order = tile_order(offsets, "longest_first", 40, 20)
    assert order.dtype == torch.int32
    assert unpack_tile_order(order, 40, 20).tolist()[:6] == [7, 10, 2, 9, 8, 4]
    # tile 7 is view 1's tile 1: tx 1, ty 0; tile 10 is view 1's tile 4: tx 1, ty 1
    assert order[:2].tolist() == [1 | 0 << 11 | 1 << 22, 1 | 1 << 11 | 1 << 22]
    assert sorted(unpack_tile_order(order, 40, 20).tolist()) == list(range(12))
    with pytest.raises(ValueError, match="longest_first"):
        tile_order(offsets, "shortest_first", 40, 20)


@pytest.mark.parametrize("field,value", [("warp_cull", "off"), ("warp_cull_rows", 1), ("bwd_reduce", "transpose"),
                                         ("schedule", "halo"), ("projection", "cuda"), ("binning", "gsplat"), ("fast_exp", "yes"),
                                         ("bwd_pixels_per_thread", 3), ("bwd_pixels_per_thread", True),
                                         ("tile_order", "random")])
def test_fused_options_reject_unknown_values(field, value):
    """A bad switch given in code is refused when the options are made, before any launch: a user
    error (one line from the command-line hook, bytesplat_ns/cli_errors.py) naming the field."""
    with pytest.raises(ValueError, match=f"fused.{field}") as err:
        FusedOptions(**{field: value})
    assert isinstance(err.value, BytesplatError)


def test_two_pixels_per_thread_needs_the_butterfly_reduction():
    with pytest.raises(BytesplatError, match="bwd_pixels_per_thread 2 needs fused.bwd_reduce butterfly"):
        FusedOptions(bwd_pixels_per_thread=2, bwd_reduce="shuffle")
    assert FusedOptions(bwd_pixels_per_thread=2).bwd_pixels_per_thread == 2


EXPECTED_CALLS = {  # entry points each schedule launches (per fused_render_loss)
    "one_launch": {"fused_loss": 1, "render_fwd": 0, "loss_grad": 0, "render_bwd": 0},
    "two_launch": {"fused_loss": 1, "render_fwd": 0, "loss_grad": 0, "render_bwd": 0},
    "split": {"fused_loss": 0, "render_fwd": 1, "loss_grad": 1, "render_bwd": 1},
}


@pytest.mark.parametrize("mode", F.SCHEDULES)
@pytest.mark.parametrize("absgrad", [False, True])
def test_fused_render_loss_glue_matches_reference(torch_ops, absgrad, mode):
    from bytesplat_ns.raster.fused import splatfacto_loss_torch

    scene = make_scene(seed=5)
    H, W = scene["height"], scene["width"]
    g = torch.Generator().manual_seed(6)
    gt = torch.rand(1, H, W, 3, generator=g)
    bg = torch.rand(1, 3, generator=g)
    scale = 2.5
    pf = _params(scene)
    loss_f, rgb_f, alpha_f, inf = F.fused_render_loss(*_args(pf, scene), gt, bg, sh_degree=2, absgrad=absgrad,
                                                      options=FusedOptions(schedule=mode))
    inf["means2d"].retain_grad()
    (scale * loss_f).backward()
    pr = _params(scene)
    render_r, alpha_r, inr = rasterize_reference(*_args(pr, scene), sh_degree=2, backgrounds=bg, absgrad=absgrad)
    inr["means2d"].retain_grad()
    loss_r = splatfacto_loss_torch(render_r, alpha_r, gt, bg)
    (scale * loss_r).backward()
    assert abs(loss_f.item() - loss_r.item()) <= 1e-5 * loss_r.item()
    assert rel_err(rgb_f, render_r.clamp(0, 1)) <= TOL and rel_err(alpha_f, alpha_r) <= TOL
    for k in pf:
        assert rel_err(pf[k].grad, pr[k].grad) <= 1e-4, k
    assert rel_err(inf["means2d"].grad, inr["means2d"].grad) <= 1e-4
    if absgrad:
        # both scaled by the incoming gradient (the reference's hooks see the scaled gradient)
        assert rel_err(inf["means2d"].absgrad, inr["means2d"].absgrad) <= 1e-4
    assert torch_ops.calls == EXPECTED_CALLS[mode]
    assert inf["kernel"]["schedule"] == mode and inf["kernel"]["two_phase"] == (mode == "two_launch")
    assert not rgb_f.requires_grad and not alpha_f.requires_grad
    assert abs(inf["l1"].item() - torch.abs(gt - render_r.clamp(0, 1)).mean().item()) <= 1e-6


def test_split_schedule_runs_its_backward_launch_in_backward_scaled_by_the_incoming_gradient(torch_ops):
    """The split schedule launches render_bwd from backward(), with the loss's incoming gradient as the scale
    of dL/d render (no pass over the gradients), so forward alone launches no backward; a second backward
    through a retained graph gives the same gradients again, scaled by its own incoming gradient."""
    scene = make_scene(N=60, seed=3)
    gt = torch.rand(1, scene["height"], scene["width"], 3, generator=torch.Generator().manual_seed(4))
    p = _params(scene)
    loss, _, _, info = F.fused_render_loss(*_args(p, scene), gt, sh_degree=2, absgrad=True,
                                           options=FusedOptions(schedule="split"))
    assert torch_ops.calls["render_bwd"] == 0 and torch_ops.calls["loss_grad"] == 1
    info["means2d"].retain_grad()
    (3.0 * loss).backward(retain_graph=True)
    assert torch_ops.calls["render_bwd"] == 1 and torch_ops.v_scale[0].item() == 3.0
    first = {k: v.grad.clone() for k, v in p.items()}
    absgrad = info["means2d"].absgrad.clone()
    for v in p.values():
        v.grad = None
    (-1.5 * loss).backward()
    assert torch_ops.calls["render_bwd"] == 2 and torch_ops.v_scale[1].item() == -1.5
    for k, v in p.items():
        assert torch.allclose(v.grad, -0.5 * first[k], rtol=1e-5, atol=1e-12), k
    assert torch.allclose(info["means2d"].absgrad, 0.5 * absgrad, rtol=1e-5, atol=1e-12)  # |g| in the sums


@pytest.mark.parametrize("mode", F.SCHEDULES)
def test_fused_render_loss_contribution_glue(torch_ops, mode):
    """fused_render_loss(contribution=True): the flag reaches the schedule's backward entry point
    (fused_loss; render_fwd's stop indices -> render_bwd for split), info["contribution"] is [C,N]
    and, from the stand-in's tile-list walk (what the kernels do), equals the pruning module's
    definition (contribution_scores_2d, the reference rasterizer's binning) on a multi-view scene
    with hidden Gaussians; loss and gradients do not change. Off (the default): no key, flag False.
    The stop rule's scene is tests/helpers/contribution_scenes.py (test_pruning.py, test_fused_gpu.py)."""
    from bytesplat_ns.pruning import contribution_scores_2d, scores_from_info

    scene = make_scene(N=160, C=3, W=45, H=38, seed=9)
    scene["scales"] = scene["scales"] * 4  # overlapping, mostly opaque: some Gaussians are hidden entirely
    scene["opacities"] = 0.6 + 0.39 * torch.rand(160, generator=torch.Generator().manual_seed(1))
    C, H, W = 3, scene["height"], scene["width"]
    gt = torch.rand(C, H, W, 3, generator=torch.Generator().manual_seed(8))
    runs = {}
    for contribution in (False, True):
        torch_ops.contribution.clear()
        p = _params(scene)
        loss, _, _, info = F.fused_render_loss(*_args(p, scene), gt, sh_degree=2, options=FusedOptions(schedule=mode),
                                               contribution=contribution)
        loss.backward()
        entry = "render_bwd" if mode == "split" else "fused_loss"
        assert torch_ops.contribution == [(entry, contribution)]
        assert info["kernel"]["contribution"] == contribution
        runs[contribution] = (loss.item(), {k: v.grad for k, v in p.items()}, info)
    assert "contribution" not in runs[False][2]
    assert runs[False][0] == runs[True][0]
    for k, g in runs[False][1].items():
        assert torch.equal(g, runs[True][1][k]), k
    info = runs[True][2]
    got = info["contribution"]
    N = scene["means"].shape[0]
    assert got.shape == (C, N) and got.dtype == torch.float32 and not got.requires_grad
    want = contribution_scores_2d(info["means2d"], info["conics"], info["opacities"], info["radii"], info["depths"],
                                  W, H)
    assert (got - want).abs().max().item() <= 2e-6
    assert int((want > 0.1).sum()) >= 20 and int(((want == 0) & (info["radii"] > 0)).sum()) >= 5
    # the pruner reads it instead of the torch pass
    assert torch.equal(scores_from_info(info), got.amax(0))


@pytest.mark.parametrize("schedule", [None, "split", "one_launch", "two_launch"])
def test_schedule_option_picks_the_schedule(torch_ops, schedule):
    """FusedOptions.schedule picks fused_render_loss's schedule (default: split, the measured fastest)."""
    assert F.DEFAULT_OPTIONS.schedule == "split" and FusedRasterConfig().options() == F.DEFAULT_OPTIONS
    scene = make_scene(N=40, seed=7)
    gt = torch.rand(1, scene["height"], scene["width"], 3, generator=torch.Generator().manual_seed(8))
    options = FusedOptions() if schedule is None else FusedOptions(schedule=schedule)
    loss, _, _, info = F.fused_render_loss(*_args(_params(scene), scene), gt, sh_degree=2, options=options)
    loss.backward()  # the split schedule's backward launch runs there
    assert info["kernel"]["schedule"] == (schedule or "split")
    assert torch_ops.calls == EXPECTED_CALLS[schedule or "split"]


# ---------------------------------------------------------------------------------------------
# ByteSplatModel: one training step through the fused path vs the reference backend
# ---------------------------------------------------------------------------------------------


def compare_steps(a, b, grad_tol, state_tol):
    assert abs(a["loss"] - b["loss"]) <= 1e-5 * abs(b["loss"]) + 1e-7, (a["loss"], b["loss"])
    assert rel_err(a["rgb"], b["rgb"]) <= 1e-4
    for n in a["grads"]:
        assert rel_err(a["grads"][n], b["grads"][n]) <= grad_tol, f"grad {n}: {rel_err(a['grads'][n], b['grads'][n]):.3g}"
        # Adam's first step is lr*sign(g) wherever g != 0: equal updates need equal signs
        big = b["grads"][n].abs() > 1e-3 * b["grads"][n].abs().max()
        assert torch.allclose(a["update"][n][big], b["update"][n][big], rtol=1e-3, atol=1e-7), n
    for k in ("grad2d", "count", "radii"):
        assert k in a["state"] and k in b["state"], k
        assert rel_err(a["state"][k], b["state"][k]) <= state_tol, f"strategy state {k}: {rel_err(a['state'][k], b['state'][k]):.3g}"


@pytest.mark.parametrize("absgrad,mode", [(True, None), (False, None), (True, "two_launch")])
def test_model_fused_training_step_matches_reference(torch_ops, absgrad, mode):
    """One Trainer iteration through ByteSplatModel's fused path (fused_pending -> _run_fused_step
    -> _FusedLoss -> DefaultStrategy) against the same iteration with the reference backend
    (``mode``: the model's ``fused.schedule``, None: the default)."""
    seed_points = seed_cloud()
    image, bg = target_image(), torch.tensor([0.3, 0.6, 0.2])
    fused = FusedRasterConfig() if mode is None else FusedRasterConfig(schedule=mode)
    runs = {name: model_train_step(model, make_camera(), image, step=5, background=bg)
            for name, model in models_from_same_gaussians(seed_points, use_absgrad=absgrad, fused=fused).items()}
    assert torch_ops.calls == EXPECTED_CALLS[mode or F.DEFAULT_OPTIONS.schedule]
    assert int((runs["reference"]["state"]["count"] > 0).sum()) > 50  # many Gaussians seen
    compare_steps(runs["fused"], runs["reference"], grad_tol=1e-4, state_tol=1e-4)


def test_model_fused_step_matches_reference_after_densification(torch_ops):
    """The same comparison from a state reached by training (split/duplicated Gaussians, running
    grad2d/count/radii statistics): the fused step must continue them exactly as the reference."""
    runs = step_at_trained_state("cpu", "reference", ["fused", "reference"], force_backend={"fused": "fused"})
    # one fused step, through the default schedule's kernels
    assert torch_ops.calls["loss_grad"] + torch_ops.calls["fused_loss"] == 1
    compare_steps(runs["fused"], runs["reference"], grad_tol=1e-4, state_tol=1e-4)


def test_model_fused_eval_outputs_match_reference(torch_ops):
    """Eval (not training): get_outputs renders RGB+ED through rasterize_fused; rgb, accumulation,
    depth and background must equal the reference backend's."""
    seed_points = seed_cloud()
    outs = {}
    for name, model in models_from_same_gaussians(seed_points).items():
        model.eval()
        model.step = 7
        outs[name] = model.get_outputs_for_camera(make_camera())
    f, r = outs["fused"], outs["reference"]
    assert rel_err(f["rgb"], r["rgb"]) <= TOL
    assert rel_err(f["accumulation"], r["accumulation"]) <= TOL
    covered = r["accumulation"][..., 0] > 1e-3
    assert rel_err(f["depth"][..., 0][covered], r["depth"][..., 0][covered]) <= TOL
    assert torch.equal(f["background"], r["background"])
    assert float(f["rgb"].min()) >= 0.0 and float(f["rgb"].max()) <= 1.0


def test_model_fused_check_diagnostic(torch_ops):
    """fused.check_every=N: every N steps the model logs the fused step's errors against the
    unfused path on the same inputs, without changing the step itself."""
    seed_points = seed_cloud()
    image, bg = target_image(), torch.tensor([0.3, 0.6, 0.2])
    runs, params = {}, None
    for name in ("fused", "reference"):
        model = make_model("reference", seed_points, fused=FusedRasterConfig(check_every=5))
        if name == "fused":
            model._backend = "fused"
        params = params or anisotropic(model)
        for n, p in params.items():
            model.gauss_params[n].data.copy_(p)
        runs[name] = model_train_step(model, make_camera(), image, step=5, background=bg)
        if name == "fused":
            log = model.fused_check_log
    assert len(log) == 1 and log[0]["step"] == 5.0 and log[0]["radii_equal"] == 1.0
    for key in ("loss", "means2d_grad", "means2d_absgrad", "grad2d_stat", "grad_means", "grad_opacities"):
        assert log[0][key] <= 1e-4, (key, log[0][key])
    compare_steps(runs["fused"], runs["reference"], grad_tol=1e-4, state_tol=1e-4)


def test_model_fused_steps_across_resolution_change(torch_ops):
    """splatfacto's coarse-to-fine schedule: the fused path at half resolution (downscaled gt and
    camera), then at full resolution, then half again (nothing sized is kept between steps)."""
    seed_points = seed_cloud()
    image, bg = target_image(), torch.tensor([0.3, 0.6, 0.2])
    models, params = {}, None
    for name in ("fused", "reference"):
        model = make_model("reference", seed_points, num_downscales=1, resolution_schedule=10)
        if name == "fused":
            model._backend = "fused"
        params = params or anisotropic(model)
        for n, p in params.items():
            model.gauss_params[n].data.copy_(p)
        models[name] = model
    for step in (3, 12, 5):  # 32x24, 64x48, 32x24
        runs = {name: model_train_step(m, make_camera(), image, step=step, background=bg) for name, m in models.items()}
        assert runs["fused"]["rgb"].shape == ((24, 32, 3) if step < 10 else (48, 64, 3))
        compare_steps(runs["fused"], runs["reference"], grad_tol=1e-4, state_tol=1e-4)


# ---------------------------------------------------------------------------------------------
# Sharded training: the fused compositor scores each owned view inside the fused kernel
# ---------------------------------------------------------------------------------------------


def test_tile_intersections_count_what_the_binning_lists():
    """``tile_intersections`` (what a sender tells a renderer) is each camera's share of the
    binning's pairs; the binning given that total lists the same, and a wrong total is caught."""
    g = torch.Generator().manual_seed(5)
    C, N, W, H = 3, 400, 70, 45
    m = torch.rand(C, N, 2, generator=g) * torch.tensor([1.6 * W, 1.6 * H]) - torch.tensor([0.3 * W, 0.3 * H])
    r = torch.randint(0, 30, (C, N), generator=g, dtype=torch.int32)
    d = torch.rand(C, N, generator=g)
    per_cam = F.tile_intersections(m, r, W, H)
    offsets, ids = F.bin_tiles_torch(m, r, d, W, H)
    tiles = math.ceil(W / 16) * math.ceil(H / 16)
    assert per_cam.dtype == torch.int64 and per_cam.shape == (C,) and (per_cam > 0).all()
    assert per_cam.tolist() == [int(offsets[(c + 1) * tiles] - offsets[c * tiles]) for c in range(C)]
    known = F.bin_tiles(m, r, d, W, H, known_total=int(per_cam.sum()))
    assert torch.equal(known[0], offsets) and torch.equal(known[1], ids)
    with pytest.raises(AssertionError, match="tile intersections"):
        F.bin_tiles(m, r, d, W, H, known_total=int(per_cam.sum()) + 1)


def _sharded_step_both_compositors(monkeypatch, communicator: str, loss_fn=None, options=F.DEFAULT_OPTIONS):
    """The whole sharded step in one process (torch projection, exchange to itself, compositing +
    splatfacto loss, backward, absgrad routed back) with the reference and the fused compositor.
    Asserts the fused one gives the reference's loss, parameter gradients, densification statistic
    and renders; returns (renders, the binning totals the senders told the fused call(s))."""
    from bytesplat_ns.distributed import make_communicator, sharded_render_loss
    from bytesplat_ns.distributed.step import splatfacto_loss
    from tests.helpers import distributed_worker as W

    told = []  # the binning's size as the sender told it (bin_tiles_torch asserts it is right)
    binning = F.bin_tiles_torch
    monkeypatch.setattr(F, "bin_tiles_torch", lambda *a, **k: told.append(a[6]) or binning(*a, **k))
    out = {}
    for compositor in ("reference", "fused"):
        params = {k: torch.nn.Parameter(v.clone()) for k, v in W.make_gaussians(W.N_GAUSSIANS, W.SEED).items()}
        fwd = sharded_render_loss(params, W.make_views(), make_communicator(communicator), W.SH_DEGREE,
                                  loss_fn or splatfacto_loss, absgrad=True, compositor=compositor, options=options)
        fwd.local_loss.backward()
        out[compositor] = (fwd.local_loss.item(), {k: p.grad.clone() for k, p in params.items()},
                           fwd.info["means2d"].absgrad.clone(), fwd.renders)
    (l_ref, g_ref, a_ref, r_ref), (l_f, g_f, a_f, r_f) = out["reference"], out["fused"]
    assert len(r_f) == len(r_ref) > 1
    assert abs(l_ref - l_f) <= 1e-5 * abs(l_ref)
    for k in g_ref:
        assert rel_err(g_f[k], g_ref[k]) <= 1e-4, k
    assert rel_err(a_f, a_ref) <= 1e-4
    for v in r_ref:
        assert (r_f[v] - r_ref[v]).abs().max().item() <= 1e-5
    return r_f, told


@pytest.mark.parametrize("mode", [None, "split"])
def test_sharded_step_fused_loss_glue_matches_reference(torch_ops, monkeypatch, mode):
    """One process, the whole sharded step (sparse-grad backward): the fused compositor (the rank's
    views padded, binned together and scored in ONE _FusedLoss call, here on the stand-in) gives
    the reference compositor's loss, parameter gradients, densification statistic and renders."""
    import functools

    from bytesplat_ns.distributed.step import splatfacto_lambda, splatfacto_loss

    # what the pipeline passes (its model's ssim_lambda): recognised; any other loss is not
    loss_fn = functools.partial(splatfacto_loss, ssim_lambda=0.3)
    assert splatfacto_lambda(loss_fn) == 0.3 and splatfacto_lambda(splatfacto_loss) == 0.2
    assert splatfacto_lambda(lambda p, g: splatfacto_loss(p, g, 0.3)) is None
    options = F.DEFAULT_OPTIONS if mode is None else FusedOptions(schedule=mode)
    _, told = _sharded_step_both_compositors(monkeypatch, "sparse-grad", loss_fn, options)
    assert len(told) == 1 and told[0] > 0  # one binning for all the views, its size known up front
    if options.schedule == "split":  # one launch of each kernel for all the views
        assert torch_ops.calls["loss_grad"] == torch_ops.calls["render_fwd"] == 1
        assert torch_ops.calls["fused_loss"] == 0
    else:
        assert torch_ops.calls["fused_loss"] == 1 and torch_ops.calls["render_fwd"] == 0


def test_sharded_step_scores_views_in_groups_under_a_binning_budget(torch_ops, monkeypatch):
    """With a budget of tile intersections per fused call (on the GPU, a share of its memory), a
    rank's views are scored in consecutive groups that fit it, one binning each; the step gives
    the reference compositor's loss, gradients, absgrad and renders as with one call."""
    from bytesplat_ns.distributed import step as S
    from bytesplat_ns.raster.fused import tile_intersections, tile_radii
    from tests.helpers import distributed_worker as W

    views = W.make_views()
    options = FusedOptions(schedule="split")
    proj = S.project_shard(W.make_gaussians(W.N_GAUSSIANS, W.SEED), views, W.SH_DEGREE)
    reach = tile_radii(proj.radii, proj.conics, proj.opacities, options)  # what the step bins with
    per_view = tile_intersections(proj.means2d, reach, views.width, views.height).tolist()
    monkeypatch.setattr(S, "joint_binning_budget", lambda device: 2 * max(per_view))  # about two views per call
    _, told = _sharded_step_both_compositors(monkeypatch, "dense", options=options)
    groups = S._view_groups(per_view, len(per_view), torch.device("cuda"))  # the budget is patched
    assert 1 < len(groups) < len(per_view) and [j for g in groups for j in g] == list(range(len(per_view)))
    assert told == [sum(per_view[j] for j in g) for g in groups]  # one binning per group, its size known
    assert torch_ops.calls["loss_grad"] == len(groups)


@pytest.mark.parametrize("group", [[0, 1, 2], [1, 2]])
def test_padded_view_fields_from_several_sources(group):
    """``padded_view_fields``: a rank's views built straight from three sources' record tables (some
    spans empty, one source sending nothing) equal the per-view cats padded with zeros, forward and gradients
    (also for a group holding part of the sources' rows); radii pad with 0; global-id order is
    asserted off the GPU."""
    from bytesplat_ns.distributed.step import padded_view_fields

    g = torch.Generator().manual_seed(3)
    D, F = 3, 10
    counts = [[4, 0, 3], [2, 5, 0], [0, 0, 0]]  # [source][view]
    tables = [torch.randn(sum(c), F, generator=g, dtype=torch.float64).requires_grad_(True) for c in counts]
    radii = [torch.randint(1, 9, (sum(c),), generator=g, dtype=torch.int32) for c in counts]
    gids = [torch.arange(sum(c), dtype=torch.int32) + 100 * s for s, c in enumerate(counts)]
    spans, starts = [], [0, 0, 0]
    for j in range(3):
        spans.append([(s, starts[s], counts[s][j]) for s in range(3)])
        starts = [a + counts[s][j] for s, a in enumerate(starts)]
    picked = [spans[j] for j in group]
    (m, con, col, op, dep, rad), rows = padded_view_fields(tables, radii, gids, picked, D)
    M = max(rows)
    assert rows == [sum(c for _, _, c in sp) for sp in picked] and m.shape == (len(group), M, 2)
    assert not dep.requires_grad and con.shape == (len(group), M, 3) and rad.dtype == torch.int32
    want = []
    for sp in picked:
        rec = torch.cat([tables[s][a : a + c] for s, a, c in sp])
        want.append(torch.cat([rec, rec.new_zeros(M - rec.shape[0], F)]))
    want = torch.stack(want)
    for got, cols in ((m, slice(0, 2)), (con, slice(2, 5)), (col, slice(5, 8))):
        assert torch.equal(got, want[..., cols])
    assert torch.equal(op, want[..., 8]) and torch.equal(dep, want[..., 9])
    want_r = torch.stack([torch.cat([torch.cat([radii[s][a : a + c] for s, a, c in sp]),
                                     torch.zeros(M - r, dtype=torch.int32)]) for sp, r in zip(picked, rows)])
    assert torch.equal(rad, want_r)
    w = [torch.randn(t.shape, generator=g, dtype=torch.float64) for t in (m, con, col, op)]
    got_grads = torch.autograd.grad(sum((t * x).sum() for t, x in zip((m, con, col, op), w)), tables, allow_unused=True)
    ref = sum((want[..., c] * x).sum() for c, x in zip((slice(0, 2), slice(2, 5), slice(5, 8), 8), w))
    ref_grads = torch.autograd.grad(ref, tables, allow_unused=True)
    for a, b, t in zip(got_grads, ref_grads, tables):
        a = torch.zeros_like(t) if a is None else a
        b = torch.zeros_like(t) if b is None else b
        assert torch.allclose(a, b) and a.shape == t.shape
    gids[0] = gids[0].flip(0)  # out of order: caught
    with pytest.raises(AssertionError, match="global-id order"):
        padded_view_fields(tables, radii, gids, spans, D)


def test_views_scored_in_one_call_equal_each_view_alone(torch_ops):
    """composite_views_fused_loss's padding, joint binning, loss sum and absgrad routing on the
    kernels' stand-in (tests/helpers/sharded_records.py; tests/distributed/test_distributed_gpu.py runs it on the kernels)."""
    from tests.helpers.sharded_records import views_scored_in_one_call_vs_each_alone

    views_scored_in_one_call_vs_each_alone("cpu")
    assert torch_ops.calls["loss_grad"] + torch_ops.calls["fused_loss"] == 1


def test_model_fused_backend_with_a_mask_or_a_tiny_image_trains_like_reference(torch_ops):
    """The fused loss has no mask term and needs 11x11 pixels for SSIM. A batch with a mask is
    rendered through the same kernels (rasterize_fused) and scored by splatfacto's masked loss; an
    image smaller than the SSIM window skips the fused loss. Both equal the reference backend."""
    seed_points = seed_cloud()
    bg = torch.tensor([0.3, 0.6, 0.2])
    for W, H, masked in ((64, 48, True), (10, 8, False)):
        image = target_image(W=W, H=H)
        mask = torch.ones(H, W, 1, dtype=torch.bool)
        mask[: H // 2] = False
        runs = {}
        for name, model in models_from_same_gaussians(seed_points).items():
            torch_ops.calls.update({k: 0 for k in torch_ops.calls})
            model.train()
            model.step_cb(type("O", (), {"optimizers": {}})(), 5)
            model._get_background_color = lambda: bg.clone()
            outputs = model(make_camera(W, H))
            batch = {"image": image, **({"mask": mask} if masked else {})}
            metrics = model.get_metrics_dict(outputs, batch)
            losses = model.get_loss_dict(outputs, batch, metrics)
            sum(losses.values()).backward()
            runs[name] = (float(losses["main_loss"]), {n: p.grad.clone() for n, p in model.gauss_params.items()})
            if name == "fused":  # the plain kernels ran, not the fused loss
                assert torch_ops.calls["fused_loss"] == 0 and torch_ops.calls["render_fwd"] == 1
                assert torch_ops.calls["render_bwd"] == 1
        (lf, gf), (lr, gr) = runs["fused"], runs["reference"]
        assert abs(lf - lr) <= 1e-5 * abs(lr), (W, H, lf, lr)
        for n in gr:
            assert rel_err(gf[n], gr[n]) <= 1e-4, (W, H, n)


@pytest.mark.parametrize("mode,entry", [("two_launch", "fused_loss"), ("split", "render_bwd")])
def test_model_fused_step_gathers_the_pruning_score(torch_ops, monkeypatch, mode, entry):
    """hw-prune on with the fused backend: the training steps that feed the pruning score ask the
    fused kernel for it (contribution=True only there; ``entry``: the schedule's backward), and the
    pruner takes info["contribution"] instead of running the torch pass (which this test forbids);
    the score it keeps is the definition's. Prunes right after gsplat's refine step."""
    from bytesplat_ns import pruning
    from bytesplat_ns.model import GAUSSIAN_PARAM_NAMES

    definition = pruning.contribution_scores_2d

    def forbidden(*a, **k):
        raise AssertionError("the torch scoring pass ran although the fused kernel gathered the score")

    monkeypatch.setattr(pruning, "contribution_scores_2d", forbidden)
    seed_points = seed_cloud()
    views = train_views()
    images = [target_image(seed=10 + i) for i in range(len(views))]
    model = make_model("reference", seed_points, hw_prune="on", hw_prune_capacity=40, hw_prune_window=3,
                       hw_prune_every_refines=2, fused=FusedRasterConfig(schedule=mode), **TRAINED_OVERRIDES)
    model._backend = "fused"
    optimizers = {n: torch.optim.Adam([model.gauss_params[n]], lr=1e-2, eps=1e-15) for n in GAUSSIAN_PARAM_NAMES}
    bg = torch.tensor([0.3, 0.6, 0.2])
    pruner = None
    for step in range(0, 12):  # step 0 is before the score window of the first prune step (1-10)
        torch_ops.contribution.clear()
        model_train_step(model, views[step % 4], images[step % 4], step, bg, optimizers)
        pruner = model.pruning
        assert torch_ops.contribution == [(entry, pruner.scores_step(step))], step
        if pruner.scores_step(step) and step % pruner.period != 0:
            info = model.info
            want = definition(info["means2d"], info["conics"], info["opacities"], info["radii"], info["depths"],
                              int(info["width"]), int(info["height"]))
            assert (info["contribution"] - want).abs().max().item() <= 2e-6
            assert bool((model.strategy_state[pruning.SCORE_KEY][:, 0] >= info["contribution"].amax(0)).all())
    # refine_every 5, every 2nd refine: period 10; gsplat refines at 10 (> warmup 4, outside its pause)
    assert pruner.period == 10 and pruner.first_score == 1 and not pruner.scores_step(0)
    assert [s["step"] for s in pruner.history] == [10]
    assert pruner.history[0]["tiles"] > 0 and pruner.history[0]["removed"] > 0
