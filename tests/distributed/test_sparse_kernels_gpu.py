"""The sparse-grad communicator's GPU encoder/decoder (cuda/sparse_grad.cu) against its torch
implementation (GPU only; the CPU tests use the torch implementation).

Encoder: the same rows in the same order and the same values, bit for bit (empty input, all-zero,
all-non-zero, random sparsity, NaN and -0.0 entries, float32/float64, sizes around the block size).
Decoder: unique target rows (the communicator's case) are bit-identical to torch's index_add_;
duplicate targets agree to rounding (atomicAdd order); a malformed index raises. The communicator
picks the kernels for CUDA tensors and gives the dense communicator's gradients.
"""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def kernels():
    from bytesplat_ns.distributed import sparse_kernels

    sparse_kernels.load_extension()
    return sparse_kernels


def sparse_rows(m: int, G: int, density: float, dtype, seed: int) -> torch.Tensor:
    g = torch.Generator(device="cuda").manual_seed(seed)
    values = torch.randn(m, G, generator=g, device="cuda", dtype=dtype)
    keep_row = torch.rand(m, generator=g, device="cuda") < density
    keep_entry = torch.rand(m, G, generator=g, device="cuda") < 0.3  # a non-zero row may be mostly zero
    keep_entry[torch.arange(m, device="cuda"), torch.randint(0, max(G, 1), (m,), generator=g, device="cuda")] = True
    return torch.where(keep_row[:, None] & keep_entry, values, torch.zeros((), dtype=dtype, device="cuda"))


CASES = [(0, 9, 0.5), (1, 9, 1.0), (1, 9, 0.0), (255, 9, 0.1), (256, 11, 0.5), (257, 9, 1.0), (4097, 9, 0.0), (100_003, 11, 0.07), (100_003, 9, 1.0)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("m,G,density", CASES)
def test_encode_equals_torch(kernels, m, G, density, dtype):
    from bytesplat_ns.distributed import SparseGradCommunicator

    grad = sparse_rows(m, G, density, dtype, seed=m + G)
    index, values = kernels.encode(grad)
    want_index, want_values = SparseGradCommunicator.encode_torch(grad)
    assert index.dtype == torch.int32 and index.device.type == "cuda"
    assert torch.equal(index, want_index)
    assert values.shape == (want_index.numel(), G)
    assert torch.equal(values, want_values)  # no NaN here: equal values are equal bits up to -0.0, which encode keeps
    if density == 0.0:
        assert index.numel() == 0
    if density == 1.0:
        assert index.numel() == m


def test_encode_nan_and_negative_zero_like_torch(kernels):
    from bytesplat_ns.distributed import SparseGradCommunicator

    grad = torch.zeros(70, 9, device="cuda")
    grad[3, 4] = float("nan")
    grad[5, 0] = -0.0
    grad[64, 8] = 1e-30
    index, values = kernels.encode(grad)
    want_index, want_values = SparseGradCommunicator.encode_torch(grad)
    assert index.tolist() == want_index.tolist() == [3, 64]
    assert torch.equal(values.view(torch.int32), want_values.view(torch.int32))


def test_encode_non_contiguous_input(kernels):
    from bytesplat_ns.distributed import SparseGradCommunicator

    wide = sparse_rows(1000, 20, 0.3, torch.float32, seed=3)
    grad = wide[:, 5:14]  # a strided view, as the absgrad columns are sliced
    index, values = kernels.encode(grad)
    want_index, want_values = SparseGradCommunicator.encode_torch(grad)
    assert torch.equal(index, want_index) and torch.equal(values, want_values)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("k,m,rows,G", [(0, 10, 10, 9), (1, 1, 5, 9), (3000, 5000, 20000, 9), (100_000, 100_000, 400_000, 11)])
def test_decode_unique_targets_equals_torch(kernels, k, m, rows, G, dtype):
    from bytesplat_ns.distributed import SparseGradCommunicator

    g = torch.Generator(device="cuda").manual_seed(k + m)
    sent_index = torch.randperm(rows, generator=g, device="cuda")[:m]  # distinct owner rows, as in a step
    index = torch.randperm(m, generator=g, device="cuda")[:k].sort().values.to(torch.int32)
    values = torch.randn(k, G, generator=g, device="cuda", dtype=dtype)
    base = torch.randn(rows, G, generator=g, device="cuda", dtype=dtype)
    got, want = base.clone(), base.clone()
    kernels.decode(index, values, sent_index, got)
    SparseGradCommunicator.decode_torch(index, values, sent_index, want)
    assert torch.equal(got, want)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_decode_duplicates_add_up(kernels, dtype):
    from bytesplat_ns.distributed import SparseGradCommunicator

    g = torch.Generator(device="cuda").manual_seed(11)
    rows, m, k, G = 50, 400, 300, 9
    sent_index = torch.randint(0, rows, (m,), generator=g, device="cuda")  # many records per row
    index = torch.randint(0, m, (k,), generator=g, device="cuda").to(torch.int32)  # and repeated records
    values = torch.randn(k, G, generator=g, device="cuda", dtype=dtype)
    got = torch.zeros(rows, G, device="cuda", dtype=dtype)
    kernels.decode(index, values, sent_index, got)
    want = torch.zeros(rows, G, dtype=torch.float64)
    SparseGradCommunicator.decode_torch(index.cpu(), values.cpu().double(), sent_index.cpu(), want)
    tol = 1e-5 if dtype == torch.float32 else 1e-12
    assert torch.allclose(got.cpu().double(), want, rtol=tol, atol=tol)


def test_decode_rejects_out_of_range_index(kernels):
    buffer = torch.zeros(10, 9, device="cuda")
    values = torch.ones(2, 9, device="cuda")
    sent_index = torch.arange(4, device="cuda")
    with pytest.raises(ValueError, match="out of range"):
        kernels.decode(torch.tensor([0, 4], dtype=torch.int32, device="cuda"), values, sent_index, buffer)
    with pytest.raises(ValueError, match="out of range"):
        kernels.decode(torch.tensor([0, 1], dtype=torch.int32, device="cuda"), values, torch.tensor([0, 10], device="cuda"), buffer)
    # With a caller-held flag: several messages, one check at the end.
    bad = kernels.new_flag(buffer.device)
    kernels.decode(torch.tensor([0, 1], dtype=torch.int32, device="cuda"), values, sent_index, buffer, bad)
    assert int(bad.item()) == 0
    kernels.decode(torch.tensor([0, 7], dtype=torch.int32, device="cuda"), values, sent_index, buffer, bad)
    with pytest.raises(ValueError, match="out of range"):
        kernels.check_decoded(bad)


def test_communicator_uses_the_kernels_on_cuda_and_matches_dense(kernels, monkeypatch):
    """One process (the exchange hands the message to itself): sparse-grad == dense, kernels called."""
    from bytesplat_ns.distributed import CommStats, DenseCommunicator, SparseGradCommunicator

    calls = {"encode": 0, "decode": 0}
    real_encode, real_decode = kernels.encode, kernels.decode

    def spy_encode(*a):
        calls["encode"] += 1
        return real_encode(*a)

    def spy_decode(*a):
        calls["decode"] += 1
        return real_decode(*a)

    monkeypatch.setattr(kernels, "encode", spy_encode)
    monkeypatch.setattr(kernels, "decode", spy_decode)
    grads = [sparse_rows(5000, 11, 0.2, torch.float32, seed=5)]
    sent_index = [torch.randperm(20000, device="cuda")[:5000]]
    dense_buf = torch.zeros(20000, 11, device="cuda")
    sparse_buf = torch.zeros(20000, 11, device="cuda")
    DenseCommunicator().return_gradients(grads, sent_index, dense_buf, CommStats())
    SparseGradCommunicator().return_gradients(grads, sent_index, sparse_buf, CommStats())
    assert calls == {"encode": 1, "decode": 1}
    assert torch.equal(dense_buf, sparse_buf)
