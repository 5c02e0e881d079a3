"""CPU emulation of the backward kernels' butterfly warp reduction (cuda/common.cuh).

``butterfly_step`` / ``warp_reduce_scatter16`` below mirror the CUDA functions of the same names
line by line, over all 32 lanes of a warp at once (``__shfl_xor_sync(v, o)`` read by lane l is lane
l ^ o's v). The tests check the documented lane <-> component mapping (the warp total of component
c ends in lanes c and c + 16), the invariant after every step, the shuffle counts, that the
kernel's atomicAdd pattern (lanes 0..K-1, one add each) fills s_acc like the per-component warp
sums of the original path, and that the pruning score (component KMAX = 11, combined with max
instead of +) comes out as the warp max at no extra shuffle, the other components unchanged. The
kernels themselves are held to the same behaviour on a GPU (tests/raster/test_bwd_reduce_gpu.py: the two
reductions give the same pruning score bit for bit and the same gradients).
"""

from __future__ import annotations

import numpy as np
import pytest

LANES = np.arange(32)
K_GRAD_COMPS = 11  # kGradComps
K_GRAD_PAD = 16  # kGradPad
K_CONTRIB = 11  # kContribComp
K_ACC_COMPS = 12  # kAccComps


class Warp:
    """Counts shuffles; shfl_xor is __shfl_xor_sync(0xffffffff, x, off) for all lanes at once."""

    def __init__(self):
        self.shuffles = 0

    def shfl_xor(self, x: np.ndarray, off: int) -> np.ndarray:
        self.shuffles += 1
        return x[LANES ^ off]


# ---- mirror of cuda/common.cuh (lane-vectorized: axis 0 is the lane) ----


def butterfly_step(warp: Warp, inp: np.ndarray, N: int, S: int, K: int, KMAX: int = -1) -> np.ndarray:
    assert inp.shape == (32, N)
    lane = LANES
    out = np.empty((32, N // 2), dtype=inp.dtype)
    bit = ((lane >> S) & 1).astype(bool)  # const bool bit = (lane >> S) & 1;
    for j in range(N // 2):  # for (int j = 0; j < N / 2; ++j) {
        if (j << (S + 1)) >= K:  # if ((j << (S + 1)) >= K) {
            out[:, j] = 0.0  # out[j] = 0.f;
            continue  # continue; }
        lo, hi = inp[:, 2 * j], inp[:, 2 * j + 1]  # const float lo = in[2 * j], hi = in[2 * j + 1];
        keep = np.where(bit, hi, lo)  # const float keep = bit ? hi : lo;
        send = np.where(bit, lo, hi)  # const float send = bit ? lo : hi;
        recv = warp.shfl_xor(send, 1 << S)  # const float recv = __shfl_xor_sync(.., send, 1 << S);
        low = KMAX - (j << (S + 1))  # const int low = KMAX - (j << (S + 1));
        # const bool is_max = low >= 0 && low < (2 << S) && (lane & ((2 << S) - 1)) == low;
        is_max = (low >= 0) & (low < (2 << S)) & ((lane & ((2 << S) - 1)) == low)
        out[:, j] = np.where(is_max, np.maximum(keep, recv), keep + recv)  # is_max ? fmaxf(..) : keep + recv
    return out


def warp_reduce_scatter16(warp: Warp, v: np.ndarray, K: int, trace=None, KMAX: int = -1) -> np.ndarray:
    assert 1 <= K <= K_GRAD_PAD and v.shape == (32, K_GRAD_PAD) and KMAX < K
    a8 = butterfly_step(warp, v, 16, 0, K, KMAX)  # butterfly_step<16, 0, K, KMAX>(v, a8, lane);
    a4 = butterfly_step(warp, a8, 8, 1, K, KMAX)  # butterfly_step<8, 1, K, KMAX>(a8, a4, lane);
    a2 = butterfly_step(warp, a4, 4, 2, K, KMAX)  # butterfly_step<4, 2, K, KMAX>(a4, a2, lane);
    a1 = butterfly_step(warp, a2, 2, 3, K, KMAX)  # butterfly_step<2, 3, K, KMAX>(a2, a1, lane);
    if trace is not None:
        trace.extend([a8, a4, a2, a1])
    recv = warp.shfl_xor(a1[:, 0], 16)  # const float recv = __shfl_xor_sync(.., a1[0], 16);
    # return (lane & 15) == KMAX ? fmaxf(a1[0], recv) : a1[0] + recv;
    return np.where((LANES & 15) == KMAX, np.maximum(a1[:, 0], recv), a1[:, 0] + recv)


# ---- the documented mapping ----


def component_of_lane(lane: int) -> int:
    """After the reduction, lane holds the warp total of component lane & 15."""
    return lane & 15


def expected_after_step(v: np.ndarray, S: int) -> np.ndarray:
    """Invariant after step S: a[lane, j] = component j * 2^(S+1) + (lane & (2^(S+1)-1)), summed
    over the lanes that agree with `lane` in every bit above S."""
    span = 1 << (S + 1)
    n = K_GRAD_PAD // span
    out = np.zeros((32, n), dtype=v.dtype)
    for lane in range(32):
        group = [m for m in range(32) if (m >> (S + 1)) == (lane >> (S + 1))]
        for j in range(n):
            c = j * span + (lane & (span - 1))
            out[lane, j] = v[group, c].sum()
    return out


def _inputs(rng, K, integer=True, garbage_padding=False):
    """Per-lane gradient vectors as the kernel builds them: g[c] for c < K, zero above (or junk,
    to check that padding never reaches lanes < K)."""
    if integer:  # exact in fp64 whatever the summation order
        v = rng.integers(-1000, 1000, size=(32, K_GRAD_PAD)).astype(np.float64)
    else:
        v = rng.standard_normal((32, K_GRAD_PAD)).astype(np.float32)
    if not garbage_padding:
        v[:, K:] = 0
    return v


@pytest.mark.parametrize("K,shuffles", [(11, 13), (9, 12), (16, 16), (1, 5), (8, 9)])
def test_component_totals_land_in_documented_lanes(K, shuffles):
    rng = np.random.default_rng(K)
    for _ in range(20):
        v = _inputs(rng, K)
        warp = Warp()
        trace = []
        total = warp_reduce_scatter16(warp, v, K, trace)
        assert warp.shuffles == shuffles
        want = v.sum(0)  # warp total per component
        for lane in range(32):
            c = component_of_lane(lane)
            if c < K:
                assert total[lane] == want[c], (lane, c)
        # every component has a home lane < 16 and its mirror lane + 16
        for c in range(K):
            assert total[c] == want[c] and total[c + 16] == want[c]
        # the per-step invariant documented in common.cuh (entries >= K are skipped -> zero)
        for S, a in enumerate(trace):
            exp = expected_after_step(v, S)
            span = 1 << (S + 1)
            for j in range(a.shape[1]):
                if j * span >= K:
                    assert np.all(a[:, j] == 0)
                else:
                    assert np.array_equal(a[:, j], exp[:, j]), (S, j)


@pytest.mark.parametrize("K", [9, 11])
def test_padding_never_leaks_into_real_components(K):
    """Even with junk in components >= K, lanes c < K get exactly the totals of components < K."""
    rng = np.random.default_rng(100 + K)
    v = _inputs(rng, K, garbage_padding=True)
    total = warp_reduce_scatter16(Warp(), v, K)
    want = v.sum(0)
    assert np.array_equal(total[:K], want[:K]) and np.array_equal(total[16:16 + K], want[:K])


@pytest.mark.parametrize("abs_grad", [True, False])
def test_block_accumulation_matches_shuffle_path(abs_grad):
    """One chunk of Gaussians over 8 warps: s_acc filled by the butterfly path (lanes < K, one
    atomicAdd each at s_acc[slot*kGradComps + lane]) equals the shuffle path (lane 0 adds the K
    warp_sums) up to fp32 reassociation; components K..10 stay zero without absgrad."""
    K = K_GRAD_COMPS if abs_grad else 9
    rng = np.random.default_rng(7)
    chunk, warps = 32, 8
    acc_b = np.zeros(chunk * K_GRAD_COMPS, dtype=np.float32)
    acc_s = np.zeros(chunk * K_GRAD_COMPS, dtype=np.float32)
    for slot in range(chunk):
        for _w in range(warps):
            g = _inputs(rng, K_GRAD_COMPS, integer=False)  # the kernel fills g[0..10] ...
            valid = rng.random(32) < 0.6
            g[~valid] = 0  # if (!valid) g[c] = 0
            if not abs_grad:
                g[:, 9] = g[:, 10] = 0  # if (!ABS) g[9] = g[10] = 0.f;
            total = warp_reduce_scatter16(Warp(), g, K)
            for lane in range(32):  # if (lane < K) atomicAdd(s_acc + slot * kGradComps + lane, total)
                if lane < K:
                    acc_b[slot * K_GRAD_COMPS + lane] += total[lane]
            sums = g[:, :K].astype(np.float64).sum(0).astype(np.float32)  # warp_sum per component
            acc_s[slot * K_GRAD_COMPS: slot * K_GRAD_COMPS + K] += sums
    np.testing.assert_allclose(acc_b, acc_s, rtol=1e-5, atol=1e-5)
    if not abs_grad:
        s = acc_b.reshape(chunk, K_GRAD_COMPS)
        assert np.all(s[:, 9:] == 0)


@pytest.mark.parametrize("abs_grad,shuffles", [(True, 13), (False, 13)])
def test_pruning_score_is_the_warp_max_at_no_extra_shuffle(abs_grad, shuffles):
    """CONTRIB: K = 12 with component 11 max-reduced (K 11 -> 12 keeps 13 shuffles; without absgrad
    components 9 and 10 are zero, 12 -> 13). Lane 11 (and 27) hold the warp max of the non-negative
    scores; every other component is the same warp sum as without the score."""
    K = K_CONTRIB + 1
    rng = np.random.default_rng(11 if abs_grad else 12)
    for _ in range(20):
        v = _inputs(rng, K)
        v[:, K_CONTRIB] = np.abs(v[:, K_CONTRIB]) * (rng.random(32) < 0.7)  # scores >= 0, some lanes none
        if not abs_grad:
            v[:, 9] = v[:, 10] = 0
        warp = Warp()
        trace = []
        total = warp_reduce_scatter16(warp, v, K, trace, KMAX=K_CONTRIB)
        assert warp.shuffles == shuffles
        assert total[K_CONTRIB] == total[K_CONTRIB + 16] == v[:, K_CONTRIB].max()
        sums = v.sum(0)
        for c in range(K_CONTRIB):
            assert total[c] == total[c + 16] == sums[c], c
        # and the per-step invariant still holds for the summed components
        for S, a in enumerate(trace):
            exp = expected_after_step(v, S)
            span = 1 << (S + 1)
            for j in range(a.shape[1]):
                for lane in range(32):
                    c = j * span + (lane & (span - 1))
                    if j * span < K and c != K_CONTRIB:
                        assert a[lane, j] == exp[lane, j], (S, j, lane)
    # with the score, the lanes that add: 0..10 (0..8 without absgrad) add, lane 11 takes the max
    lanes_add = [lane for lane in range(32) if lane != K_CONTRIB and lane < K and (abs_grad or lane < 9)]
    assert lanes_add == list(range(K_GRAD_COMPS if abs_grad else 9))
