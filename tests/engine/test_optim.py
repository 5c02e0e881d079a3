"""DeviceAdam: fused on CUDA parameters, unchanged elsewhere; the method config builds it."""

import pytest
import torch

from bytesplat_ns.optim import DeviceAdam, DeviceAdamOptimizerConfig


def _steps(optimizer_cls, params, **kwargs):
    opt = optimizer_cls(params, lr=1e-2, eps=1e-15, **kwargs)
    for i in range(5):
        opt.zero_grad()
        loss = sum(((p - 0.3 * (i + 1)) ** 2).sum() for p in params)
        loss.backward()
        opt.step()
    return opt


def test_cpu_parameters_keep_the_default_adam_exactly():
    torch.manual_seed(0)
    a = [torch.nn.Parameter(torch.randn(7, 3)), torch.nn.Parameter(torch.randn(4))]
    b = [torch.nn.Parameter(p.detach().clone()) for p in a]
    opt = _steps(DeviceAdam, a)
    _steps(torch.optim.Adam, b)
    assert not opt.param_groups[0]["fused"]
    for x, y in zip(a, b):
        assert torch.equal(x, y)


def test_explicit_choice_is_respected_and_config_builds_device_adam():
    p = [torch.nn.Parameter(torch.zeros(3))]
    assert DeviceAdam(p, lr=1.0, foreach=False).param_groups[0]["foreach"] is False
    opt = DeviceAdamOptimizerConfig(lr=0.5, eps=1e-15).setup(p)
    assert type(opt) is DeviceAdam and opt.param_groups[0]["lr"] == 0.5 and opt.param_groups[0]["eps"] == 1e-15


def test_bytesplat_method_uses_device_adam_for_every_group():
    from bytesplat_ns.method_configs.bytesplat import bytesplat_config

    assert all(isinstance(g["optimizer"], DeviceAdamOptimizerConfig) for g in bytesplat_config.optimizers.values())


@pytest.mark.gpu
@pytest.mark.gpu
def test_cuda_parameters_take_the_fused_kernel_and_match_adam():
    torch.manual_seed(0)
    a = [torch.nn.Parameter(torch.randn(1000, 3, device="cuda")), torch.nn.Parameter(torch.randn(50, device="cuda"))]
    b = [torch.nn.Parameter(p.detach().clone()) for p in a]
    opt = _steps(DeviceAdam, a)
    _steps(torch.optim.Adam, b)
    assert opt.param_groups[0]["fused"] is True
    for x, y in zip(a, b):
        torch.testing.assert_close(x, y, rtol=1e-5, atol=1e-6)


def test_replaced_parameter_keeps_a_fused_optimizers_step_on_its_device():
    """Rebalancing/migration hand a rank that had no Adam state a host step count: with a fused
    optimizer it goes to the parameter's device (fused Adam refuses a host step)."""
    from bytesplat_ns.distributed.sharding import _replace_param

    p = torch.nn.Parameter(torch.zeros(3))
    opt = torch.optim.Adam([p], lr=0.1)
    opt.param_groups[0]["fused"] = True  # as DeviceAdam on a GPU; the move itself is what is checked
    params = {"x": p}
    _replace_param(params, "x", torch.ones(5), opt, {"step": torch.tensor(7.0, dtype=torch.float64)})
    state = opt.state[params["x"]]
    assert state["step"].dtype == torch.float32 and state["step"].device == params["x"].device
    assert opt.param_groups[0]["params"][0] is params["x"]
