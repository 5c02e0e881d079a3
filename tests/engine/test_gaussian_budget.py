"""The Gaussian budget (bytesplat_ns/gaussian_budget.py, issue 22): the importance against an explicit
per-pixel walk, removing what no view sees leaves every render unchanged, the ranking, the settings,
and one budget step inside nerfstudio's training loop of the real model (CPU, reference backend)."""

from __future__ import annotations

import copy
import math

import pytest
import torch

from bytesplat_ns.bench.train import setup_trainer
from bytesplat_ns.data.scene import SceneSpec, ensure_scene
from bytesplat_ns.errors import SettingError
from bytesplat_ns.gaussian_budget import (
    BudgetSettings,
    GaussianBudget,
    budget_announcement,
    lowest_ranked,
    summed_over_views,
    view_blending_weights,
)
from bytesplat_ns.method_configs.bytesplat import bytesplat_config
from bytesplat_ns.pruning import apply_prune
from bytesplat_ns.raster.projection import project_gaussians
from bytesplat_ns.raster.reference import rasterize_reference
from tests.helpers.pruning_checks import check_state_consistent, explicit_scores
from tests.helpers.raster_scenes import make_scene


def _scene():
    # opaque, overlapping Gaussians: some are hidden or behind stopped pixels (importance 0)
    return make_scene(8, N=200, W=45, H=37, C=2, opacity_range=(0.8, 0.99), scale_range=(0.1, 0.6))


def _render(sc, view, dtype=torch.float64, keep=None):
    pick = (lambda t: t) if keep is None else (lambda t: t[keep])
    return lambda colors: rasterize_reference(
        pick(sc["means"].to(dtype)), pick(sc["quats"].to(dtype)), pick(sc["scales"].to(dtype)),
        pick(sc["opacities"].to(dtype)), colors, sc["viewmats"][view:view + 1].to(dtype),
        sc["Ks"][view:view + 1].to(dtype), sc["W"], sc["H"])[0]


def _importance(sc, dtype=torch.float64):
    n = sc["means"].shape[0]
    per_view = [view_blending_weights(_render(sc, v, dtype), n, torch.device("cpu"), dtype)
                for v in range(sc["viewmats"].shape[0])]
    return per_view, summed_over_views(per_view, n, torch.device("cpu"))


def test_importance_is_each_gaussians_compositing_weight_summed_over_pixels():
    sc = _scene()
    per_view, (total, views) = _importance(sc)
    pr = project_gaussians(sc["means"].double(), sc["quats"].double(), sc["scales"].double(),
                           sc["viewmats"].double(), sc["Ks"].double(), sc["W"], sc["H"])
    C = sc["viewmats"].shape[0]
    want, stopped = explicit_scores(pr.means2d, pr.conics, sc["opacities"].double().expand(C, -1), pr.radii,
                                    pr.depths, sc["W"], sc["H"], count_stop=False, reduce="sum")
    assert stopped, "the scene must exercise the stop rule"
    assert views == C
    for v in range(C):
        assert (per_view[v].double() - want[v]).abs().max().item() <= 1e-10
    assert torch.allclose(total, want.sum(0), atol=1e-10, rtol=0)
    # the weights of a pixel add up to its alpha: summed over Gaussians, the image's accumulated alpha
    for v in range(C):
        _, alpha, _ = rasterize_reference(sc["means"].double(), sc["quats"].double(), sc["scales"].double(),
                                          sc["opacities"].double(), torch.ones(200, 3, dtype=torch.float64),
                                          sc["viewmats"][v:v + 1].double(), sc["Ks"][v:v + 1].double(), sc["W"], sc["H"])
        assert math.isclose(per_view[v].sum().item(), alpha.sum().item(), rel_tol=1e-12)
    # the scene separates: Gaussians no view shows, and others that cover many pixels
    assert int((total == 0).sum()) >= 3 and int((total > 1.0).sum()) >= 20


def test_removing_the_unseen_leaves_every_view_unchanged():
    sc = _scene()
    _, (total, _) = _importance(sc)
    unseen = int((total == 0).sum())
    fraction = unseen / total.shape[0]
    mask = lowest_ranked(total, fraction)
    assert int(mask.sum()) == unseen and bool((total[mask] == 0).all())
    colors = sc["colors"].double()
    for v in range(sc["viewmats"].shape[0]):
        full = _render(sc, v)(colors)
        pruned = _render(sc, v, keep=~mask)(colors[~mask])
        assert (full - pruned).abs().max().item() <= 1e-6
    # while removing as many of the most important ones changes the images
    top = lowest_ranked(-total, fraction)
    assert (_render(sc, 0)(colors) - _render(sc, 0, keep=~top)(colors[~top])).abs().max().item() > 0.1


def test_lowest_ranked_takes_the_floor_of_the_share_ties_by_index():
    importance = torch.tensor([3.0, 0.0, 1.0, 0.0, 2.0, 1.0, 5.0])
    assert lowest_ranked(importance, 0.0).sum() == 0
    assert lowest_ranked(importance, 0.2).nonzero().flatten().tolist() == [1]  # floor(1.4) = 1: the lower index
    assert lowest_ranked(importance, 0.5).nonzero().flatten().tolist() == [1, 2, 3]  # ties at 1.0: index 2 first
    assert lowest_ranked(importance, 0.99).sum() == 6


def test_settings_and_schedule():
    with pytest.raises(SettingError, match="budget-prune-fraction"):
        BudgetSettings(fraction=1.0)
    with pytest.raises(SettingError, match="budget-prune-steps"):
        BudgetSettings(fraction=0.3, steps=(0,))
    from bytesplat_ns.model import ByteSplatModelConfig
    from nerfstudio.data.scene_box import SceneBox

    with pytest.raises(SettingError, match="budget-prune-fraction"):  # at model set-up, before any training
        ByteSplatModelConfig(budget_prune_fraction=1.5, num_random=10, random_init=True).setup(
            scene_box=SceneBox(torch.tensor([[-1.0, -1, -1], [1, 1, 1]])), num_train_data=2, metadata={})
    assert not GaussianBudget(BudgetSettings(), densify_stop=15000).enabled  # the settings object alone: off
    default = ByteSplatModelConfig()  # the method's default: 40% when densification stops
    assert default.budget_prune_fraction == 0.4 and default.budget_prune_steps == ()
    assert GaussianBudget(BudgetSettings(default.budget_prune_fraction), densify_stop=default.stop_split_at).steps == (15000,)
    budget = GaussianBudget(BudgetSettings(fraction=0.3), densify_stop=15000)
    assert budget.enabled and budget.steps == (15000,) and budget.is_prune_step(15000) and not budget.is_prune_step(14999)
    budget = GaussianBudget(BudgetSettings(fraction=0.3, steps=(9000, 3000, 9000)), densify_stop=15000)
    assert budget.steps == (3000, 9000) and not budget.is_prune_step(15000)
    assert not GaussianBudget(BudgetSettings(fraction=0.3), densify_stop=15000, enabled=False).enabled  # sharded


def test_the_console_line_says_when_a_run_ends_before_its_budget_step():
    budget = GaussianBudget(BudgetSettings(fraction=0.4), densify_stop=15000)
    assert budget_announcement(budget, 3000).startswith("bytesplat: Gaussian budget: this run ends before step 15000")
    for end in (15001, None):  # reached, or the run's length unknown
        assert budget_announcement(budget, end) == ("bytesplat: Gaussian budget: at step(s) 15000 the 40% of the "
                                                    "Gaussians least seen in the training views are removed")
    two = GaussianBudget(BudgetSettings(fraction=0.4, steps=(2000, 9000)), densify_stop=15000)
    assert "at step(s) 2000, 9000" in budget_announcement(two, 5000)  # one of them is reached


def test_budget_step_removes_the_lowest_with_their_optimizer_and_strategy_state():
    sc = _scene()
    params = torch.nn.ParameterDict({
        "means": torch.nn.Parameter(sc["means"].float()),
        "opacities": torch.nn.Parameter(torch.logit(sc["opacities"].float())[:, None]),
    })
    optimizers = {k: torch.optim.Adam([{"params": [p], "lr": 1e-3, "name": k}]) for k, p in params.items()}
    (params["means"].sum() + params["opacities"].sum()).backward()
    for opt in optimizers.values():
        opt.step()
    state = {"grad2d": torch.arange(200.0), "count": torch.ones(200)}
    importance = torch.rand(200, generator=torch.Generator().manual_seed(0))
    budget = GaussianBudget(BudgetSettings(fraction=0.25, steps=(7,)), densify_stop=100)
    assert budget.step_post_backward(params, optimizers, state, 6, lambda: (importance, 3)) is None
    kept = torch.sort(importance).indices[50:].sort().values
    means = params["means"].detach().clone()
    stats = budget.step_post_backward(params, optimizers, state, 7, lambda: (importance, 3))
    assert stats["removed"] == 50 and stats["gaussians"] == 200 and stats["views"] == 3 and budget.history == [stats]
    assert torch.equal(params["means"].detach(), means[kept]) and torch.equal(state["grad2d"], kept.float())
    check_state_consistent(params, optimizers, state)
    assert apply_prune(params, optimizers, state, torch.zeros(150, dtype=torch.bool)) == 0


def test_budget_step_in_the_training_loop(tmp_path, monkeypatch):
    """ns-train's loop on the built-in scene: one budget step at the configured step removes the set
    share right after gsplat's step, its importance pass covers every training camera (the weights
    summed over Gaussians equal each view's accumulated alpha), and training goes on."""
    scene = ensure_scene(SceneSpec(size="small", num_views=10, width=32), cache_dir=tmp_path / "scenes")
    config = copy.deepcopy(bytesplat_config)
    config.pipeline.model.budget_prune_fraction = 0.3
    config.pipeline.model.budget_prune_steps = (6,)
    trainer, _ = setup_trainer("budget", config, scene, 10, tmp_path / "out", seed=0, device="cpu")
    model = trainer.pipeline.model
    counts = {}  # Gaussians at the start of each step
    real_iteration = type(trainer).train_iteration

    def train_iteration(self, step):
        counts[step] = model.num_points
        return real_iteration(self, step)

    monkeypatch.setattr(type(trainer), "train_iteration", train_iteration)
    trainer.train()
    (stats,) = model.budget.history
    assert model._run_end_step == 10 and "at step(s) 6 the 30%" in budget_announcement(model.budget, 10)
    cameras = trainer.pipeline.datamanager.train_dataset.cameras
    assert stats["step"] == 6 and stats["views"] == len(cameras)
    before, after = counts[6], counts[7]
    assert stats["gaussians"] == before and stats["removed"] == int(0.3 * before) and after == before - stats["removed"]
    # nothing else removes or adds Gaussians (gsplat's densification starts later), and training goes on
    assert set(counts.values()) == {before, after} and counts[9] == after == model.num_points
    check_state_consistent(model.gauss_params, model.optimizers, model.strategy_state)
    # the importance pass through the model: each view's weights summed over Gaussians are its alpha
    importance, views = model._budget_importance()
    model.eval()
    with torch.no_grad():
        alpha = sum(model.get_outputs(cameras[i:i + 1])["accumulation"].double().sum() for i in range(len(cameras)))
    assert views == len(cameras) and math.isclose(importance.sum().item(), alpha.item(), rel_tol=1e-4)


@pytest.mark.gpu
def test_fused_backend_gives_the_references_importance():
    """The importance through the fused kernels' backward equals the reference's (same projection)."""
    from bytesplat_ns.raster import rasterize
    from bytesplat_ns.raster.options import FusedOptions

    sc = make_scene(11, N=3000, W=320, H=240, C=3, opacity_range=(0.3, 0.99), scale_range=(0.02, 0.3))
    gpu = {k: (v.float().cuda() if isinstance(v, torch.Tensor) else v) for k, v in sc.items()}
    options = FusedOptions(projection="torch")
    for v in range(3):
        got, want = (view_blending_weights(
            lambda colors, backend=backend: rasterize(gpu["means"], gpu["quats"], gpu["scales"], gpu["opacities"], colors,
                                                      gpu["viewmats"][v:v + 1], gpu["Ks"][v:v + 1], sc["W"], sc["H"],
                                                      backend=backend, fused_options=options)[0],
            3000, torch.device("cuda")) for backend in ("fused", "reference"))
        assert int((want > 1.0).sum()) >= 100
        assert (got - want).abs().max().item() <= 1e-4 * want.abs().max().item()
