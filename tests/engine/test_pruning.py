"""Hardware-aware pruning (bytesplat_ns/pruning.py, issue 4).

CPU: capacity arithmetic (and the kernel layout read from the CUDA sources), the alpha*T score
against an explicit float64 per-pixel walk (and a scene where the stop rule decides scores), that
removing zero-score Gaussians leaves the reference render unchanged, the selection rules, removal
keeping parameters / optimizer state / strategy state consistent, tile lists carried through
gsplat's refine step, the score window, and the hook right after gsplat's refine steps (standalone
and through the model). GPU (skipped without CUDA): capacity read from the device; a pruned model
renders the same through the fused and the reference backends. The score gathered by the fused
kernels is tested in tests/raster/test_fused_gpu.py (GPU) and tests/raster/test_fused_cpu_logic.py (glue, CPU).
"""

from __future__ import annotations

import math

import pytest
import torch

from bytesplat_ns import pruning
from bytesplat_ns.pruning import (
    HardwarePruner,
    HWPruneSettings,
    apply_prune,
    contribution_scores,
    contribution_scores_2d,
    select_prune_mask,
    tile_capacity,
    tile_entries,
)
from bytesplat_ns.raster.projection import project_gaussians
from bytesplat_ns.raster.reference import rasterize_reference
from tests.helpers.pruning_checks import check_state_consistent, explicit_scores
from tests.helpers.raster_scenes import make_scene


# H200 (compute capability 9.0): cudaDevAttrMaxSharedMemoryPerBlockOptin, ...PerMultiprocessor,
# ReservedSharedMemoryPerBlock.
H200_SMEM = (232448, 233472, 1024)


# ----------------------------------------------------------------------------------------------
# (a) capacity
# ----------------------------------------------------------------------------------------------


def test_kernel_layout_constant():
    layout = pruning.FUSED_SMEM_LAYOUT
    # common.cuh documents the record as 44 bytes (float4 + float4 + float + int32 + the uint32 warp mask)
    assert layout.bytes_per_gaussian == 44
    assert layout.granularity == 32
    # SSIM scratch + gradient (and pruning score) accumulators + reduction scratch, in floats:
    # (2*36*36 + 36*26*5 + 26*26*3) + 32 * (11 + 1) + 3 * 8
    assert layout.fixed_bytes == (9300 + 32 * 12 + 24) * 4 == 38832
    assert pruning.fused_blocks_per_sm() == 2


def test_capacity_arithmetic():
    lay = dict(bytes_per_gaussian=44, fixed_bytes=38832, granularity=32)  # the kernel's layout (above)
    # H200, 2 blocks per SM: min(232448, 233472/2 - 1024) = 115712; (115712-38832)/44 = 1747 -> 1728
    assert tile_capacity(*H200_SMEM, blocks_per_sm=2, **lay) == 1728
    # 1 block per SM: the opt-in limit binds: (232448-38832)/44 = 4400 -> 4384
    assert tile_capacity(*H200_SMEM, blocks_per_sm=1, **lay) == 4384
    # the pruning score's 128 bytes of accumulators (38704 -> 38832) cost no capacity on an H200
    assert tile_capacity(*H200_SMEM, blocks_per_sm=2, **{**lay, "fixed_bytes": 38704}) == 1728
    # before the per-warp culling mask (40 bytes per Gaussian): 1920 and 4832
    assert tile_capacity(*H200_SMEM, blocks_per_sm=2, **{**lay, "bytes_per_gaussian": 40}) == 1920
    assert tile_capacity(*H200_SMEM, blocks_per_sm=1, **{**lay, "bytes_per_gaussian": 40}) == 4832
    # a 48 KiB-per-block device (no opt-in above 48K), 64 KiB per SM, 1 block
    assert tile_capacity(49152, 65536, 0, 1, **lay) == (49152 - 38832) // 44 // 32 * 32 == 224
    # bytes per Gaussian and fixed bytes enter as stated
    assert tile_capacity(100_000, 200_000, 0, 1, bytes_per_gaussian=10, fixed_bytes=0, granularity=1) == 10_000
    assert tile_capacity(100_000, 200_000, 0, 1, bytes_per_gaussian=64, fixed_bytes=36_000, granularity=32) == 992
    # the default layout is the kernel's
    assert tile_capacity(*H200_SMEM, blocks_per_sm=2) == tile_capacity(
        *H200_SMEM, blocks_per_sm=2, **pruning.FUSED_SMEM_LAYOUT.__dict__)
    with pytest.raises(ValueError, match="too little shared memory"):
        tile_capacity(40_000, 80_000, 0, 1, **lay)  # (40000-38832)/44 = 26 < 32


@pytest.mark.gpu
@pytest.mark.gpu
def test_capacity_read_from_device():
    from bytesplat_ns.raster._build import load_extension

    ext = load_extension()
    # the extension's own layout is the constant the CPU (and a failed build) plans with
    assert pruning.SmemLayout(*[int(v) for v in ext.fused_smem_layout()]) == pruning.FUSED_SMEM_LAYOUT
    props = torch.cuda.get_device_properties(0)
    for bps in (1, 2):
        cap = pruning.device_tile_capacity(blocks_per_sm=bps)
        assert cap == ext.fused_capacity(bps)
        reserved = 1024 if props.major >= 8 else 0
        assert cap == tile_capacity(props.shared_memory_per_block_optin, props.shared_memory_per_multiprocessor,
                                    reserved, bps)
    assert pruning.device_tile_capacity() == ext.fused_capacity(pruning.fused_blocks_per_sm())


# ----------------------------------------------------------------------------------------------
# (b) score
# ----------------------------------------------------------------------------------------------


def _scene(seed=8, N=200, W=45, H=37, C=2, opacity_range=(0.8, 0.99), scale_range=(0.1, 0.6)):
    return make_scene(seed, N=N, W=W, H=H, C=C, opacity_range=opacity_range, scale_range=scale_range)


def _project(sc, dtype):
    pr = project_gaussians(sc["means"].to(dtype), sc["quats"].to(dtype), sc["scales"].to(dtype),
                           sc["viewmats"].to(dtype), sc["Ks"].to(dtype), sc["W"], sc["H"])
    C = sc["viewmats"].shape[0]
    return pr, sc["opacities"].to(dtype).expand(C, -1)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_score_equals_explicit_max_alpha_T(dtype):
    sc = _scene()
    pr, opac = _project(sc, dtype)
    got = contribution_scores_2d(pr.means2d, pr.conics, opac, pr.radii, pr.depths, sc["W"], sc["H"])
    want, stopped = explicit_scores(pr.means2d, pr.conics, opac, pr.radii, pr.depths, sc["W"], sc["H"])
    assert stopped, "the scene must exercise the stop rule"
    assert got.shape == want.shape
    tol = 1e-12 if dtype == torch.float64 else 2e-6
    assert (got.double() - want).abs().max().item() <= tol
    # the score separates: visible Gaussians with zero score (occluded / behind saturated pixels)
    # and positive ones
    vis = pr.radii > 0
    assert int(((want == 0) & vis).sum()) >= 5 and int((want > 0.1).sum()) >= 20
    # and the 3D convenience wrapper agrees
    assert torch.equal(contribution_scores(sc["means"].to(dtype), sc["quats"].to(dtype), sc["scales"].to(dtype),
                                           sc["opacities"].to(dtype), sc["viewmats"].to(dtype), sc["Ks"].to(dtype),
                                           sc["W"], sc["H"]), got)


def test_stop_rule_decides_scores_in_the_stop_scene():
    """tests/helpers/contribution_scenes.py (also the GPU test's scene for the kernels' stop rule): the
    small Gaussians behind the walls score the weight they would have had at the pixels they stop
    (~2.7e-4), about three times what they get where they are composited; the definition equals the
    explicit walk there, and some Gaussians are hidden entirely (score 0)."""
    from tests.helpers.contribution_scenes import stop_scene_2d

    sc = stop_scene_2d(C=1, clutter=100, crowd=400)  # the GPU test of the kernels has 2 views, 300 clutter
    args = (sc["means2d"], sc["conics"], sc["opacities"], sc["radii"], sc["depths"], sc["width"], sc["height"])
    got = contribution_scores_2d(*args)
    want, stopped = explicit_scores(*args)
    no_stop, _ = explicit_scores(*args, count_stop=False)
    assert stopped and (got.double() - want).abs().max().item() <= 2e-6
    back = sc["back"]
    assert bool((want.gather(1, back) > 2.0e-4).all()) and bool((want.gather(1, back) < 3.0e-4).all())
    assert bool((no_stop.gather(1, back) < 0.5 * want.gather(1, back)).all())
    assert int(((want == 0) & (sc["radii"] > 0)).sum()) > 0


def test_score_ignores_pixels_outside_the_image():
    # one Gaussian just beyond the right edge whose 3-sigma box still reaches the last tile: the
    # blocks of that tile extend past the image, but no pixel inside it is reached
    W, H = 20, 16
    means2d = torch.tensor([[[21.5, 8.0]]])
    conics = torch.tensor([[[4.0, 0.0, 4.0]]])  # sigma = 2 dx^2: alpha(dx=1) = o e^-2
    got = contribution_scores_2d(means2d, conics, torch.tensor([[0.9]]), torch.tensor([[3]]),
                                 torch.tensor([[1.0]]), W, H)
    want, _ = explicit_scores(means2d, conics, torch.tensor([[0.9]]), torch.tensor([[3]]), torch.tensor([[1.0]]), W, H)
    assert torch.allclose(got.double(), want, atol=1e-7)
    assert want[0, 0] < 0.9 * math.exp(-2 * 1.5**2) + 1e-9  # nearest pixel center is 1.5 px away


def test_scores_from_info_prefers_a_rasterizer_provided_contribution():
    sc = _scene(N=50)
    f = {k: (v.float() if torch.is_tensor(v) else v) for k, v in sc.items()}
    _, _, info = rasterize_reference(f["means"], f["quats"], f["scales"], f["opacities"], f["colors"],
                                     f["viewmats"], f["Ks"], sc["W"], sc["H"])
    want = contribution_scores(f["means"], f["quats"], f["scales"], f["opacities"], f["viewmats"], f["Ks"],
                               sc["W"], sc["H"]).amax(0)
    assert torch.equal(pruning.scores_from_info(info), want)
    info[pruning.CONTRIBUTION_INFO_KEY] = torch.arange(100.0).view(2, 50)
    assert torch.equal(pruning.scores_from_info(info), torch.arange(50.0, 100.0))


def _render(sc, keep=None, dtype=torch.float32):
    sel = slice(None) if keep is None else keep
    bg = torch.tensor([[0.2, 0.5, 0.7]], dtype=dtype).expand(sc["viewmats"].shape[0], -1)
    img, alpha, _ = rasterize_reference(
        sc["means"][sel].to(dtype), sc["quats"][sel].to(dtype), sc["scales"][sel].to(dtype),
        sc["opacities"][sel].to(dtype), sc["colors"][sel].to(dtype), sc["viewmats"].to(dtype),
        sc["Ks"].to(dtype), sc["W"], sc["H"], backgrounds=bg)
    return img, alpha


def test_pruning_zero_contribution_leaves_the_render_unchanged():
    sc = _scene(seed=11, N=300)
    f = {k: (v.float() if torch.is_tensor(v) else v) for k, v in sc.items()}
    scores = contribution_scores(f["means"], f["quats"], f["scales"], f["opacities"], f["viewmats"], f["Ks"],
                                 sc["W"], sc["H"]).amax(0)
    mask, stats = select_prune_mask(scores, None, None, None, min_contribution=0.0, max_fraction=1.0)
    assert stats["low_contribution"] == int(mask.sum()) >= 10
    img0, a0 = _render(sc)
    img1, a1 = _render(sc, ~mask)
    assert (img0 - img1).abs().max().item() <= 1e-6 and (a0 - a1).abs().max().item() <= 1e-6
    # negative control: removing the lowest-scoring Gaussians that DO contribute changes the image
    pos = torch.nonzero(scores > 0.02).squeeze(1)
    drop = pos[torch.argsort(scores[pos])[:5]]
    keep = torch.ones_like(mask)
    keep[drop] = False
    img2, _ = _render(sc, keep)
    assert (img0 - img2).abs().max().item() > 1e-3


# ----------------------------------------------------------------------------------------------
# (c) selection
# ----------------------------------------------------------------------------------------------


def _entries(tiles):
    keys = torch.tensor([t for t, gs in enumerate(tiles) for _ in gs], dtype=torch.long)
    gids = torch.tensor([g for gs in tiles for g in gs], dtype=torch.long)
    return keys, gids


def greedy_reference(scores, tiles, capacity, pre):
    """Remove Gaussians one at a time in increasing score (ties: index) while one of their tiles is
    still over capacity (after the ``pre`` removals)."""
    removed = set(pre)
    counts = [sum(1 for g in gs if g not in removed) for gs in tiles]
    member = {}
    for t, gs in enumerate(tiles):
        for g in gs:
            member.setdefault(g, []).append(t)
    out = []
    for g in sorted(range(len(scores)), key=lambda i: (float(scores[i]), i)):
        if g in removed:
            continue
        if any(counts[t] > capacity for t in member.get(g, [])):
            removed.add(g)
            out.append(g)
            for t in member[g]:
                counts[t] -= 1
    return out


def test_selection_lowest_in_over_capacity_tiles_then_low_contribution():
    scores = torch.tensor([0.0, 0.5, 0.1, 0.9, 0.3, 0.2, 0.05, 0.8, 0.0, 0.01, 0.7])
    tiles = [
        [0, 1, 2, 3, 4, 5],  # 6 entries, capacity 3: its 3 lowest go, 0 (zero) first, then 2 and 5
        [6, 9, 10],  # at capacity: its low scorers 6 and 9 must stay
        [5, 7, 8],  # at capacity (8 is zero-contribution and goes in the second stage)
    ]
    keys, gids = _entries(tiles)
    mask, st = select_prune_mask(scores, keys, gids, 3, min_contribution=0.0, max_fraction=1.0)
    assert torch.nonzero(mask).squeeze(1).tolist() == [0, 2, 5, 8]
    assert st["overflow"] == st["over_capacity"] == 3 and st["low_contribution"] == 1
    assert st["tiles_over_before"] == 1 and st["tiles_over_after"] == 0
    assert st["max_tile_before"] == 6 and st["max_tile_after"] == 3
    # without the low-contribution stage the zero-score Gaussian is still the lowest of the crowded tile
    mask, st = select_prune_mask(scores, keys, gids, 3, min_contribution=0.0, max_fraction=1.0,
                                 prune_low_contribution=False)
    assert torch.nonzero(mask).squeeze(1).tolist() == [0, 2, 5]
    # a threshold above zero takes the low scorers everywhere, crowded or not
    mask, st = select_prune_mask(scores, keys, gids, 3, min_contribution=0.05, max_fraction=1.0)
    assert torch.nonzero(mask).squeeze(1).tolist() == [0, 2, 5, 6, 8, 9]
    # no capacity known: only the low-contribution stage
    mask, st = select_prune_mask(scores, keys, gids, None, min_contribution=0.0, max_fraction=1.0)
    assert torch.nonzero(mask).squeeze(1).tolist() == [0, 8] and st["overflow"] == 0


def test_selection_spends_the_cap_on_the_overflow_first():
    scores = torch.tensor([0.0, 0.0, 0.0, 0.4, 0.3, 0.2, 0.1, 0.6, 0.7, 0.8])
    tiles = [[3, 4, 5, 6, 7, 8, 9]]  # 7 entries, capacity 2: an overflow of 5 (6, 5, 4, 3, 7)
    keys, gids = _entries(tiles)
    # 10 Gaussians, 20%: 2 removals, the tile's 2 lowest; nothing left for the zeros outside it
    mask, st = select_prune_mask(scores, keys, gids, 2, min_contribution=0.0, max_fraction=0.2)
    assert torch.nonzero(mask).squeeze(1).tolist() == [5, 6]
    assert st["overflow"] == 5 and st["over_capacity"] == 2 and st["low_contribution"] == 0
    assert st["tiles_over_after"] == 1 and st["max_tile_after"] == 5
    # 50%: exactly the overflow; the tile fits
    mask, st = select_prune_mask(scores, keys, gids, 2, min_contribution=0.0, max_fraction=0.5)
    assert torch.nonzero(mask).squeeze(1).tolist() == [3, 4, 5, 6, 7]
    assert st["tiles_over_after"] == 0 and st["max_tile_after"] == 2 and st["low_contribution"] == 0
    # 80%: the overflow, then the 3 zeros
    mask, st = select_prune_mask(scores, keys, gids, 2, min_contribution=0.0, max_fraction=0.8)
    assert torch.nonzero(mask).squeeze(1).tolist() == [0, 1, 2, 3, 4, 5, 6, 7] and st["low_contribution"] == 3
    mask, _ = select_prune_mask(scores, keys, gids, 2, max_fraction=0.0)
    assert not mask.any()


@pytest.mark.parametrize("seed", range(6))
def test_selection_matches_one_by_one_greedy_on_random_tiles(seed):
    g = torch.Generator().manual_seed(seed)
    N, n_tiles, cap = 300, 40, 12
    scores = torch.rand(N, generator=g) * (torch.rand(N, generator=g) > 0.1)  # ~10% exact zeros
    scores = torch.round(scores * 50) / 50  # ties
    tiles = []
    for _ in range(n_tiles):
        size = int(torch.randint(2, 30, (1,), generator=g))
        tiles.append(sorted(torch.randperm(N, generator=g)[:size].tolist()))
    keys, gids = _entries(tiles)
    perm = torch.randperm(keys.numel(), generator=g)  # entry order must not matter
    for stage1 in (True, False):
        mask, st = select_prune_mask(scores, keys[perm], gids[perm], cap, min_contribution=0.0,
                                     max_fraction=1.0, prune_low_contribution=stage1)
        pre = torch.nonzero(scores == 0).squeeze(1).tolist() if stage1 else []
        want = set(pre) | set(greedy_reference(scores, tiles, cap, pre))
        assert set(torch.nonzero(mask).squeeze(1).tolist()) == want
        assert st["tiles_over_after"] == 0
        # never a Gaussian (beyond stage 1) whose tiles are all within capacity
        counts = [len(t) - sum(1 for x in t if x in pre) for t in tiles]
        crowded = {x for t, c in zip(tiles, counts) if c > cap for x in t}
        assert set(torch.nonzero(mask).squeeze(1).tolist()) - set(pre) <= crowded


# ----------------------------------------------------------------------------------------------
# (d) apply, and training on
# ----------------------------------------------------------------------------------------------


def _trainable(sc):
    params = torch.nn.ParameterDict({
        "means": torch.nn.Parameter(sc["means"].float()),
        "scales": torch.nn.Parameter(torch.log(sc["scales"].float())),
        "quats": torch.nn.Parameter(sc["quats"].float()),
        "opacities": torch.nn.Parameter(torch.logit(sc["opacities"].float())[:, None]),
        "features_dc": torch.nn.Parameter(sc["colors"].float()),
        "features_rest": torch.nn.Parameter(torch.zeros(sc["means"].shape[0], 0, 3)),
    })
    optimizers = {k: torch.optim.Adam([{"params": [p], "lr": 1e-3, "name": k}], eps=1e-15) for k, p in params.items()}
    return params, optimizers


def _train_step(params, optimizers, strategy, state, sc, step, view, pruner=None):
    gt = torch.full((sc["H"], sc["W"], 3), 0.5)
    render, alpha, info = rasterize_reference(
        params["means"], params["quats"], torch.exp(params["scales"]), torch.sigmoid(params["opacities"]).squeeze(-1),
        torch.sigmoid(params["features_dc"]), sc["viewmats"][view:view + 1].float(), sc["Ks"][view:view + 1].float(),
        sc["W"], sc["H"], absgrad=True)
    strategy.step_pre_backward(params, optimizers, state, step, info)
    loss = (render[0] - gt).abs().mean()
    loss.backward()
    for opt in optimizers.values():
        opt.step()
        opt.zero_grad(set_to_none=True)
    if pruner is not None:
        pruner.before_strategy(params, state, info, step)
    strategy.step_post_backward(params, optimizers, state, step, info, packed=False)
    stats = pruner.after_strategy(params, optimizers, state, step) if pruner is not None else None
    return loss, stats


def test_apply_keeps_params_optimizer_and_strategy_state_consistent():
    from gsplat.strategy import DefaultStrategy

    sc = _scene(seed=5, N=60, C=3)
    params, optimizers = _trainable(sc)
    strategy = DefaultStrategy(refine_start_iter=1000, refine_scale2d_stop_iter=1000, absgrad=True, verbose=False)
    state = strategy.initialize_state()
    for it in range(2):
        _train_step(params, optimizers, strategy, state, sc, it, it)
    N = params["means"].shape[0]
    state[pruning.SCORE_KEY] = torch.rand(N)
    before_p = {k: p.detach().clone() for k, p in params.items()}
    before_o = {k: {s: optimizers[k].state[p][s].clone() for s in ("exp_avg", "exp_avg_sq")}
                for k, p in params.items() if optimizers[k].state[p]}
    assert set(before_o) == set(params) - {"features_rest"}
    before_s = {k: v.clone() for k, v in state.items() if isinstance(v, torch.Tensor)}
    steps = {k: optimizers[k].state[p]["step"] for k, p in params.items() if optimizers[k].state[p]}
    assert set(before_s) == {"grad2d", "count", "radii", pruning.SCORE_KEY}
    mask = torch.zeros(N, dtype=torch.bool)
    mask[torch.tensor([0, 3, 17, 40, 59])] = True
    assert apply_prune(params, optimizers, state, mask) == 5
    keep = ~mask
    check_state_consistent(params, optimizers, state)
    assert params["means"].shape[0] == N - 5
    for k, p in params.items():
        assert torch.equal(p.detach(), before_p[k][keep]), k
        if k in before_o:
            for s in ("exp_avg", "exp_avg_sq"):
                assert torch.equal(optimizers[k].state[p][s], before_o[k][s][keep]), (k, s)
            assert torch.equal(torch.as_tensor(optimizers[k].state[p]["step"]), torch.as_tensor(steps[k]))
    for k, v in before_s.items():
        assert torch.equal(state[k], v[keep]), k
    # training goes on with the pruned set, and the strategy keeps accumulating on it
    loss, _ = _train_step(params, optimizers, strategy, state, sc, 2, 2)
    assert torch.isfinite(loss)
    check_state_consistent(params, optimizers, state)
    assert apply_prune(params, optimizers, state, torch.zeros(N - 5, dtype=torch.bool)) == 0


def _crowded_scene(N=300, W=96, H=64, C=3, seed=3):
    """Half the Gaussians clustered near the origin (a few crowded tiles), half spread out."""
    sc = make_scene(seed, N=N, W=W, H=H, C=C, opacity_range=(0.1, 0.9), scale_range=(0.03, 0.15), cam_dist=5.0)
    sc["means"][: N // 2] *= 0.25
    return sc


def test_tile_entries_follow_gsplats_refine():
    """hw_origin through gsplat's duplicate/split/remove carries recorded tile lists to the refined
    Gaussians: after duplicates and removals exactly the lists binned from the new Gaussians; a
    split parent's entries go to both children."""
    from gsplat.strategy.ops import duplicate, remove, split

    sc = _crowded_scene(N=120, C=2, seed=8)
    params, optimizers = _trainable(sc)
    n0 = params["means"].shape[0]

    def entries():
        pr = project_gaussians(params["means"].detach(), params["quats"].detach(), torch.exp(params["scales"].detach()),
                               sc["viewmats"].float(), sc["Ks"].float(), sc["W"], sc["H"])
        return tile_entries(dict(radii=pr.radii, means2d=pr.means2d, depths=pr.depths, width=sc["W"], height=sc["H"]))

    keys, gids, nt = entries()
    state = {pruning.ORIGIN_KEY: torch.arange(n0), pruning.SCORE_KEY: torch.rand(n0, 2)}
    g = torch.Generator().manual_seed(0)
    duplicate(params, optimizers, state, torch.rand(n0, generator=g) < 0.2)
    remove(params, optimizers, state, torch.rand(params["means"].shape[0], generator=g) < 0.3)
    assert state[pruning.SCORE_KEY].shape == (params["means"].shape[0], 2)  # 2D state carried like any other
    k2, g2 = pruning.follow_origin(keys, gids, state[pruning.ORIGIN_KEY], n0)
    k3, g3, nt3 = entries()
    assert nt3 == nt and sorted(zip(k2.tolist(), g2.tolist())) == sorted(zip(k3.tolist(), g3.tolist()))
    # split: the children (appended) take their parent's entries; the others keep theirs
    n1 = params["means"].shape[0]
    origin1 = state[pruning.ORIGIN_KEY].clone()
    state[pruning.ORIGIN_KEY] = torch.arange(n1)
    sel = torch.rand(n1, generator=g) < 0.25
    split(params, optimizers, state, sel)
    k4, g4 = pruning.follow_origin(k2, g2, state[pruning.ORIGIN_KEY], n1)
    parents = torch.nonzero(sel).squeeze(1)
    rest = torch.nonzero(~sel).squeeze(1)
    want = set()
    for k, gid in zip(k2.tolist(), g2.tolist()):
        if sel[gid]:
            j = int((parents == gid).nonzero())
            want |= {(k, len(rest) + j), (k, len(rest) + len(parents) + j)}  # gsplat: cat(rest, sel.repeat(2))
        else:
            want.add((k, int((rest == gid).nonzero())))
    assert set(zip(k4.tolist(), g4.tolist())) == want and k4.numel() == len(want)
    assert torch.equal(origin1[state[pruning.ORIGIN_KEY]], origin1[torch.cat([rest, parents, parents])])


def _fake_info(n, step):
    """A render of n Gaussians that carries its score (as the fused training step does)."""
    contribution = (torch.arange(n) == step % n).float()[None] * step / 100.0
    return dict(radii=torch.ones(1, n, dtype=torch.int32), contribution=contribution, n_cameras=1)


def test_score_window_spans_whole_periods():
    """The score of a prune step covers the steps since the previous one and, when the window is
    longer, whole periods before (columns rotated after each period's last step); the
    low-contribution stage waits for a window's worth of views."""
    from gsplat.strategy import DefaultStrategy

    strategy = DefaultStrategy(refine_start_iter=0, refine_stop_iter=40, refine_every=5, reset_every=10**6,
                               verbose=False)
    n = 4
    params = {"means": torch.zeros(n, 3)}
    state = {}
    pruner = HardwarePruner(HWPruneSettings(mode="on", window=12, min_contribution=-1.0), strategy, 100, True, None)
    assert (pruner.period, pruner.columns, pruner.first_prune, pruner.last_prune) == (5, 3, 5, 35)
    assert pruner.first_score == 0 and pruner.scores_step(35) and not pruner.scores_step(36)
    seen = {}
    for step in range(0, 41):
        pruner.before_strategy(params, state, _fake_info(n, step), step)
        if pruner.is_prune_step(step):
            seen[step] = state[pruning.SCORE_KEY].amax(1).clone()
        stats = pruner.after_strategy(params, {}, state, step)
        assert (stats is not None) == pruner.is_prune_step(step)
        if stats is not None:
            assert stats["removed"] == 0  # scores >= 0 > min_contribution, no capacity
            assert stats["window_views"] == min(step + 1, 15) and stats["full_window"] == (step + 1 >= 12)
    assert sorted(seen) == [5, 10, 15, 20, 25, 30, 35]
    for step, score in seen.items():
        # Gaussian i scored step/100 at the steps t = i (mod 4) of the window (step - 15, step]
        want = torch.tensor([max([t / 100.0 for t in range(max(0, step - 14), step + 1) if t % n == i], default=0.0)
                             for i in range(n)])
        assert torch.allclose(score, want), (step, score, want)
    assert state[pruning.SCORE_KEY] is None  # after the last prune step nothing is carried
    # window <= period: exactly the steps since the previous prune step
    p1 = HardwarePruner(HWPruneSettings(mode="on", window=3), strategy, 100, True, None)
    assert p1.columns == 1 and p1.first_score == 1


def test_hook_right_after_gsplats_refine_steps():
    from gsplat.strategy import DefaultStrategy

    sc = _crowded_scene()
    params, optimizers = _trainable(sc)
    strategy = DefaultStrategy(refine_start_iter=2, refine_stop_iter=40, refine_every=4, reset_every=1000,
                               pause_refine_after_reset=0, grow_grad2d=1e-2, absgrad=True, verbose=False)
    state = strategy.initialize_state()
    capacity = 100  # 2-4 of each view's 24 tiles hold more (up to ~225)
    settings = HWPruneSettings(mode="on", every_refines=2, max_fraction=0.3, min_contribution=1 / 255, window=12,
                               tile_views=2, capacity=capacity)
    pruner = HardwarePruner(settings, strategy, num_train_data=3, enabled=True, capacity=capacity)
    assert pruner.period == 8 and pruner.columns == 2 and pruner.tile_views == 2
    assert [s for s in range(50) if pruner.is_prune_step(s)] == [8, 16, 24, 32]  # refine_stop 40
    pruned = []
    for it in range(1, 20):
        n_before = params["means"].shape[0]
        loss, stats = _train_step(params, optimizers, strategy, state, sc, it, it % 3, pruner)
        assert torch.isfinite(loss)
        check_state_consistent(params, optimizers, state)
        assert pruning.ORIGIN_KEY not in state
        if stats is not None:
            pruned.append(it)
            grown = stats["gaussians"] - n_before  # gsplat refined at this step first
            assert stats["removed"] == n_before + grown - params["means"].shape[0]
            assert stats["removed"] <= math.floor(0.3 * stats["gaussians"])
            assert stats["tiles"] > 0 and stats["tiles_over_after"] <= stats["tiles_over_before"]
            assert stats["over_capacity"] <= stats["overflow"]
            if stats["over_capacity"] < stats["overflow"]:
                assert stats["removed"] == math.floor(0.3 * stats["gaussians"])  # the cap bound
            assert state[pruning.SCORE_KEY].shape == (params["means"].shape[0], 2)
        else:
            assert not pruner.is_prune_step(it)
    assert pruned == [8, 16]
    first, last = pruner.history
    # step 8: 8 views scored, fewer than the window of 12: only the overflow goes
    assert not first["full_window"] and first["low_contribution"] == 0 and first["over_capacity"] > 0
    assert first["tiles_over_after"] < first["tiles_over_before"]
    # step 16: 16 views (two periods) cover the window
    assert last["full_window"] and last["window_views"] == 16
    assert last["over_capacity"] + last["low_contribution"] > 0


def test_schedule_with_splatfacto_defaults():
    from gsplat.strategy import DefaultStrategy

    # splatfacto 1.1.5's strategy settings for 100 training images
    strategy = DefaultStrategy(refine_start_iter=500, refine_stop_iter=15000, refine_every=100, reset_every=3000,
                               pause_refine_after_reset=100 + 100, verbose=False)
    pruner = HardwarePruner(HWPruneSettings(mode="on"), strategy, num_train_data=100, enabled=True, capacity=1920)
    steps = [s for s in range(30000) if pruner.is_prune_step(s)]
    # right after every gsplat refine step: gsplat refines at 600, 700, ... (step > 500), not in its
    # pause of 200 steps after each opacity reset (3000, 3100, 6000, 6100, ...), not from 15000 on
    refines = [s for s in range(1, 15000) if s > 500 and s % 100 == 0 and s % 3000 >= 200]
    assert steps == refines and steps[0] == 600 and steps[-1] == 14900 and 3000 not in steps and 3200 in steps
    assert (pruner.first_prune, pruner.last_prune, pruner.period, pruner.columns) == (600, 14900, 100, 1)
    assert pruner.window == 100 and pruner.tile_views == 4 and pruner.next_prune_step(2950) == 3200
    # scored: the 100 views before the first prune step up to the last one
    assert [s for s in (500, 501, 14900, 14901) if pruner.scores_step(s)] == [501, 14900]
    assert not any(HardwarePruner(HWPruneSettings(), strategy, 100, False, None).is_prune_step(s) for s in steps)
    # 250 training images: the score covers the last 3 periods; every 5th refine; tile views <= refine_every
    p2 = HardwarePruner(HWPruneSettings(every_refines=5, tile_views=800), strategy, 250, True, 1920)
    assert p2.period == 500 and p2.columns == 1 and p2.tile_views == 100
    assert [s for s in range(30000) if p2.is_prune_step(s)][:6] == [1000, 1500, 2000, 2500, 3500, 4000]
    p3 = HardwarePruner(HWPruneSettings(), strategy, 250, True, 1920)
    assert p3.columns == 3 and p3.first_score == 600 - 300 + 1
    # hw_prune_stop_iter ends it earlier
    p4 = HardwarePruner(HWPruneSettings(stop_iter=5000), strategy, 100, True, 1920)
    assert p4.last_prune == 4900 and not p4.scores_step(4901)


def test_low_contribution_stage_needs_the_whole_window():
    from gsplat.strategy import DefaultStrategy

    sc = _crowded_scene()
    strategy = DefaultStrategy(refine_start_iter=2, refine_stop_iter=40, refine_every=4, reset_every=1000,
                               pause_refine_after_reset=0, grow_grad2d=1e9, absgrad=True, verbose=False)
    results = {}
    for first in (6, 7):  # the window of step 8 is 3 views: steps 6-8; starting at 7 sees only 2
        params, optimizers = _trainable(sc)
        state = strategy.initialize_state()
        pruner = HardwarePruner(HWPruneSettings(mode="on", every_refines=2, max_fraction=0.5, min_contribution=0.01,
                                                window=3, tile_views=2), strategy, 3, True, None)
        for it in range(first, 9):
            _, stats = _train_step(params, optimizers, strategy, state, sc, it, it % 3, pruner)
        results[first] = stats
    assert results[6]["full_window"] and results[6]["low_contribution"] > 0
    assert not results[7]["full_window"] and results[7]["removed"] == 0


def test_model_hook_and_config():
    """Through ByteSplatModel.step_post_backward: the config knobs, auto = off on CPU/reference,
    and a pruning step right after gsplat's refine step inside a short CPU training loop of the
    real model."""
    from nerfstudio.cameras.cameras import Cameras
    from nerfstudio.data.scene_box import SceneBox

    from bytesplat_ns.model import ByteSplatModelConfig

    sc = _crowded_scene(N=120, W=48, H=32, C=2)

    def make(**kw):
        cfg = ByteSplatModelConfig(warmup_length=2, refine_every=4, stop_split_at=40, reset_alpha_every=1000,
                                   sh_degree=0, num_random=120, random_init=True, background_color="black",
                                   num_downscales=0, **kw)
        model = cfg.setup(scene_box=SceneBox(torch.tensor([[-1.0, -1, -1], [1, 1, 1]])), num_train_data=2,
                          metadata={})
        with torch.no_grad():
            model.gauss_params["means"].copy_(sc["means"].float())
            model.gauss_params["scales"].copy_(torch.log(sc["scales"].float()))
            model.gauss_params["opacities"].copy_(torch.logit(sc["opacities"].float())[:, None])
        model.train()
        return model

    assert ByteSplatModelConfig().hw_prune == "auto" and ByteSplatModelConfig().hw_prune_every_refines == 1
    model = make(hw_prune="auto", hw_prune_every_refines=2, hw_prune_window=2, hw_prune_tile_views=2,
                 hw_prune_capacity=6, hw_prune_max_fraction=0.25, hw_prune_min_contribution=0.0,
                 tile_stats_every=4)
    assert not HardwarePruner.from_model(model).enabled  # auto: off (reference backend, CPU)
    model._backend = "fused"
    assert not HardwarePruner.from_model(model).enabled  # auto: off with the fused backend too, for now
    model._backend = None
    model.config.hw_prune = "on"
    optimizers = {k: torch.optim.Adam([{"params": [p], "lr": 1e-3, "name": k}], eps=1e-15)
                  for k, p in model.gauss_params.items()}
    c2w = []
    for v in range(2):
        w2c = sc["viewmats"][v].float()
        c2w_cv = torch.linalg.inv(w2c)[:3]
        c2w.append(c2w_cv * torch.tensor([1.0, -1.0, -1.0, 1.0]))  # OpenCV -> OpenGL camera axes
    K = sc["Ks"].float()
    cams = Cameras(camera_to_worlds=torch.stack(c2w), fx=K[:, 0, 0:1], fy=K[:, 1, 1:2], cx=K[:, 0, 2:3],
                   cy=K[:, 1, 2:3], width=sc["W"], height=sc["H"])
    pruned_at = []
    for it in range(1, 13):
        model.step = it
        model.optimizers = optimizers
        out = model.get_outputs(cams[it % 2:it % 2 + 1])
        loss = (out["rgb"] - 0.5).abs().mean()
        loss.backward()
        for opt in optimizers.values():
            opt.step()
            opt.zero_grad(set_to_none=True)
        model.step_post_backward(it)
        check_state_consistent(model.gauss_params, optimizers, model.strategy_state)
        if model.pruning.last_stats is not None and model.pruning.last_stats["step"] == it:
            pruned_at.append(it)
            st = model.pruning.last_stats
            assert model.num_points == st["gaussians"] - st["removed"] and st["removed"] > 0
    assert model.pruning.enabled and model.pruning.capacity == 6 and model.pruning.period == 8
    # gsplat refines at 8 (4 is inside its pause after the step-0 opacity reset: num_train_data + refine_every)
    assert pruned_at == [8]
    log = model.tile_occupancy.log  # tile_stats_every=4: the render of steps 4, 8, 12
    assert [e["step"] for e in log] == [4.0, 8.0, 12.0] and all(e["capacity"] == 6 for e in log)
    assert all(0.0 <= e["over_capacity_share"] <= 1.0 and e["max"] >= e["p99"] >= 0 for e in log)


def test_tile_lists_follow_the_fused_tile_reach():
    """With the fused backend's opacity-aware reach (its default), pruning and the occupancy monitor
    count the lists it bins (``opacity_aware_radii``), not the square boxes; the model's config
    decides both."""
    from bytesplat_ns.model import ByteSplatModelConfig
    from bytesplat_ns.raster.fused import bin_tiles
    from bytesplat_ns.raster.tile_reach import opacity_aware_radii
    from bytesplat_ns.tile_occupancy import tile_occupancy

    sc = _crowded_scene(N=400, C=2, seed=11)
    pr = project_gaussians(sc["means"], sc["quats"], sc["scales"], sc["viewmats"], sc["Ks"], sc["W"], sc["H"])
    opac = sc["opacities"].reshape(1, -1).expand(2, -1)
    info = dict(radii=pr.radii, means2d=pr.means2d, depths=pr.depths, conics=pr.conics, opacities=opac,
                width=sc["W"], height=sc["H"])
    square, tight = (tile_entries(info, opacity_aware=a) for a in (False, True))
    assert tight[0].numel() < square[0].numel()
    offsets, fids = bin_tiles(pr.means2d, opacity_aware_radii(pr.radii, pr.conics, opac), pr.depths, sc["W"], sc["H"])
    assert torch.equal(tight[1], fids.long() % pr.radii.shape[1])
    assert torch.equal(torch.bincount(tight[0], minlength=tight[2]), (offsets[1:] - offsets[:-1]).long())
    cap = int(torch.bincount(square[0], minlength=square[2]).max()) // 2
    assert tile_occupancy(info, cap, True)["max"] < tile_occupancy(info, cap)["max"]
    for reach in (True, False):
        config = ByteSplatModelConfig()
        config.fused.opacity_aware_tiles = reach
        assert HWPruneSettings.from_config(config).opacity_aware_tiles is reach
    assert ByteSplatModelConfig().fused.opacity_aware_tiles is True


def test_tile_occupancy_counts_like_an_explicit_walk():
    """Share of tiles over capacity, mean and max per tile, against counting each Gaussian's tile
    box by hand (gsplat's reach rule, the one the fused backend bins with)."""
    from bytesplat_ns.tile_occupancy import tile_occupancy

    sc = _scene(N=300, W=61, H=45, C=2)
    pr, _ = _project(sc, torch.float32)
    W, H, tile = sc["W"], sc["H"], 16
    tw, th = math.ceil(W / tile), math.ceil(H / tile)
    counts = torch.zeros(pr.radii.shape[0], th, tw)
    for c in range(pr.radii.shape[0]):
        for g in range(pr.radii.shape[1]):
            r = float(pr.radii[c, g])
            if r <= 0:
                continue
            mx, my = pr.means2d[c, g].tolist()
            x0, x1 = max(0, math.floor((mx - r) / tile)), min(tw, math.ceil((mx + r) / tile))
            y0, y1 = max(0, math.floor((my - r) / tile)), min(th, math.ceil((my + r) / tile))
            if x1 > x0 and y1 > y0:
                counts[c, y0:y1, x0:x1] += 1
    info = dict(radii=pr.radii, means2d=pr.means2d, depths=pr.depths, width=W, height=H)
    cap = int(counts.flatten().median())
    got = tile_occupancy(info, cap)
    assert got["tiles"] == counts.numel() and got["capacity"] == cap
    assert got["over_capacity_share"] == pytest.approx(float((counts > cap).float().mean()))
    assert 0 < got["over_capacity_share"] < 1
    assert got["max"] == float(counts.max()) and got["mean"] == pytest.approx(float(counts.mean()))


# ----------------------------------------------------------------------------------------------
# GPU: a pruned model renders the same through fused and reference
# ----------------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.gpu
def test_pruned_model_renders_identically_through_fused_and_reference(device="cuda"):
    from bytesplat_ns.raster import rasterize

    sc = _crowded_scene(N=2000, W=96, H=64, C=2, seed=21)
    dev = torch.device(device)
    f = {k: (v.float().to(dev) if torch.is_tensor(v) and v.is_floating_point() else v) for k, v in sc.items()}
    scores = contribution_scores(f["means"], f["quats"], f["scales"], f["opacities"], f["viewmats"], f["Ks"],
                                 sc["W"], sc["H"]).amax(0)
    pr = project_gaussians(f["means"], f["quats"], f["scales"], f["viewmats"], f["Ks"], sc["W"], sc["H"])
    info = dict(radii=pr.radii, means2d=pr.means2d, depths=pr.depths, width=sc["W"], height=sc["H"])
    keys, gids, nt = tile_entries(info)
    capacity = max(32, int(torch.bincount(keys, minlength=nt).max()) // 2)
    mask, st = select_prune_mask(scores, keys, gids, capacity, min_contribution=1 / 255, max_fraction=0.5, n_tiles=nt)
    assert st["low_contribution"] > 0 and st["over_capacity"] > 0
    keep = ~mask
    bg = torch.tensor([[0.1, 0.2, 0.3]], device=dev).expand(2, -1)
    args = (f["means"][keep], f["quats"][keep], f["scales"][keep], f["opacities"][keep], f["colors"][keep],
            f["viewmats"], f["Ks"], sc["W"], sc["H"])
    ref, ref_a, _ = rasterize(*args, backend="reference", backgrounds=bg)
    assert st["tiles_over_after"] == 0
    if device != "cuda":
        return  # the CPU half of this test (selection on the scene), for checking it without a GPU
    from bytesplat_ns.raster.fused import FusedOptions, rasterize_fused

    # the reference's pure-torch projection on both sides, so only the rasterizers differ
    fus, fus_a, _ = rasterize_fused(*args, backgrounds=bg, options=FusedOptions(projection="torch"))
    scale = ref.abs().max().item()
    assert (fus - ref).abs().max().item() / scale <= 1e-5
    assert (fus_a - ref_a).abs().max().item() <= 1e-5
