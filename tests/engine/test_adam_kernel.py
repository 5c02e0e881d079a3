"""DeviceAdam's choice of implementation (no GPU needed): which groups take the bundled kernel, what
state it leaves, the fallbacks, and the config field (CLI default, old config.yml files).

The kernel itself is replaced here by a torch twin of cuda/adam.cu's arithmetic, run on the CPU, so
the orchestration around it (state init, step counts, lr changes, skipped params) is held against
torch's Adam; tests/engine/test_adam_kernel_gpu.py holds the real kernel against torch."""

from __future__ import annotations

import copy
import math
import warnings

import pytest
import torch
import yaml

from bytesplat_ns import optim
from bytesplat_ns.errors import BytesplatError
from bytesplat_ns.optim import DeviceAdam
from tests.helpers.adam_reference import adam_then_keep_visible


# torch's fused Adam (and so the kernel) casts beta2 to float before 1 - beta2: (1 - f32(0.999)) is
# 1.3e-5 below 0.001, the gradient term of exp_avg_sq (and, halved, the step) differs by that much
# from torch's default Adam's, which keeps 1 - beta2 in double.
DEFAULT_ADAM_RTOL = 3e-5


def _f32(x: float) -> float:
    return torch.tensor(x, dtype=torch.float32).item()


def _fma(a, b, c):
    """fmaf: the product exact in double, one rounding to float (up to a rare double rounding)."""
    return (a.double() * b.double() + c.double()).float()


def _twin_adam_step(param, grad, exp_avg, exp_avg_sq, step, lr, beta1, beta2, eps, visible=None):
    """cuda/adam.cu's float arithmetic in torch (scalars cast to float, the moments as two fmas); with
    ``visible`` ([rows] bool) only those rows change."""
    lr, beta1, beta2, eps = (torch.tensor(_f32(x)) for x in (lr, beta1, beta2, eps))
    t = torch.tensor(float(step), dtype=torch.float32)
    g = grad
    m = _fma(beta1, exp_avg, _fma(-beta1, g, g))
    g2 = g * g
    v = _fma(beta2, exp_avg_sq, _fma(-beta2, g2, g2))
    step_size = lr / (1 - beta1**t)
    bc2_sqrt = (1 - beta2**t).sqrt()
    p = param - step_size * m / (v.sqrt() / bc2_sqrt + eps)
    rows = torch.ones(param.shape[:1], dtype=torch.bool) if visible is None else visible
    rows = rows.reshape(-1, *([1] * (param.dim() - 1)))
    for current, new in ((param, p), (exp_avg, m), (exp_avg_sq, v)):
        current.copy_(torch.where(rows, new, current))


@pytest.fixture
def twin_kernel(monkeypatch):
    """CPU float32 tensors count as kernel operands and the kernel is the twin; returns its calls."""
    calls = []

    def kernel(param, grad, exp_avg, exp_avg_sq, step, lr, beta1, beta2, eps, visible=None, valid=None):
        calls.append((param, float(step), lr))
        if valid is None or bool(valid):  # the kernel reads the flag on the device
            _twin_adam_step(param, grad, exp_avg, exp_avg_sq, step, lr, beta1, beta2, eps, visible)

    def fits(t, like):
        return isinstance(t, torch.Tensor) and t.dtype == torch.float32 and t.is_contiguous() and t.shape == like.shape

    monkeypatch.setattr(optim, "_kernel_tensor", fits)
    monkeypatch.setattr(optim, "_adam_kernel", lambda: kernel)
    return calls


def _train(opt, params, steps=6, lr0=1e-2):
    gen = torch.Generator().manual_seed(1)
    for i in range(steps):
        for g in opt.param_groups:
            g["lr"] = lr0 * 0.8**i  # a scheduler's changing lr reaches every step
        for p in params:
            p.grad = torch.randn(p.shape, generator=gen)
        opt.step()


def _params(seed=0):
    torch.manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(7, 3)), torch.nn.Parameter(torch.randn(5))]


@pytest.mark.parametrize("implementation", ["bytesplat", "torch-fused", "torch"])
def test_cpu_parameters_keep_torchs_default_adam_exactly(implementation):
    a, b = _params(), _params()
    ours = DeviceAdam(a, implementation=implementation, lr=1e-2, eps=1e-15)
    theirs = torch.optim.Adam(b, lr=1e-2, eps=1e-15)
    _train(ours, a)
    _train(theirs, b)
    assert not ours.param_groups[0]["fused"]
    for x, y in zip(a, b):
        assert torch.equal(x, y)
        assert ours.state[x]["step"].device.type == "cpu" and torch.equal(ours.state[x]["step"], theirs.state[y]["step"])


def test_kernel_path_matches_adam_with_fused_state_layout(twin_kernel):
    a, b = _params(), _params()
    ours = DeviceAdam(a, lr=1e-2, eps=1e-15)
    theirs = torch.optim.Adam(b, lr=1e-2, eps=1e-15)
    _train(ours, a)
    _train(theirs, b)
    assert len(twin_kernel) == 12  # every param, every step
    assert [c[1] for c in twin_kernel[:4]] == [1.0, 1.0, 2.0, 2.0]  # the count is incremented before the update
    assert twin_kernel[-1][2] == pytest.approx(1e-2 * 0.8**5)
    for x, y in zip(a, b):
        torch.testing.assert_close(x, y, rtol=DEFAULT_ADAM_RTOL, atol=1e-7)
        for key in ("exp_avg", "exp_avg_sq"):
            torch.testing.assert_close(ours.state[x][key], theirs.state[y][key], rtol=DEFAULT_ADAM_RTOL, atol=1e-7)
        step = ours.state[x]["step"]
        assert step.dtype == torch.float32 and step.dim() == 0 and step.item() == 6.0  # torch's fused layout


def test_params_without_grad_are_skipped(twin_kernel):
    a = _params()
    opt = DeviceAdam(a, lr=1e-2)
    before = a[1].detach().clone()
    a[0].grad = torch.ones_like(a[0])
    opt.step()
    assert [c[0] is a[0] for c in twin_kernel] == [True]
    assert a[1] not in opt.state and torch.equal(a[1], before)


def test_unsupported_groups_take_torchs_step_and_the_others_the_kernel(twin_kernel):
    a, b = _params(), _params()
    groups = [{"params": [a[0]]}, {"params": [a[1]], "weight_decay": 0.1}]
    ours = DeviceAdam(groups, lr=1e-2, eps=1e-15)
    theirs = torch.optim.Adam([{"params": [b[0]]}, {"params": [b[1]], "weight_decay": 0.1}], lr=1e-2, eps=1e-15)
    _train(ours, a)
    _train(theirs, b)
    assert {id(c[0]) for c in twin_kernel} == {id(a[0])}
    assert torch.equal(a[1], b[1])  # torch's own step, bit for bit
    torch.testing.assert_close(a[0], b[0], rtol=DEFAULT_ADAM_RTOL, atol=1e-7)


# -- visible rows only (gsplat's SelectiveAdam): optim.DeviceAdam.visible_rows ---------------------


def _gaussian_params(n=37, seed=0):  # splatfacto's row layouts: 3, 4, 1 and 15x3 floats per Gaussian
    torch.manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(n, *shape)) for shape in ((3,), (4,), (1,), (15, 3))]


@pytest.mark.parametrize("path", ["kernel", "torch"])
def test_visible_rows_step_is_adam_on_those_rows_and_leaves_the_others(path, request):
    calls = request.getfixturevalue("twin_kernel") if path == "kernel" else None
    params = _gaussian_params()
    opt = DeviceAdam([{"params": [p]} for p in params], implementation="bytesplat" if path == "kernel" else "torch",
                     lr=1e-2, eps=1e-15)
    expected = [(p.detach().clone(), {}) for p in params]
    gen = torch.Generator().manual_seed(3)
    never_seen = torch.zeros(37, dtype=torch.bool)
    never_seen[[0, 5, 36]] = True
    for i in range(6):
        visible = (torch.rand(37, generator=gen) < 0.5) & ~never_seen
        grads = [torch.randn(p.shape, generator=gen) for p in params]
        for p, g in zip(params, grads):
            p.grad = g
        opt.visible_rows = visible
        opt.step()
        assert opt.visible_rows is None  # one step's
        expected = [adam_then_keep_visible(q, g, st, 1e-2, visible, foreach=False) for (q, st), g in zip(expected, grads)]
    if calls is not None:
        assert len(calls) == 6 * len(params)
    initial = _gaussian_params()
    for p, (q, st), p0 in zip(params, expected, initial):
        if path == "torch":  # torch's arithmetic on the visible rows, bit for bit
            assert torch.equal(p.detach(), q)
        else:
            torch.testing.assert_close(p.detach(), q, rtol=DEFAULT_ADAM_RTOL, atol=1e-7)
        for key in ("exp_avg", "exp_avg_sq"):
            torch.testing.assert_close(opt.state[p][key], st[key], rtol=DEFAULT_ADAM_RTOL, atol=1e-7)
        assert opt.state[p]["step"].item() == 6.0
        # rows no step showed: parameters exactly as they were, moments zero
        assert torch.equal(p.detach()[never_seen], p0.detach()[never_seen])
        assert not opt.state[p]["exp_avg"][never_seen].any() and not opt.state[p]["exp_avg_sq"][never_seen].any()
    # without visible rows the next step is Adam over every row again
    for p in params:
        p.grad = torch.ones_like(p)
    before = params[0].detach().clone()
    opt.step()
    assert (params[0].detach() != before)[never_seen].all()


def test_visible_rows_must_match_every_parameters_rows():
    params = _gaussian_params()
    opt = DeviceAdam([{"params": [p]} for p in params], lr=1e-2)
    for p in params:
        p.grad = torch.ones_like(p)
    opt.visible_rows = torch.ones(36, dtype=torch.bool)
    with pytest.raises(BytesplatError, match="no row per Gaussian"):
        opt.step()
    assert opt.visible_rows is None and not opt.state  # nothing was updated


@pytest.mark.parametrize("options", [{"amsgrad": True}, {"maximize": True}, {"foreach": True}, {"fused": False},
                                     {"implementation": "torch-fused"}, {"implementation": "torch"}])
def test_other_options_never_take_the_kernel(twin_kernel, options):
    a, b = _params(), _params()
    ours = DeviceAdam(a, lr=1e-2, **options)
    torch_options = {k: v for k, v in options.items() if k != "implementation"}
    theirs = torch.optim.Adam(b, lr=1e-2, **torch_options)
    _train(ours, a)
    _train(theirs, b)
    assert twin_kernel == []
    for x, y in zip(a, b):
        assert torch.equal(x, y)


def test_a_step_count_of_another_layout_is_converted_once(twin_kernel):
    """A state from torch's default Adam (a checkpoint, a CPU run; its count a host float32 or float64)
    keeps counting from where it was, as the float32 count on the parameter's device."""
    a, b = _params(), _params()
    theirs = torch.optim.Adam(b, lr=1e-2, eps=1e-15)
    _train(theirs, b, steps=3)
    ours = DeviceAdam(a, implementation="torch", lr=1e-2, eps=1e-15)
    _train(ours, a, steps=3)
    ours.implementation = "bytesplat"  # as if the run resumed with the kernel
    a_steps = [ours.state[p]["step"] for p in a]
    assert all(s.dtype == torch.float32 for s in a_steps)
    ours.state[a[0]]["step"] = ours.state[a[0]]["step"].double()  # float64 too (torch's default dtype float64)
    _train(ours, a, steps=2, lr0=1e-3)
    _train(theirs, b, steps=2, lr0=1e-3)
    assert [c[1] for c in twin_kernel] == [4.0, 4.0, 5.0, 5.0]
    assert ours.state[a[0]]["step"].dtype == torch.float32
    for x, y in zip(a, b):
        torch.testing.assert_close(x, y, rtol=DEFAULT_ADAM_RTOL, atol=1e-7)


def test_without_the_extension_torch_steps_and_the_build_is_not_retried(monkeypatch):
    from bytesplat_ns.raster import _wrapper
    from bytesplat_ns.raster._build import CudaBuildError

    tried = []

    def failing_ops():
        tried.append(1)
        raise CudaBuildError("no nvcc here")

    monkeypatch.setattr(optim, "_kernel_error", None)
    monkeypatch.setattr(optim, "_kernel_fits", lambda group, state: True)
    monkeypatch.setattr(_wrapper, "_ops", failing_ops)
    a, b = _params(), _params()
    ours = DeviceAdam(a, lr=1e-2)
    theirs = torch.optim.Adam(b, lr=1e-2)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _train(ours, a, steps=3)
    _train(theirs, b, steps=3)
    assert tried == [1]
    assert [str(w.message) for w in caught if "Adam steps with torch" in str(w.message)] != []
    for x, y in zip(a, b):
        assert torch.equal(x, y)


def test_step_hooks_run_once_per_step(twin_kernel):
    a = _params()
    torch.optim.Adam([torch.nn.Parameter(torch.zeros(1))])  # torch wraps Adam.step with its hook runner
    for implementation in ("bytesplat", "torch"):
        opt = DeviceAdam(a, implementation=implementation, lr=1e-2)
        seen = []
        opt.register_step_pre_hook(lambda *args: seen.append("pre"))
        opt.register_step_post_hook(lambda *args: seen.append("post"))
        _train(opt, a, steps=2)
        assert seen == ["pre", "post", "pre", "post"], implementation


def test_a_copy_keeps_its_implementation():
    for implementation in ("bytesplat", "torch"):
        opt = DeviceAdam(_params(), implementation=implementation, lr=1e-2)
        assert copy.deepcopy(opt).implementation == implementation


def test_unknown_implementation_is_a_user_error():
    with pytest.raises(BytesplatError, match="unknown Adam implementation 'cuda'"):
        DeviceAdam(_params(), implementation="cuda", lr=1.0)


def test_method_default_and_config_yml_round_trip():
    from bytesplat_ns.method_configs.bytesplat import bytesplat_config

    groups = bytesplat_config.optimizers
    assert all(g["optimizer"].implementation == "bytesplat" for g in groups.values())
    groups["means"]["optimizer"].implementation = "torch"
    try:
        loaded = yaml.load(yaml.dump(bytesplat_config), Loader=yaml.Loader)  # what ns-train writes / ns-eval reads
    finally:
        groups["means"]["optimizer"].implementation = "bytesplat"
    assert loaded.optimizers["means"]["optimizer"].implementation == "torch"
    assert loaded.optimizers["scales"]["optimizer"].implementation == "bytesplat"


@pytest.mark.parametrize("old, expected", [("false", "torch"), ("true", "bytesplat")])
def test_config_yml_written_with_fused_on_gpu_still_loads(old, expected):
    """config.yml from before the field: ``fused_on_gpu`` instead of ``implementation``."""
    from bytesplat_ns.method_configs.bytesplat import bytesplat_config

    text = yaml.dump(bytesplat_config)
    assert text.count("implementation: bytesplat") == len(bytesplat_config.optimizers)
    old_text = text.replace("implementation: bytesplat", f"fused_on_gpu: {old}")
    loaded = yaml.load(old_text, Loader=yaml.Loader)
    for group in loaded.optimizers.values():
        config = group["optimizer"]
        assert config.implementation == expected and not hasattr(config, "fused_on_gpu")
        opt = config.setup([torch.nn.Parameter(torch.zeros(3))])  # no stray keyword reaches the optimizer
        assert type(opt) is DeviceAdam and opt.implementation == expected
        assert opt.param_groups[0]["lr"] == config.lr and math.isclose(opt.param_groups[0]["eps"], config.eps)


def test_the_kernel_wrapper_checks_its_operands_before_calling_the_extension(monkeypatch):
    """Wrong operands are a RuntimeError naming the operand, raised before the extension is touched
    (on an H200 a size mismatch reaching the extension crashed the interpreter)."""
    from types import SimpleNamespace

    from bytesplat_ns.raster import _wrapper

    monkeypatch.setattr(_wrapper, "_ops", lambda: (_ for _ in ()).throw(AssertionError("extension called")))
    meta = torch.empty(8, device="meta")
    cuda_like = SimpleNamespace(is_cuda=True, device=torch.device("cuda", 0), dtype=torch.float32,
                                is_contiguous=lambda: True, numel=lambda: 8)
    with pytest.raises(RuntimeError, match="param must be on"):
        _wrapper.adam_step(meta, meta, meta, meta, meta, 1e-3, 0.9, 0.999, 1e-15)
    short = SimpleNamespace(**{**vars(cuda_like), "numel": lambda: 4})
    with pytest.raises(RuntimeError, match="exp_avg has 4 elements, param 8"):
        _wrapper.check_adam_operands(cuda_like, cuda_like, short, cuda_like, cuda_like)
    strided = SimpleNamespace(**{**vars(cuda_like), "is_contiguous": lambda: False})
    with pytest.raises(RuntimeError, match="grad must be contiguous"):
        _wrapper.check_adam_operands(cuda_like, strided, cuda_like, cuda_like, cuda_like)
    double = SimpleNamespace(**{**vars(cuda_like), "dtype": torch.float64})
    with pytest.raises(RuntimeError, match="exp_avg_sq must be float32"):
        _wrapper.check_adam_operands(cuda_like, cuda_like, cuda_like, double, cuda_like)
    with pytest.raises(RuntimeError, match="step must be one float32"):
        _wrapper.check_adam_operands(cuda_like, cuda_like, cuda_like, cuda_like, short)


@pytest.mark.parametrize("one_pass", [False, True])
def test_a_step_flagged_invalid_on_the_device_changes_nothing(twin_kernel, one_pass):
    """step_valid False (the step's tile lists did not fit their room): parameters, moments and step counts
    stay as they are, in DeviceAdam.step and in the one pass; True: the plain step."""
    from bytesplat_ns.optim import step_in_one_pass

    a, b = _params(), _params()
    ours = DeviceAdam(a, lr=1e-2, eps=1e-15)
    plain = DeviceAdam(b, lr=1e-2, eps=1e-15)
    gen = torch.Generator().manual_seed(3)
    grads = [[torch.randn(p.shape, generator=gen) for p in a] for _ in range(3)]
    junk = [torch.randn(p.shape, generator=gen) for p in a]

    def step(opt, params, g, valid=None):
        for p, gp in zip(params, g):
            p.grad = gp.clone()
        opt.step_valid = valid
        step_in_one_pass([opt]) if one_pass else opt.step()
        assert opt.step_valid is None  # one step's

    step(ours, a, grads[0], torch.tensor(True))
    step(ours, a, junk, torch.tensor(False))
    step(ours, a, grads[1])
    step(ours, a, junk, torch.tensor(False))
    step(ours, a, grads[2], torch.tensor(True))
    for g in grads:
        step(plain, b, g)
    for x, y in zip(a, b):
        assert torch.equal(x, y)
        for key in ("exp_avg", "exp_avg_sq", "step"):
            assert torch.equal(ours.state[x][key], plain.state[y][key]), key


def test_a_step_decided_on_the_device_needs_the_kernel():
    from bytesplat_ns.errors import SettingError

    params = _params()
    opt = DeviceAdam(params, implementation="torch", lr=1e-2)
    for p in params:
        p.grad = torch.ones_like(p)
    opt.step_valid = torch.tensor(True)
    assert not opt.decides_on_device()
    with pytest.raises(SettingError, match="needs bytesplat's Adam kernel"):
        opt.step()
