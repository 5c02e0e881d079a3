// Sparse-coded gradient aggregation (ByteSplat 3): the encoder and decoder of the `sparse-grad`
// communicator (bytesplat_ns/distributed/communicators.py, built by
// bytesplat_ns/distributed/sparse_kernels.py).
//
// encode(grad [m, G]) -> (index [k] int32, values [k, G]): the rows with at least one entry != 0
//   (NaN counts as non-zero, -0.0 as zero: the same test as torch's `(grad != 0).any(1)`), in
//   ascending row order, so the message is byte-identical to the torch implementation's.
//   Two passes over the rows, one thread per row:
//     1. count: a warp ballot of the per-row flags, popc per warp, one count per block;
//     2. the block counts are prefix-summed (exclusive), which also gives k (the one host sync
//        the message size needs anyway), then every block recomputes its flags and scatters each
//        non-zero row to  block offset + offset of its warp in the block + popc(ballot & lanes
//        below it).
// decode(index [k], values [k, G], sent_index [m] int64, buffer [rows, G]): for every record i,
//   buffer[sent_index[index[i]], :] += values[i, :] with atomicAdd, one thread per value, straight
//   into the owner's gradient buffer (no intermediate dense tensor). Out-of-range indices are not
//   written; they set the int32 flag `bad` (checked by the caller once per step, so decoding the
//   messages of all peers needs no host sync: a malformed message is an error, never corruption).
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <cstdint>
#include <limits>
#include <vector>

namespace bytesplat {

namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;

template <typename scalar_t>
__device__ __forceinline__ bool row_nonzero(const scalar_t *__restrict__ grad, int64_t row, int G) {
    const scalar_t *p = grad + row * G;
    bool nz = false;
    for (int c = 0; c < G; ++c) nz |= (p[c] != scalar_t(0));
    return nz;
}

template <typename scalar_t>
__global__ void __launch_bounds__(kThreads)
    encode_count_kernel(const scalar_t *__restrict__ grad, int64_t m, int G, int32_t *__restrict__ block_counts) {
    __shared__ int warp_counts[kWarps];
    const int64_t row = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
    const bool nz = row < m && row_nonzero(grad, row, G);
    const unsigned ballot = __ballot_sync(0xffffffffu, nz);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) warp_counts[warp] = __popc(ballot);
    __syncthreads();
    if (threadIdx.x == 0) {
        int total = 0;
#pragma unroll
        for (int w = 0; w < kWarps; ++w) total += warp_counts[w];
        block_counts[blockIdx.x] = total;
    }
}

template <typename scalar_t>
__global__ void __launch_bounds__(kThreads)
    encode_scatter_kernel(const scalar_t *__restrict__ grad, int64_t m, int G,
                          const int64_t *__restrict__ block_offsets, int32_t *__restrict__ out_index,
                          scalar_t *__restrict__ out_values) {
    __shared__ int warp_offsets[kWarps];
    const int64_t row = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
    const bool nz = row < m && row_nonzero(grad, row, G);
    const unsigned ballot = __ballot_sync(0xffffffffu, nz);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) warp_offsets[warp] = __popc(ballot);
    __syncthreads();
    if (threadIdx.x == 0) {
        int acc = 0;
#pragma unroll
        for (int w = 0; w < kWarps; ++w) {
            const int c = warp_offsets[w];
            warp_offsets[w] = acc;
            acc += c;
        }
    }
    __syncthreads();
    if (!nz) return;
    const unsigned below = (1u << lane) - 1u;
    const int64_t pos = block_offsets[blockIdx.x] + warp_offsets[warp] + __popc(ballot & below);
    out_index[pos] = static_cast<int32_t>(row);
    const scalar_t *src = grad + row * G;
    scalar_t *dst = out_values + pos * G;
    for (int c = 0; c < G; ++c) dst[c] = src[c];
}

template <typename scalar_t>
__global__ void __launch_bounds__(kThreads)
    decode_kernel(const int32_t *__restrict__ index, const scalar_t *__restrict__ values, int64_t k, int G,
                  const int64_t *__restrict__ sent_index, int64_t m, scalar_t *__restrict__ buffer, int64_t rows,
                  int32_t *__restrict__ bad) {
    const int64_t e = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
    if (e >= k * G) return;
    const int64_t i = e / G;
    const int c = static_cast<int>(e - i * G);
    const int64_t j = index[i];
    if (j < 0 || j >= m) {
        *bad = 1;
        return;
    }
    const int64_t row = sent_index[j];
    if (row < 0 || row >= rows) {
        *bad = 1;
        return;
    }
    atomicAdd(buffer + row * G + c, values[e]);
}

int64_t blocks_for(int64_t n) { return (n + kThreads - 1) / kThreads; }

}  // namespace

std::vector<at::Tensor> sparse_grad_encode(const at::Tensor &grad_in) {
    TORCH_CHECK(grad_in.is_cuda(), "sparse_grad_encode: grad must be a CUDA tensor");
    TORCH_CHECK(grad_in.dim() == 2, "sparse_grad_encode: grad must be [m, G], got ", grad_in.dim(), " dims");
    TORCH_CHECK(grad_in.scalar_type() == at::kFloat || grad_in.scalar_type() == at::kDouble,
                "sparse_grad_encode: float32 or float64 gradients only");
    const c10::cuda::CUDAGuard guard(grad_in.device());
    const at::Tensor grad = grad_in.contiguous();
    const int64_t m = grad.size(0);
    const int64_t G = grad.size(1);
    TORCH_CHECK(m <= std::numeric_limits<int32_t>::max(), "sparse_grad_encode: more than 2^31-1 rows");
    auto index_opts = grad.options().dtype(at::kInt);
    if (m == 0 || G == 0) {
        return {at::empty({0}, index_opts), at::empty({0, G}, grad.options())};
    }
    const int64_t blocks = blocks_for(m);
    TORCH_CHECK(blocks <= std::numeric_limits<int32_t>::max(), "sparse_grad_encode: too many rows");
    auto stream = c10::cuda::getCurrentCUDAStream();
    at::Tensor block_counts = at::empty({blocks}, index_opts);
    AT_DISPATCH_FLOATING_TYPES(grad.scalar_type(), "sparse_grad_encode_count", [&] {
        encode_count_kernel<scalar_t><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(
            grad.data_ptr<scalar_t>(), m, static_cast<int>(G), block_counts.data_ptr<int32_t>());
    });
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    const at::Tensor inclusive = at::cumsum(block_counts, 0, at::kLong);
    const at::Tensor block_offsets = inclusive - block_counts.to(at::kLong);
    const int64_t k = inclusive[blocks - 1].item<int64_t>();  // the message size: one host sync
    at::Tensor index = at::empty({k}, index_opts);
    at::Tensor values = at::empty({k, G}, grad.options());
    if (k == 0) return {index, values};
    AT_DISPATCH_FLOATING_TYPES(grad.scalar_type(), "sparse_grad_encode_scatter", [&] {
        encode_scatter_kernel<scalar_t><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(
            grad.data_ptr<scalar_t>(), m, static_cast<int>(G), block_offsets.data_ptr<int64_t>(),
            index.data_ptr<int32_t>(), values.data_ptr<scalar_t>());
    });
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return {index, values};
}

void sparse_grad_decode(const at::Tensor &index_in, const at::Tensor &values_in, const at::Tensor &sent_index_in,
                        const at::Tensor &buffer, const at::Tensor &bad) {
    TORCH_CHECK(buffer.is_cuda() && buffer.dim() == 2 && buffer.is_contiguous(),
                "sparse_grad_decode: buffer must be a contiguous [rows, G] CUDA tensor");
    TORCH_CHECK(buffer.scalar_type() == at::kFloat || buffer.scalar_type() == at::kDouble,
                "sparse_grad_decode: float32 or float64 buffer only");
    TORCH_CHECK(index_in.is_cuda() && values_in.is_cuda() && sent_index_in.is_cuda(),
                "sparse_grad_decode: all tensors must be on the GPU");
    TORCH_CHECK(index_in.device() == buffer.device() && values_in.device() == buffer.device() &&
                    sent_index_in.device() == buffer.device(),
                "sparse_grad_decode: all tensors must be on the buffer's device");
    TORCH_CHECK(index_in.dim() == 1, "sparse_grad_decode: index must be 1-D");
    TORCH_CHECK(sent_index_in.dim() == 1, "sparse_grad_decode: sent_index must be 1-D");
    const int64_t G = buffer.size(1);
    const int64_t k = index_in.size(0);
    TORCH_CHECK(values_in.dim() == 2 && values_in.size(0) == k && values_in.size(1) == G,
                "sparse_grad_decode: values must be [", k, ", ", G, "], got ", values_in.sizes());
    TORCH_CHECK(values_in.scalar_type() == buffer.scalar_type(), "sparse_grad_decode: values and buffer dtypes differ");
    TORCH_CHECK(bad.is_cuda() && bad.device() == buffer.device() && bad.scalar_type() == at::kInt && bad.numel() >= 1 &&
                    bad.is_contiguous(),
                "sparse_grad_decode: bad must be a contiguous int32 CUDA tensor on the buffer's device");
    if (k == 0 || G == 0) return;
    const c10::cuda::CUDAGuard guard(buffer.device());
    const at::Tensor index = index_in.to(at::kInt).contiguous();
    const at::Tensor values = values_in.contiguous();
    const at::Tensor sent_index = sent_index_in.to(at::kLong).contiguous();
    const int64_t blocks = blocks_for(k * G);
    TORCH_CHECK(blocks <= std::numeric_limits<int32_t>::max(), "sparse_grad_decode: too many records");
    auto stream = c10::cuda::getCurrentCUDAStream();
    AT_DISPATCH_FLOATING_TYPES(buffer.scalar_type(), "sparse_grad_decode", [&] {
        decode_kernel<scalar_t><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(
            index.data_ptr<int32_t>(), values.data_ptr<scalar_t>(), k, static_cast<int>(G),
            sent_index.data_ptr<int64_t>(), sent_index.size(0), buffer.data_ptr<scalar_t>(), buffer.size(0),
            bad.data_ptr<int32_t>());
    });
    C10_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace bytesplat
