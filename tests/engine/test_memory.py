"""Memory accounting: the per-Gaussian model against the real tensors of a ByteSplatModel + Adam after
one training step on CPU, and the planner's properties."""

from __future__ import annotations

import pytest
import torch

from bytesplat_ns import memory as M


def _bytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


@pytest.fixture(scope="module")
def stepped_model():
    """ByteSplatModel (reference rasterizer, SH 3) + nerfstudio Optimizers with bytesplat's config, one step."""
    from nerfstudio.cameras.cameras import Cameras
    from nerfstudio.data.scene_box import SceneBox
    from nerfstudio.engine.optimizers import Optimizers

    from bytesplat_ns.method_configs.bytesplat import gaussian_optimizers
    from bytesplat_ns.model import ByteSplatModelConfig

    N = 400
    g = torch.Generator().manual_seed(0)
    points = torch.rand(N, 3, generator=g) - 0.5
    colors = (torch.rand(N, 3, generator=g) * 255).to(torch.uint8)
    cfg = ByteSplatModelConfig(rasterizer="reference", hw_prune="off", num_downscales=0, sh_degree=3)
    torch.manual_seed(0)
    model = cfg.setup(scene_box=SceneBox(aabb=torch.tensor([[-1.0, -1, -1], [1, 1, 1]])), num_train_data=2,
                      metadata={}, seed_points=(points, colors))
    optimizers = Optimizers(gaussian_optimizers(), model.get_param_groups())
    W, H = 48, 32
    c2w = torch.tensor([[1.0, 0, 0, 0.0], [0, 1, 0, 0.0], [0, 0, 1, 2.5]])[None]
    camera = Cameras(camera_to_worlds=c2w, fx=0.9 * W, fy=0.9 * W, cx=W / 2, cy=H / 2, width=W, height=H)
    model.train()
    model.step_cb(optimizers, 1)
    outputs = model(camera)
    batch = {"image": torch.rand(H, W, 3, generator=g)}
    metrics = model.get_metrics_dict(outputs, batch)
    loss = sum(model.get_loss_dict(outputs, batch, metrics).values())
    loss.backward()
    optimizers.optimizer_step_all()
    model.step_post_backward(1)
    return model, optimizers, N


def test_parameter_layout():
    assert sum(M.param_floats(3).values()) == 59 and sum(M.param_floats(0).values()) == 14
    pg = M.per_gaussian_bytes(3)
    assert (pg.params, pg.grads, pg.adam, pg.densify, pg.total) == (236, 236, 472, 12, 956)


def test_per_gaussian_bytes_match_model_and_adam(stepped_model):
    model, optimizers, N = stepped_model
    assert model.num_points == N  # no densification in the first step
    pg = M.per_gaussian_bytes(model.config.sh_degree)
    params = list(model.gauss_params.values())
    assert sum(_bytes(p) for p in params) == pg.params * N
    assert all(p.grad is not None for p in params)
    assert sum(_bytes(p.grad) for p in params) == pg.grads * N
    names = set(M.param_floats(3))
    adam, steps = 0, 0
    for name, opt in optimizers.optimizers.items():
        if name not in names:
            continue  # camera optimizer etc.: not per Gaussian
        assert isinstance(opt, torch.optim.Adam)
        for state in opt.state.values():
            adam += _bytes(state["exp_avg"]) + _bytes(state["exp_avg_sq"])
            steps += _bytes(state["step"])
    assert adam == pg.adam * N
    assert steps <= 8 * len(names)  # one scalar per group, independent of N
    stats = [v for v in model.strategy_state.values() if isinstance(v, torch.Tensor) and v.shape[:1] == (N,)]
    assert sum(_bytes(v) for v in stats) == pg.densify * N
    # per-view 2D records kept in info (unpacked: every Gaussian of the one view)
    info = [model.info[k] for k in ("means2d", "depths", "conics", "opacities", "radii")]
    assert sum(_bytes(t) for t in info) == M.RECORD_INFO_BYTES * N
    assert M.RECORD_INFO_BYTES + 3 * 4 == M.RECORD_FORWARD_BYTES  # + the evaluated colour
    # the SH concat term: dc + rest as one (N, S, 3) tensor
    assert M.sh_bases(3) * 3 * 4 * N == _bytes(torch.cat([model.features_dc[:, None], model.features_rest], 1))


def test_planner_properties():
    w = M.Workload()
    m = M.memory_per_gpu(10_000_000, "single", 1, w)
    assert m["params"] == 236 * 1e7 and m["adam"] == 472 * 1e7
    for strategy in M.STRATEGIES:
        n = M.max_gaussians(139, strategy, 1, w)
        assert M.memory_per_gpu(n, strategy, 1, w)["peak"] <= 139 * M.GIB < M.memory_per_gpu(n + 1, strategy, 1, w)["peak"]
    one = M.max_gaussians(139, "dense", 1, w)
    for strategy in ("dense", "sparse-grad", "pixel"):
        two = M.max_gaussians(139, strategy, 2, w)
        assert 1.6 * one < two < 2.1 * one  # sharding nearly doubles capacity (images split too)
        assert M.max_gaussians(139, strategy, 4, w) > 1.9 * two
    # sparse gradients move less than dense ones; pixels move no Gaussian records
    dense, sparse, pixel = (M.memory_per_gpu(1e8, s, 2, w) for s in ("dense", "sparse-grad", "pixel"))
    assert sparse["step_exchange"] < dense["step_exchange"] and pixel["step_exchange"] == 0
    assert pixel["step_pixel_exchange"] > 0
    assert M.max_gaussians(139, "pixel", 2, w) > M.max_gaussians(139, "dense", 2, w)
    assert M.max_gaussians(1.0, "single", 1, w) == 0  # overhead alone does not fit
    unpacked = M.Workload(packed=False)
    assert M.max_gaussians(139, "single", 1, unpacked) < M.max_gaussians(139, "single", 1, M.Workload(batch=1))
    with pytest.raises(ValueError, match="single"):
        M.memory_per_gpu(1, "single", 2)
    with pytest.raises(ValueError, match="unknown strategy"):
        M.memory_per_gpu(1, "ddp", 2)  # type: ignore[arg-type]


def test_cli(capsys):
    assert M.main(["--memory-gib", "139", "--gpus", "1", "2", "--batch", "2"]) == 0
    out = capsys.readouterr().out
    assert "956" in out and "sparse-grad" in out and out.count("\n") >= 9


def test_exchange_counts_only_the_records_that_leave_the_gpu():
    """A rank sends its records of the other ranks' B (R-1)/R views and receives the other ranks'
    records of its own B/R views; its own views' records stay local."""
    w = M.Workload(batch=4, visible_fraction=0.5)
    n_total = 1e8
    for R in (2, 4):
        n = n_total / R
        wire = w.batch * w.visible_fraction * n * (R - 1) / R
        dense = M.memory_per_gpu(n_total, "dense", R, w)["step_exchange"]
        assert dense == pytest.approx(2 * wire * (M.RECORD_FORWARD_BYTES + M.RECORD_GRAD_BYTES))
        sparse = M.memory_per_gpu(n_total, "sparse-grad", R, w)["step_exchange"]
        renderer_grads = wire * M.RECORD_GRAD_BYTES  # the received records' dense gradients, before encoding
        assert sparse == pytest.approx(2 * wire * M.RECORD_FORWARD_BYTES + renderer_grads
                                       + 2 * wire * w.nonzero_fraction * M.SPARSE_RECORD_BYTES)
