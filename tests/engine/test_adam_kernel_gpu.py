"""The bundled Adam kernel (cuda/adam.cu via optim.DeviceAdam) against torch.optim.Adam on the GPU:
the same parameters and states after steps with a changing lr (vector and scalar paths), state_dicts
that move between the two, and steps after gsplat's densification surgery on the state."""

from __future__ import annotations

import io

import pytest
import torch

from bytesplat_ns.optim import DeviceAdam
from bytesplat_ns.raster import _wrapper
from tests.helpers.adam_reference import adam_then_keep_visible

pytestmark = pytest.mark.gpu

EPS = 1e-15  # nerfstudio's splatfacto eps
SHAPES = [(1,), (3,), (5,), (1000003,), (2001, 15, 3)]
# Against torch's fused Adam, whose arithmetic the kernel repeats: 1e-6. Against its foreach Adam:
# fused casts beta2 to float before 1 - beta2 ((1 - f32(0.999)) is 1.3e-5 below 0.001) where foreach
# keeps it in double, so exp_avg_sq (and, halved, the step) differ by that much between torch's two.
RTOL = {"fused": 1e-6, "foreach": 3e-5}


@pytest.fixture
def kernel_calls(monkeypatch):
    """Counts the kernel's launches (so a test knows the kernel, not a fallback, ran)."""
    calls = []
    real = _wrapper.adam_step

    def counted(param, *args):
        calls.append(param.shape)
        real(param, *args)

    monkeypatch.setattr(_wrapper, "adam_step", counted)
    return calls


def _param(shape, seed=0, offset=0):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    n = torch.Size(shape).numel()
    flat = torch.randn(n + offset, generator=gen, device="cuda")
    # offset > 0: the tensor starts 4*offset bytes into its storage (not 16-byte aligned)
    return torch.nn.Parameter(flat[offset:].view(shape))


def _train(opt, params, steps, first=0, lr0=1e-2):
    for i in range(first, first + steps):
        for g in opt.param_groups:
            g["lr"] = lr0 * 0.9**i  # a scheduler's changing lr
        for k, p in enumerate(params):
            gen = torch.Generator(device="cuda").manual_seed(1000 * i + k)
            p.grad = torch.randn(p.shape, generator=gen, device="cuda") * (0.1 + k)
        opt.step()


def _close(x, y, rtol):
    """Within rtol of each value, or of the tensor's largest for values that cross zero."""
    torch.testing.assert_close(x, y, rtol=rtol, atol=rtol * float(y.abs().max()) if y.numel() else 0.0)


def _assert_same(ours, a, theirs, b, rtol=RTOL["fused"]):
    for x, y in zip(a, b):
        _close(x.detach(), y.detach(), rtol)
        for key in ("exp_avg", "exp_avg_sq"):
            _close(ours.state[x][key], theirs.state[y][key], rtol)
        assert ours.state[x]["step"].item() == theirs.state[y]["step"].item()


@pytest.mark.parametrize("reference", ["fused", "foreach"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_kernel_matches_torch_adam(shape, reference, kernel_calls):
    a, b = [_param(shape)], [_param(shape)]
    ours = DeviceAdam(a, lr=1e-2, eps=EPS)
    theirs = torch.optim.Adam(b, lr=1e-2, eps=EPS, **{reference: True})
    _train(ours, a, 20)
    _train(theirs, b, 20)
    assert len(kernel_calls) == 20
    _assert_same(ours, a, theirs, b, RTOL[reference])
    step = ours.state[a[0]]["step"]
    assert step.dtype == torch.float32 and step.device == a[0].device and step.item() == 20.0


@pytest.mark.parametrize("offset", [1, 2, 3])
def test_unaligned_tensors_take_the_scalar_path_and_match(offset, kernel_calls):
    a, b = [_param((1000003,), offset=offset)], [_param((1000003,), offset=offset)]
    assert a[0].data_ptr() % 16 != 0
    ours = DeviceAdam(a, lr=1e-2, eps=EPS)
    theirs = torch.optim.Adam(b, lr=1e-2, eps=EPS, fused=True)
    _train(ours, a, 20)
    _train(theirs, b, 20)
    assert len(kernel_calls) == 20
    _assert_same(ours, a, theirs, b)


def test_splatfacto_groups_in_one_optimizer_and_params_without_grad(kernel_calls):
    shapes = [(4097, 3), (4097, 4), (4097, 15, 3), (4097, 1)]
    a = [_param(s, seed=i) for i, s in enumerate(shapes)]
    b = [_param(s, seed=i) for i, s in enumerate(shapes)]
    ours = DeviceAdam([{"params": [p]} for p in a], lr=1e-2, eps=EPS)
    theirs = torch.optim.Adam([{"params": [p]} for p in b], lr=1e-2, eps=EPS, fused=True)
    _train(ours, a, 5)
    _train(theirs, b, 5)
    a[1].grad = b[1].grad = None  # skipped by both: no update, no count
    for opt in (ours, theirs):
        opt.step()
    assert len(kernel_calls) == 5 * 4 + 3
    _assert_same(ours, a, theirs, b)
    assert ours.state[a[1]]["step"].item() == 5.0


def test_one_pass_over_several_optimizers_is_each_ones_own_step(kernel_calls):
    """optim.step_in_one_pass (the trainer's default): bit for bit what each DeviceAdam's own step gives."""
    from bytesplat_ns.optim import step_in_one_pass

    shapes = [(4097, 3), (4097, 4), (4097, 15, 3), (4097, 1)]
    a = [_param(s, seed=i) for i, s in enumerate(shapes)]
    b = [_param(s, seed=i) for i, s in enumerate(shapes)]
    own = [DeviceAdam([p], lr=1e-2 * (k + 1), eps=EPS) for k, p in enumerate(a)]
    passed = [DeviceAdam([p], lr=1e-2 * (k + 1), eps=EPS, betas=(0.9, 0.999)) for k, p in enumerate(b)]
    for i in range(4):
        for params in (a, b):
            for k, p in enumerate(params):
                gen = torch.Generator(device="cuda").manual_seed(1000 * i + k)
                p.grad = torch.randn(p.shape, generator=gen, device="cuda")
        for opt in own:
            opt.step()
        step_in_one_pass(passed)
    assert len(kernel_calls) == 2 * 4 * len(shapes)
    for x, y, o, q in zip(a, b, own, passed):
        assert torch.equal(x, y)
        assert all(torch.equal(o.state[x][k], q.state[y][k]) for k in ("step", "exp_avg", "exp_avg_sq"))


def _roundtrip(state_dict):
    buf = io.BytesIO()
    torch.save(state_dict, buf)  # as a checkpoint file
    buf.seek(0)
    return torch.load(buf, weights_only=False)


@pytest.mark.parametrize("reference", ["fused", "foreach"])
def test_state_dict_moves_between_ours_and_torchs(reference, kernel_calls):
    shape = (2001, 15, 3)
    # ours -> torch
    a, b = [_param(shape)], [_param(shape)]
    ours = DeviceAdam(a, lr=1e-2, eps=EPS)
    _train(ours, a, 10)
    with torch.no_grad():
        b[0].copy_(a[0])
    theirs = torch.optim.Adam(b, lr=1e-2, eps=EPS, **{reference: True})
    theirs.load_state_dict(_roundtrip(ours.state_dict()))
    _train(ours, a, 10, first=10)
    _train(theirs, b, 10, first=10)
    _assert_same(ours, a, theirs, b)
    # torch -> ours
    c, d = [_param(shape, seed=3)], [_param(shape, seed=3)]
    theirs = torch.optim.Adam(c, lr=1e-2, eps=EPS, **{reference: True})
    _train(theirs, c, 10)
    with torch.no_grad():
        d[0].copy_(c[0])
    ours = DeviceAdam(d, lr=1e-2, eps=EPS)
    ours.load_state_dict(_roundtrip(theirs.state_dict()))
    calls = len(kernel_calls)
    _train(theirs, c, 10, first=10)
    _train(ours, d, 10, first=10)
    assert len(kernel_calls) == calls + 10
    _assert_same(ours, d, theirs, c, RTOL[reference])
    assert ours.state[d[0]]["step"].is_cuda and ours.state[d[0]]["step"].dtype == torch.float32


def test_step_after_gsplat_state_surgery(kernel_calls):
    """gsplat's densification (remove, duplicate) rebuilds param, exp_avg and exp_avg_sq and keeps
    the step count: the kernel steps the new tensors as torch's fused Adam does."""
    from gsplat.strategy import ops

    n = 3001
    runs = {}
    for name, make in (("ours", lambda ps: DeviceAdam(ps, lr=1e-2, eps=EPS)),
                       ("theirs", lambda ps: torch.optim.Adam(ps, lr=1e-2, eps=EPS, fused=True))):
        params = {"means": _param((n, 3)), "sh": _param((n, 15, 3), seed=1)}
        optimizers = {k: make([{"params": [p], "name": k}]) for k, p in params.items()}
        order = ["means", "sh"]
        for i in range(8):
            for k in order:
                opt = optimizers[k]
                for g in opt.param_groups:
                    g["lr"] = 1e-2 * 0.9**i
                p = params[k]
                gen = torch.Generator(device="cuda").manual_seed(1000 * i + order.index(k))
                p.grad = torch.randn(p.shape, generator=gen, device="cuda")
                opt.step()
            if i == 2:
                drop = torch.arange(len(params["means"]), device="cuda") % 7 == 3
                ops.remove(params, optimizers, {}, drop)  # rows removed
            if i == 4:
                grow = torch.arange(len(params["means"]), device="cuda") % 5 == 1
                ops.duplicate(params, optimizers, {}, grow)  # rows appended (zero state)
        runs[name] = (params, optimizers)
    (pa, oa), (pb, ob) = runs["ours"], runs["theirs"]
    assert len(kernel_calls) == 8 * 2
    expected_rows = n - (n + 3) // 7
    expected_rows += (expected_rows + 3) // 5
    for k in pa:
        assert pa[k].shape[0] == expected_rows and pa[k].is_contiguous()
        _assert_same(oa[k], [pa[k]], ob[k], [pb[k]])


def test_kernel_rejects_what_it_cannot_step():
    p = torch.zeros(8, device="cuda")
    step = torch.ones((), device="cuda")
    args = (1e-3, 0.9, 0.999, 1e-15)
    with pytest.raises(RuntimeError, match="must be contiguous"):
        _wrapper.adam_step(p, torch.zeros(16, device="cuda")[::2], torch.zeros_like(p), torch.zeros_like(p), step,
                           *args)
    with pytest.raises(RuntimeError, match="must be float32"):
        _wrapper.adam_step(p, p.double(), torch.zeros_like(p), torch.zeros_like(p), step, *args)
    with pytest.raises(RuntimeError, match="step must be one float32"):
        _wrapper.adam_step(p, p.clone(), torch.zeros_like(p), torch.zeros_like(p), step.cpu(), *args)
    with pytest.raises(RuntimeError, match="has 4 elements"):
        _wrapper.adam_step(p, p.clone(), torch.zeros(4, device="cuda"), torch.zeros_like(p), step, *args)


def test_autograd_sees_the_in_place_update(kernel_calls):
    p = _param((1000,))
    opt = DeviceAdam([p], lr=1e-2)
    saved = (p * p).sum()  # the graph keeps p for its backward
    p.grad = torch.ones_like(p)
    version = p._version
    opt.step()
    assert len(kernel_calls) == 1 and p._version > version
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        saved.backward()


def test_zero_sized_parameter(kernel_calls):
    a = [torch.nn.Parameter(torch.zeros(0, 3, device="cuda"))]
    opt = DeviceAdam(a, lr=1e-2)
    a[0].grad = torch.zeros_like(a[0])
    opt.step()
    assert opt.state[a[0]]["step"].item() == 1.0 and len(kernel_calls) == 1


# -- visible rows only (optim.DeviceAdam.visible_rows; cuda/adam.cu's row mask) -----------------------


# rows of 1, 3, 4 and 45 floats (opacities, means, quats, features_rest); offset 1: the scalar path
@pytest.mark.parametrize("shape,offset", [((100003, 1), 0), ((100003, 3), 0), ((100003, 4), 0), ((20011, 15, 3), 0),
                                          ((100003, 3), 1), ((20011, 15, 3), 3)],
                         ids=lambda v: "x".join(map(str, v)) if isinstance(v, tuple) else f"offset{v}")
@pytest.mark.parametrize("implementation", ["bytesplat", "torch-fused"])
def test_visible_rows_only(shape, offset, implementation, kernel_calls):
    p = _param(shape, offset=offset)
    initial = p.detach().clone()
    opt = DeviceAdam([p], implementation=implementation, lr=1e-2, eps=EPS)
    expected, state = initial.clone(), {}
    gen = torch.Generator(device="cuda").manual_seed(7)
    never = torch.zeros(shape[0], dtype=torch.bool, device="cuda")
    never[::97] = True
    for i in range(8):
        visible = (torch.rand(shape[0], generator=gen, device="cuda") < 0.4) & ~never
        p.grad = torch.randn(p.shape, generator=gen, device="cuda")
        opt.visible_rows = visible
        opt.step()
        expected, state = adam_then_keep_visible(expected, p.grad, state, 1e-2, visible, eps=EPS, fused=True)
    assert len(kernel_calls) == (8 if implementation == "bytesplat" else 0)
    # the kernel repeats fused Adam's float arithmetic; masked_adam_step is torch's single-tensor Adam (1 - beta2 in double)
    rtol = RTOL["fused"] if implementation == "bytesplat" else RTOL["foreach"]
    _close(p.detach(), expected, rtol)
    for key in ("exp_avg", "exp_avg_sq"):
        _close(opt.state[p][key], state[key], rtol)
    assert opt.state[p]["step"].item() == 8.0
    assert torch.equal(p.detach()[never], initial[never])  # never visible: untouched, bit for bit
    assert not opt.state[p]["exp_avg"][never].any() and not opt.state[p]["exp_avg_sq"][never].any()


def test_visible_rows_operand_checks():
    p = _param((16, 3))
    step = torch.ones((), device="cuda")
    args = (p, p.clone(), torch.zeros_like(p), torch.zeros_like(p), step, 1e-3, 0.9, 0.999, 1e-15)
    with pytest.raises(RuntimeError, match="visible has 15 rows"):
        _wrapper.adam_step(*args, torch.ones(15, dtype=torch.bool, device="cuda"))
    with pytest.raises(RuntimeError, match="1-D bool tensor"):
        _wrapper.adam_step(*args, torch.ones(16, device="cuda"))
