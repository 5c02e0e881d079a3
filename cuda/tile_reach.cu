// Opacity-aware tile reach in one launch: the CUDA twin of `opacity_aware_radii` in
// bytesplat_ns/raster/tile_reach.py (the definition and its reasoning are there). Same result bit
// for bit: every float operation is the one torch's elementwise kernels run, in the same order and
// rounding (the _rn intrinsics keep nvcc from contracting a multiply and an add into an FMA, and
// stay IEEE under --use_fast_math; logf is the only call that fast math would approximate, far
// inside the reach's 1% + 0.02 widening).
//
// torch divides by a Python scalar as a multiply by its float reciprocal, computed on the host in
// float (`inv_alpha_min` below); scalars in products and sums are rounded to float first.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <vector>

namespace bytesplat {

namespace {

constexpr int kReachThreads = 256;

struct ReachConstants {
    float alpha_min;      // 1/255: below it a Gaussian is never composited
    float inv_alpha_min;  // torch's reciprocal of that scalar
    float widen_mul, widen_add, pad;  // t = 1.01 ln(o / alpha_min) + 0.02; half-extent + 0.01
    float min_det_ratio, max_opacity, max_extent;  // 1e-3, 1e30, 1e9
};

__global__ void reach_kernel(int64_t CN, const int32_t *__restrict__ radii,
                             const float *__restrict__ conics, const float *__restrict__ opacities,
                             ReachConstants k, int32_t *__restrict__ reach) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= CN) return;
    const float a = conics[3 * i], b = conics[3 * i + 1], c = conics[3 * i + 2];
    const float o = opacities[i];
    const float det = __fsub_rn(__fmul_rn(a, c), __fmul_rn(b, b));
    const bool faint = o < k.alpha_min;  // false for NaN: a NaN opacity keeps its square
    const float t = __fadd_rn(__fmul_rn(k.widen_mul, logf(__fmul_rn(faint ? 1.f : o, k.inv_alpha_min))),
                              k.widen_add);
    const float two_t = __fmul_rn(2.f, t);
    const float half_x = __fadd_rn(__fsqrt_rn(__fdiv_rn(__fmul_rn(two_t, c), det)), k.pad);
    const float half_y = __fadd_rn(__fsqrt_rn(__fdiv_rn(__fmul_rn(two_t, a), det)), k.pad);
    const bool well_formed = a > 0.f && c > 0.f && det > __fmul_rn(__fmul_rn(k.min_det_ratio, a), c) &&
                             o <= k.max_opacity && isfinite(half_x) && isfinite(half_y) &&
                             half_x < k.max_extent && half_y < k.max_extent;
    const int32_t square = radii[i];
    int32_t rx = 0, ry = 0;
    if (!faint && square > 0) {
        rx = ry = square;
        if (well_formed) {  // both half-extents are finite and below 1e9 here: ceil fits an int
            rx = min((int32_t)ceilf(half_x), square);
            ry = min((int32_t)ceilf(half_y), square);
        }
    }
    reach[2 * i] = rx;
    reach[2 * i + 1] = ry;
}

}  // namespace

at::Tensor opacity_aware_radii(const at::Tensor &radii, const at::Tensor &conics,
                               const at::Tensor &opacities) {
    TORCH_CHECK(radii.is_cuda() && conics.is_cuda() && opacities.is_cuda(),
                "bytesplat: the tile reach needs CUDA tensors");
    TORCH_CHECK(radii.dim() == 2 && radii.scalar_type() == at::kInt && radii.is_contiguous(),
                "bytesplat: radii must be contiguous [C,N] int32");
    TORCH_CHECK(conics.dim() == 3 && conics.size(0) == radii.size(0) && conics.size(1) == radii.size(1) &&
                    conics.size(2) == 3 && conics.scalar_type() == at::kFloat && conics.is_contiguous(),
                "bytesplat: conics must be contiguous [C,N,3] float32 like radii");
    TORCH_CHECK(opacities.sizes() == radii.sizes() && opacities.scalar_type() == at::kFloat &&
                    opacities.is_contiguous(),
                "bytesplat: opacities must be contiguous [C,N] float32 like radii");
    const at::cuda::CUDAGuard guard(radii.device());
    const int64_t CN = radii.numel();
    at::Tensor reach = at::empty({radii.size(0), radii.size(1), 2}, radii.options());
    if (CN == 0) return reach;
    const float alpha_min = (float)(1.0 / 255.0);
    const ReachConstants k{alpha_min, 1.f / alpha_min, (float)1.01, (float)0.02, (float)0.01,
                           (float)1e-3, (float)1e30, (float)1e9};
    reach_kernel<<<(unsigned int)((CN + kReachThreads - 1) / kReachThreads), kReachThreads, 0,
                   at::cuda::getCurrentCUDAStream()>>>(CN, radii.data_ptr<int32_t>(),
                                                       conics.data_ptr<float>(),
                                                       opacities.data_ptr<float>(), k,
                                                       reach.data_ptr<int32_t>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return reach;
}

}  // namespace bytesplat
