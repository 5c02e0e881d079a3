"""The kernels' per-pixel falloff math (cuda/common.cuh: staged_conic, falloff_exponent, falloff,
falloff_exponent_grads, falloff_grad_scale) run on the CPU, both forms (expf and 2^q from the
prescaled conic), against float64 autograd of the reference definition alpha = o * exp(-sigma).

The helpers are ``__host__ __device__``: a small host program compiled by nvcc calls them in the
order backward_slots does, so a sign or scale slip in the 2^q form fails here, without a GPU. On the
host 2^q is exp2f; the GPU's ex2.approx (about 2 ulp) is held against the reference by the GPU tests
(tests/raster/test_fused_gpu.py, ``fast_exp``).
"""

from __future__ import annotations

import subprocess

import pytest
import torch

from tests.helpers.nvcc import CUDA_DIR, find_nvcc

PROGRAM = r"""
#include <cstdio>
#include "common.cuh"
using namespace bytesplat;

// stdin: lines "a b c mx my px py o"; stdout per line and form (FASTEXP 0, then 1):
// "sigma>=0 alpha d/dmx d/dmy d/da d/db d/dc kept", the gradients of the unclamped alpha = o*falloff,
// kept: whether the kernels composite the pixel (falloff_kept).
template <bool FASTEXP>
void one(float a, float b, float c, float mx, float my, float px, float py, float o) {
    const float3 k = staged_conic<FASTEXP>(a, b, c);
    const float dx = mx - px, dy = my - py;
    const float e = falloff_exponent<FASTEXP>(k.x, k.y, k.z, dx, dy);
    const float vis = falloff<FASTEXP>(e);
    const float v_alpha = 1.f;  // dL/dalpha = 1: the gradients of alpha itself
    const float v_e = FASTEXP ? o * vis * v_alpha : -o * vis * v_alpha;  // as backward_slots
    float g[5];
    falloff_exponent_grads<FASTEXP>(k.x, k.y, k.z, dx, dy, v_e, g);
    std::printf("%d %.9g", int(sigma_nonnegative<FASTEXP>(e)), o * vis);
    for (int i = 0; i < 5; ++i) std::printf(" %.9g", g[i] * falloff_grad_scale<FASTEXP>(i));
    std::printf(" %d\n", int(falloff_kept<FASTEXP>(e, fminf(kAlphaMax, o * vis))));
}

int main() {
    float a, b, c, mx, my, px, py, o;
    while (std::scanf("%f %f %f %f %f %f %f %f", &a, &b, &c, &mx, &my, &px, &py, &o) == 8) {
        one<false>(a, b, c, mx, my, px, py, o);
        one<true>(a, b, c, mx, my, px, py, o);
    }
    return 0;
}
"""


@pytest.fixture(scope="module")
def falloff_program(tmp_path_factory):
    nvcc = find_nvcc()
    if nvcc is None:
        pytest.skip("nvcc not found")
    d = tmp_path_factory.mktemp("falloff")
    (d / "falloff.cu").write_text(PROGRAM)
    exe = d / "falloff"
    proc = subprocess.run([nvcc, "-std=c++17", "-arch=sm_90", "-I", str(CUDA_DIR), "-o", str(exe), str(d / "falloff.cu")],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"nvcc failed:\n{proc.stderr[-4000:]}"
    return exe


def _cases(n: int = 400, seed: int = 0) -> torch.Tensor:
    """[n, 8] (a, b, c, mx, my, px, py, o): conics of 2D Gaussians 0.3-30 px wide at any angle, pixels
    within about 4 sigma of the mean, opacities 0.01-1; plus one indefinite conic (sigma < 0 there)."""
    g = torch.Generator().manual_seed(seed)
    theta = torch.rand(n, generator=g, dtype=torch.float64) * torch.pi
    s1, s2 = (0.3 * 100 ** torch.rand(n, generator=g, dtype=torch.float64) for _ in range(2))
    cos, sin = theta.cos(), theta.sin()
    # conic = R diag(1/s1^2, 1/s2^2) R^T
    a = cos**2 / s1**2 + sin**2 / s2**2
    c = sin**2 / s1**2 + cos**2 / s2**2
    b = cos * sin * (1 / s1**2 - 1 / s2**2)
    mx, my = torch.rand(n, generator=g, dtype=torch.float64) * 64, torch.rand(n, generator=g, dtype=torch.float64) * 64
    r = torch.randn(n, 2, generator=g, dtype=torch.float64) * torch.stack([s1, s2], -1) * 1.5
    px, py = mx + r[:, 0], my + r[:, 1]
    o = 0.01 + 0.99 * torch.rand(n, generator=g, dtype=torch.float64)
    rows = torch.stack([a, b, c, mx, my, px, py, o], -1)
    # sigma NaN: a NaN conic entry, an infinite one at zero offset, a NaN mean
    nan = torch.tensor([[float("nan"), 0.0, 1.0, 10.0, 10.0, 10.5, 10.5, 0.8],
                        [float("inf"), 0.0, 1.0, 10.0, 10.0, 10.0, 10.5, 0.8],
                        [1.0, 0.0, 1.0, float("nan"), 10.0, 10.5, 10.5, 0.8]], dtype=torch.float64)
    indefinite = torch.tensor([[0.5, 2.0, 0.5, 10.0, 10.0, 11.0, 9.0, 0.8]], dtype=torch.float64)
    return torch.cat([rows, nan, indefinite]).float().double()  # the values the program reads (float32)


def _reference(cases: torch.Tensor):
    """alpha = o*exp(-sigma) and its gradients wrt (mx, my, a, b, c) in float64, and sigma >= 0."""
    x = cases.clone().requires_grad_(True)
    a, b, c, mx, my, px, py, o = x.unbind(-1)
    dx, dy = mx - px, my - py
    sigma = 0.5 * (a * dx * dx + c * dy * dy) + b * dx * dy
    alpha = o * torch.exp(-sigma)
    (grad,) = torch.autograd.grad(alpha.sum(), x)
    return alpha.detach(), grad[:, [3, 4, 0, 1, 2]], (sigma >= 0).detach()


def test_both_falloff_forms_match_the_reference(falloff_program):
    cases = _cases()
    text = "\n".join(" ".join(f"{v:.9g}" for v in row.tolist()) for row in cases)
    proc = subprocess.run([str(falloff_program)], input=text, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    out = torch.tensor([[float(v) for v in line.split()] for line in proc.stdout.splitlines()], dtype=torch.float64)
    assert out.shape == (2 * len(cases), 8)
    alpha_ref, grad_ref, nonneg_ref = _reference(cases)
    for form, rows in (("expf", out[0::2]), ("2^q", out[1::2])):
        nonneg, alpha, grad, kept = rows[:, 0].bool(), rows[:, 1], rows[:, 2:7], rows[:, 7].bool()
        assert torch.equal(nonneg, nonneg_ref), form
        assert torch.equal(kept, nonneg & (alpha.clamp_max(0.999) >= 1 / 255)), form
        assert not bool(nonneg_ref[-1]), "the indefinite conic has sigma < 0 at its pixel"
        # a NaN exponent: not composited (fminf alone would give it alpha 0.999)
        assert not bool(kept[-4:-1].any()) and bool(alpha[-4:-1].isnan().all()), form
        keep = nonneg_ref & (alpha_ref >= 1 / 255)  # the pixels the kernels composite
        assert int(keep.sum()) > 100
        rel = ((alpha - alpha_ref).abs() / alpha_ref)[keep]
        assert float(rel.max()) <= 1e-5, f"{form}: alpha rel err {float(rel.max()):.3g}"
        # each gradient component against its largest magnitude over the composited pixels
        for j, name in enumerate(("mean x", "mean y", "conic a", "conic b", "conic c")):
            ref, got = grad_ref[keep, j], grad[keep, j]
            err = float((got - ref).abs().max() / ref.abs().max())
            assert err <= 1e-5, f"{form}: d alpha / d {name} rel err {err:.3g}"
            # and per pixel where the gradient is not tiny (a sign slip cannot hide in the max)
            big = ref.abs() > 1e-3 * ref.abs().max()
            assert torch.allclose(got[big], ref[big], rtol=1e-4, atol=0), f"{form}: {name} per pixel"
