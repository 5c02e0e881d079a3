"""Host work the training step no longer does, with the same results (no GPU needed): the trainer's
one-pass optimizer calls (optim.OnePassOptimizers, step_in_one_pass: the same updates and state as each
optimizer's own step, nerfstudio's way wherever gradients are scaled or clipped or an optimizer cannot
take the pass, and the trainer switch that adopts it), the world-to-camera matrix the datamanager makes
once per training image, and the training PSNR only on the steps nerfstudio logs.

As in test_adam_kernel.py, CPU tensors stand in for the kernel's operands and a torch twin of
cuda/adam.cu for the kernel; test_adam_kernel_gpu.py holds the one pass against the real kernel."""

from __future__ import annotations

import copy

import pytest
import torch
from nerfstudio.engine.optimizers import Optimizers

from bytesplat_ns import optim
from bytesplat_ns.optim import DeviceAdam, DeviceAdamOptimizerConfig, OnePassOptimizers, step_in_one_pass
from tests.engine.test_adam_kernel import twin_kernel  # noqa: F401  (a fixture)


def _optimizers(seed=0):
    """Three single-tensor Adams as splatfacto builds them (one per attribute), each its own options."""
    gen = torch.Generator().manual_seed(seed)
    shapes = {"means": (50, 3), "opacities": (50, 1), "features_rest": (50, 15, 3)}
    options = {"means": dict(lr=1.6e-4, eps=1e-15), "opacities": dict(lr=0.05, eps=1e-15, betas=(0.8, 0.99)),
               "features_rest": dict(lr=0.0025 / 20, eps=1e-15)}
    params = {n: torch.nn.Parameter(torch.randn(s, generator=gen)) for n, s in shapes.items()}
    return params, {n: DeviceAdam([params[n]], **options[n]) for n in shapes}


def _grads(params, step):
    gen = torch.Generator().manual_seed(100 + step)
    for p in params.values():
        p.grad = torch.randn(p.shape, generator=gen)


def test_one_pass_gives_each_optimizers_own_step(twin_kernel):  # noqa: F811
    own_params, own = _optimizers()
    pass_params, passed = _optimizers()
    for step in range(5):
        for opts in (own, passed):
            for i, opt in enumerate(opts.values()):
                opt.param_groups[0]["lr"] *= 0.9 - 0.05 * i  # schedulers change the rates between steps
        _grads(own_params, step)
        _grads(pass_params, step)
        for opt in own.values():
            opt.step()
        calls_before = len(twin_kernel)
        step_in_one_pass(list(passed.values()))
        assert len(twin_kernel) - calls_before == 3  # one kernel per tensor
    for name in own_params:
        assert torch.equal(own_params[name], pass_params[name])
        ours, theirs = passed[name].state[pass_params[name]], own[name].state[own_params[name]]
        assert set(ours) == set(theirs) == {"step", "exp_avg", "exp_avg_sq"}
        assert all(torch.equal(ours[k], theirs[k]) for k in ours) and float(ours["step"]) == 5.0
        assert passed[name]._opt_called  # what the LR scheduler's order check looks for


def test_one_pass_leaves_an_optimizer_that_cannot_take_it_to_its_own_step(twin_kernel):  # noqa: F811
    params, opts = _optimizers()
    _grads(params, 0)
    hooked, masked, plain = opts["means"], opts["opacities"], opts["features_rest"]
    seen = []
    hooked.register_step_post_hook(lambda opt, args, kwargs: seen.append("hook"))
    masked.visible_rows = torch.arange(50) % 2 == 0
    other = torch.nn.Parameter(torch.ones(4))
    other.grad = torch.ones(4)
    sgd = torch.optim.SGD([other], lr=0.5)
    before = params["opacities"].detach().clone()
    step_in_one_pass([hooked, masked, plain, sgd])
    assert seen == ["hook"]  # its own step ran its hooks
    odd = torch.arange(50) % 2 == 1
    assert torch.equal(params["opacities"][odd], before[odd]) and not torch.equal(params["opacities"], before)
    assert torch.equal(other.detach(), torch.full((4,), 0.5))
    assert all(float(opt.state[p]["step"]) == 1.0 for opt in (hooked, masked, plain)
               for p in opt.param_groups[0]["params"])


def _nerfstudio_optimizers(max_norm=None):
    params, _ = _optimizers()
    config = {name: {"optimizer": DeviceAdamOptimizerConfig(lr=1e-3, eps=1e-15, max_norm=max_norm), "scheduler": None}
              for name in params}
    return params, Optimizers(config, {name: [p] for name, p in params.items()})


def test_nerfstudio_optimizers_adopted_step_as_nerfstudios(twin_kernel, monkeypatch):  # noqa: F811
    theirs_params, theirs = _nerfstudio_optimizers()
    ours_params, ours = _nerfstudio_optimizers()
    inner = dict(ours.optimizers)
    assert OnePassOptimizers.adopt(ours) is ours and ours.optimizers == inner  # the same optimizers
    scaler = torch.amp.GradScaler("cpu", enabled=False)
    groups = list(theirs_params)
    for step in range(3):
        for opts, params in ((theirs, theirs_params), (ours, ours_params)):
            opts.zero_grad_some(groups)
            assert all(p.grad is None for p in params.values())
            _grads(params, step)
            params["features_rest"].grad = None  # a group without gradient is not stepped
            opts.optimizer_scaler_step_some(scaler, groups)
    for name in groups:
        assert torch.equal(theirs_params[name], ours_params[name])
    assert ours.optimizers["features_rest"].state == {}
    assert float(ours.optimizers["means"].state[ours_params["means"]]["step"]) == 3.0


@pytest.mark.parametrize("why", ["max_norm", "scaler"])
def test_clipped_or_scaled_gradients_take_nerfstudios_way(twin_kernel, monkeypatch, why):  # noqa: F811
    params, opts = _nerfstudio_optimizers(max_norm=1.0 if why == "max_norm" else None)
    OnePassOptimizers.adopt(opts)
    monkeypatch.setattr(optim, "step_in_one_pass", lambda *a: pytest.fail("took the one pass"))
    taken = []
    monkeypatch.setattr(Optimizers, "optimizer_scaler_step_some", lambda self, scaler, groups: taken.append(groups))
    scaler = torch.amp.GradScaler("cpu", enabled=why == "scaler")
    _grads(params, 0)
    opts.optimizer_scaler_step_some(scaler, ["means"])
    assert taken == [["means"]]


def test_the_trainer_switch_adopts_the_one_pass(tmp_path):
    """ns-train bytesplat's trainer (on the built-in scene, CPU): one-pass optimizers by default, nerfstudio's
    with --optimizer-steps-in-one-pass False; both recorded in the config."""
    from nerfstudio.configs.method_configs import all_methods

    from bytesplat_ns.bench.train import setup_trainer
    from bytesplat_ns.data.scene import SceneSpec, ensure_scene

    data = ensure_scene(SceneSpec(size="small"))
    kinds = {}
    for switch in (True, False):
        config = copy.deepcopy(all_methods["bytesplat"])
        config.optimizer_steps_in_one_pass = switch
        trainer, _ = setup_trainer(f"one-pass-{switch}", config, data, 2, tmp_path, 0, "cpu")
        kinds[switch] = type(trainer.optimizers)
        trainer.train()  # two steps through the trainer's loop
        assert trainer.pipeline.model.num_points > 0
    assert kinds == {True: OnePassOptimizers, False: Optimizers}


@pytest.mark.parametrize("camera_optimizer", ["off", "SO3xR3"])
def test_training_steps_take_the_datamanagers_matrix_and_log_step_metrics(tmp_path, monkeypatch, camera_optimizer):
    """Through the trainer's loop (CPU, built-in scene): the model renders training views with the world-to-camera
    matrix the datamanager made once per image, unless a camera optimizer moves the cameras; the training
    PSNR is computed on the steps nerfstudio logs (every steps_per_log, and step 0) and only there."""
    from nerfstudio.configs.method_configs import all_methods

    from bytesplat_ns import model as model_module
    from bytesplat_ns.bench.train import setup_trainer
    from bytesplat_ns.data.scene import SceneSpec, ensure_scene

    config = copy.deepcopy(all_methods["bytesplat"])
    config.pipeline.model.camera_optimizer.mode = camera_optimizer
    config.logging.steps_per_log = 3
    trainer, _ = setup_trainer(f"steps-{camera_optimizer}", config, ensure_scene(SceneSpec(size="small")), 7,
                               tmp_path, 0, "cpu")
    computed, metrics = [], []
    real_viewmat = model_module.viewmat_from_camera_to_world
    monkeypatch.setattr(model_module, "viewmat_from_camera_to_world",
                        lambda c2w: computed.append(1) or real_viewmat(c2w))
    real_metrics = type(trainer.pipeline.model).get_metrics_dict

    def recording(model, outputs, batch):
        out = real_metrics(model, outputs, batch)
        if model.training:
            metrics.append(sorted(out))
        return out

    monkeypatch.setattr(type(trainer.pipeline.model), "get_metrics_dict", recording)
    trainer.train()
    assert len(metrics) == 7
    assert len(computed) == (0 if camera_optimizer == "off" else 7)
    logged = [step for step, keys in enumerate(metrics) if "psnr" in keys]
    assert logged == [0, 3, 6] and all("gaussian_count" in keys for keys in metrics)
