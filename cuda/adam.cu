// One Adam step over one float32 parameter tensor (bytesplat_ns/optim.py DeviceAdam), with exactly
// torch.optim.Adam's arithmetic for amsgrad=False, weight_decay=0, maximize=False, written as the
// fused CUDA kernel of the installed torch writes it (ATen/native/cuda/fused_adam_utils.cuh, torch
// 2.14: every scalar cast to float, the moments as two fmas), so both round the same way:
//   t         = *step_count                 (already incremented by the caller, as torch does)
//   m         = fma(beta1, m, fma(-beta1, g, g))                 = beta1 m + (1 - beta1) g
//   v         = fma(beta2, v, fma(-beta2, g*g, g*g))             = beta2 v + (1 - beta2) g^2
//   bc1       = 1 - beta1^t,  bc2_sqrt = sqrt(1 - beta2^t)
//   param    -= (lr / bc1) * m / (sqrt(v) / bc2_sqrt + eps)
//
// Why it is faster than torch's fused Adam on a few huge tensors: Adam is bound by DRAM traffic, 28
// bytes per float (read param, grad, m, v; write param, m, v), and this kernel moves nothing else:
// every thread streams float4s of the four arrays (16-byte loads, a scalar tail when a pointer is
// not 16-byte aligned or the size is not a multiple of 4), the bias corrections are computed once
// per thread, and one grid-stride wave sized to the GPU replaces torch's block per 64K-element chunk
// and its tensor-list metadata.
//
// With a row mask (`visible`, one bool per Gaussian) only the visible rows are updated, as gsplat's
// SelectiveAdam: Adam's arithmetic on those rows, the others left as they are. With `valid` (one bool
// on the device) the whole step is made on the GPU's word: false leaves the tensor and its moments as
// they are (a training step whose tile lists did not fit their buffer, bytesplat_ns/pair_capacity.py;
// the caller adds the same flag, not 1, to the step count).
#include <ATen/ATen.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <algorithm>
#include <atomic>
#include <cstdint>

namespace bytesplat {

namespace {

constexpr int kAdamThreads = 256;

struct AdamScalars {
    float lr, beta1, beta2, eps;  // cast from the optimizer's doubles, as torch casts them
};

struct AdamFactors {
    float step_size;        // lr / bias_correction1
    float bc2_sqrt;         // sqrt(bias_correction2)
};

__device__ __forceinline__ AdamFactors adam_factors(const AdamScalars &s, const float *step_count) {
    const float t = *step_count;
    const float bc1 = 1.f - ::powf(s.beta1, t);
    const float bc2 = 1.f - ::powf(s.beta2, t);
    return {s.lr / bc1, ::sqrtf(bc2)};
}

__device__ __forceinline__ void adam_update(float &p, float g, float &m, float &v, const AdamScalars &s,
                                            const AdamFactors &f) {
    m = ::fmaf(s.beta1, m, ::fmaf(-s.beta1, g, g));
    const float g2 = g * g;
    v = ::fmaf(s.beta2, v, ::fmaf(-s.beta2, g2, g2));
    const float denom = ::sqrtf(v) / f.bc2_sqrt + s.eps;
    p -= f.step_size * m / denom;
}

// Row visibility (gsplat's SelectiveAdam): with `visible` set, element e belongs to row e / row_size
// and is updated only when visible[row]; the other rows' parameters and moments are not touched (the
// step count is the tensor's, as for every row). Rows are located incrementally from one division
// per float4.
struct RowMask {
    const bool *visible;  // [rows] or nullptr: every element is updated
    int64_t row_size;     // floats per row
};

__device__ __forceinline__ bool element_visible(const RowMask &mask, int64_t e) {
    return mask.visible == nullptr || mask.visible[e / mask.row_size];
}

// kVec: all four pointers are 16-byte aligned, so elements [0, 4 * (n / 4)) go as float4s and
// the last n % 4 as floats; otherwise every element goes as a float. A float4 none of whose floats
// is visible is neither read nor written.
template <bool kVec>
__global__ void __launch_bounds__(kAdamThreads)
    adam_step_kernel(float *__restrict__ param, const float *__restrict__ grad, float *__restrict__ exp_avg,
                     float *__restrict__ exp_avg_sq, int64_t n, const float *__restrict__ step_count,
                     AdamScalars s, RowMask mask, const bool *__restrict__ valid) {
    if (valid != nullptr && !*valid) return;
    const AdamFactors f = adam_factors(s, step_count);
    const int64_t stride = static_cast<int64_t>(gridDim.x) * kAdamThreads;
    const int64_t tid = static_cast<int64_t>(blockIdx.x) * kAdamThreads + threadIdx.x;
    int64_t scalar_start = 0;
    if (kVec) {
        const int64_t n4 = n / 4;
        float4 *p4 = reinterpret_cast<float4 *>(param);
        const float4 *g4 = reinterpret_cast<const float4 *>(grad);
        float4 *m4 = reinterpret_cast<float4 *>(exp_avg);
        float4 *v4 = reinterpret_cast<float4 *>(exp_avg_sq);
        for (int64_t i = tid; i < n4; i += stride) {
            bool use[4] = {true, true, true, true};
            if (mask.visible != nullptr) {
                int64_t row = (4 * i) / mask.row_size, col = 4 * i - row * mask.row_size;
                for (int k = 0; k < 4; ++k) {
                    use[k] = mask.visible[row];
                    if (++col == mask.row_size) { ++row; col = 0; }
                }
                if (!(use[0] || use[1] || use[2] || use[3])) continue;
            }
            float4 p = p4[i], m = m4[i], v = v4[i];
            const float4 g = g4[i];
            if (use[0]) adam_update(p.x, g.x, m.x, v.x, s, f);
            if (use[1]) adam_update(p.y, g.y, m.y, v.y, s, f);
            if (use[2]) adam_update(p.z, g.z, m.z, v.z, s, f);
            if (use[3]) adam_update(p.w, g.w, m.w, v.w, s, f);
            p4[i] = p;
            m4[i] = m;
            v4[i] = v;
        }
        scalar_start = n4 * 4;
    }
    for (int64_t i = scalar_start + tid; i < n; i += stride) {
        if (!element_visible(mask, i)) continue;
        float p = param[i], m = exp_avg[i], v = exp_avg_sq[i];
        adam_update(p, grad[i], m, v, s, f);
        param[i] = p;
        exp_avg[i] = m;
        exp_avg_sq[i] = v;
    }
}

void check_operand(const at::Tensor &t, const at::Tensor &param, const char *name) {
    TORCH_CHECK(t.is_cuda() && t.device() == param.device(), "adam_step: ", name, " must be on ", param.device());
    TORCH_CHECK(t.scalar_type() == at::kFloat, "adam_step: ", name, " must be float32, got ", t.scalar_type());
    TORCH_CHECK(t.is_contiguous(), "adam_step: ", name, " must be contiguous");
    TORCH_CHECK(t.numel() == param.numel(), "adam_step: ", name, " has ", t.numel(), " elements, param ",
                param.numel());
}

using AdamKernel = void (*)(float *, const float *, float *, float *, int64_t, const float *, AdamScalars, RowMask,
                           const bool *);

// Blocks of `kernel` the whole GPU holds at once: the grid-stride grid is exactly one full wave (a
// larger grid would leave a partly filled second wave holding an equal share of the work). Cached
// per variant and device: six launches a training step need not query the runtime each time.
int64_t resident_blocks(AdamKernel kernel, bool vec, int device) {
    constexpr int kCachedDevices = 16;
    static std::atomic<int64_t> cache[2][kCachedDevices] = {};
    const bool cached = device >= 0 && device < kCachedDevices;
    if (cached) {
        const int64_t known = cache[vec][device].load(std::memory_order_relaxed);
        if (known > 0) return known;
    }
    int sms = 0, per_sm = 0;
    C10_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
    C10_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kAdamThreads, 0));
    const int64_t blocks = static_cast<int64_t>(std::max(sms, 1)) * std::max(per_sm, 1);
    if (cached) cache[vec][device].store(blocks, std::memory_order_relaxed);
    return blocks;
}

bool aligned16(const at::Tensor &t) { return reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0; }

}  // namespace

void adam_step(at::Tensor param, const at::Tensor &grad, at::Tensor exp_avg, at::Tensor exp_avg_sq,
               const at::Tensor &step, double lr, double beta1, double beta2, double eps,
               const c10::optional<at::Tensor> &visible, const c10::optional<at::Tensor> &valid) {
    check_operand(param, param, "param");
    check_operand(grad, param, "grad");
    check_operand(exp_avg, param, "exp_avg");
    check_operand(exp_avg_sq, param, "exp_avg_sq");
    TORCH_CHECK(step.is_cuda() && step.device() == param.device() && step.scalar_type() == at::kFloat &&
                    step.numel() == 1,
                "adam_step: step must be one float32 on ", param.device());
    const int64_t n = param.numel();
    RowMask mask{nullptr, 1};
    if (visible.has_value()) {
        const at::Tensor &rows = *visible;
        TORCH_CHECK(rows.is_cuda() && rows.device() == param.device() && rows.scalar_type() == at::kBool &&
                        rows.is_contiguous() && rows.dim() == 1,
                    "adam_step: visible must be a contiguous 1-D bool tensor on ", param.device());
        TORCH_CHECK(param.dim() >= 1 && rows.numel() == param.size(0),
                    "adam_step: visible has ", rows.numel(), " rows, param ", param.dim() ? param.size(0) : 0);
        mask = RowMask{rows.const_data_ptr<bool>(), n / std::max<int64_t>(rows.numel(), 1)};
    }
    const bool *valid_p = nullptr;
    if (valid.has_value()) {
        const at::Tensor &flag = *valid;
        TORCH_CHECK(flag.is_cuda() && flag.device() == param.device() && flag.scalar_type() == at::kBool &&
                        flag.numel() == 1,
                    "adam_step: valid must be one bool on ", param.device());
        valid_p = flag.const_data_ptr<bool>();
    }
    if (n == 0) return;
    const at::cuda::CUDAGuard guard(param.device());
    const bool vec = aligned16(param) && aligned16(grad) && aligned16(exp_avg) && aligned16(exp_avg_sq);
    const int64_t items = vec ? (n + 3) / 4 : n;
    auto kernel = vec ? adam_step_kernel<true> : adam_step_kernel<false>;
    const int64_t wanted = (items + kAdamThreads - 1) / kAdamThreads;
    const int64_t resident = resident_blocks(kernel, vec, param.device().index());
    const int blocks = static_cast<int>(std::min<int64_t>(wanted, resident));
    const AdamScalars s{static_cast<float>(lr), static_cast<float>(beta1), static_cast<float>(beta2),
                        static_cast<float>(eps)};
    const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
    kernel<<<blocks, kAdamThreads, 0, stream>>>(param.data_ptr<float>(), grad.const_data_ptr<float>(),
                                                exp_avg.data_ptr<float>(), exp_avg_sq.data_ptr<float>(), n,
                                                step.const_data_ptr<float>(), s, mask, valid_p);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace bytesplat
