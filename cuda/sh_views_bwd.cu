// Spherical-harmonics colors of N Gaussians from C cameras, backward: the coefficients' and the means'
// gradients summed over the cameras, one launch (sh_views.cuh).
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "sh_views.cuh"

namespace bytesplat {

namespace {

using namespace sh;

// v_coeffs[i] = sum_c Y(d_c) v_c and v_means[i] = sum_c (I - d d^T)/|m - center| grad_d, over the
// cameras where i is visible and its color is not clamped (torch's clamp_min passes the gradient
// where the input >= 0). Coefficients past the n used get 0. v_dc / v_rest: row strides v_dc_stride
// / v_rest_stride (floats), each row's floats contiguous. Each thread sums its Gaussian's
// coefficient gradients in its own row of s_vco; the block then stores the tile as load_tile read it.
template <int n>
__global__ void __launch_bounds__(kShGaussians)
    sh_views_bwd_kernel(ShArgs a, const float *__restrict__ v_colors, float *__restrict__ v_dc,
                        int64_t v_dc_stride, float *__restrict__ v_rest, int64_t v_rest_stride,
                        float *__restrict__ v_means) {
    constexpr int P = tile_pitch<n>(), kRest = (n - 1) * 3;
    __shared__ float s_co[kShGaussians * P], s_vco[kShGaussians * P];
    __shared__ float s_means[kShGaussians * 3];  // the means in, their gradients out
    __shared__ int32_t s_radii[2][kShGaussians];  // two buffers: camera c + 1's arrive while c's are read
    __shared__ float s_vcolors[2][kShGaussians * 3];
    const int t = threadIdx.x;
    const int64_t i0 = (int64_t)blockIdx.x * kShGaussians;
    const int rows = tile_rows(a.N, i0);
    load_tile<n>(a, i0, rows, s_co, s_means);
    if (a.C > 0) load_camera(a, 0, i0, rows, s_radii[0], v_colors, s_vcolors[0]);
    __pipeline_commit();
    const float *co = s_co + t * P;
    float *vco = s_vco + t * P;
#pragma unroll
    for (int k = 0; k < n * 3; ++k) vco[k] = 0.f;  // this thread's row only, while the tile loads
    float vmx = 0.f, vmy = 0.f, vmz = 0.f;
    float Y[n], gx[n], gy[n], gz[n];
    for (int c = 0; c < a.C; ++c) {
        const int b = c & 1;
        next_camera(c, a.C, [&] { load_camera(a, c + 1, i0, rows, s_radii[b ^ 1], v_colors, s_vcolors[b ^ 1]); });
        if (t < rows && s_radii[b][t] > 0) {
            float inv;
            const float3 d = view_direction(a.viewmats, c, s_means[3 * t], s_means[3 * t + 1], s_means[3 * t + 2], inv);
            const float x = d.x, y = d.y, z = d.z;
            sh_bases<true, n>(x, y, z, Y, gx, gy, gz);
            float v[3];
            bool any = false;
#pragma unroll
            for (int ch = 0; ch < 3; ++ch) {
                float raw = 0.5f;
#pragma unroll
                for (int k = 0; k < n; ++k) raw += Y[k] * co[k * 3 + ch];
                v[ch] = raw >= 0.f ? s_vcolors[b][3 * t + ch] : 0.f;
                any |= v[ch] != 0.f;
            }
            if (any) {
                float ux = 0.f, uy = 0.f, uz = 0.f;  // dL / d(unit direction)
#pragma unroll
                for (int k = 0; k < n; ++k) {
                    const float s = co[k * 3] * v[0] + co[k * 3 + 1] * v[1] + co[k * 3 + 2] * v[2];
                    ux += s * gx[k], uy += s * gy[k], uz += s * gz[k];
                    vco[k * 3] += Y[k] * v[0], vco[k * 3 + 1] += Y[k] * v[1], vco[k * 3 + 2] += Y[k] * v[2];
                }
                // through the normalisation d / |d|: (u - (u . d) d) / |d|
                const float ud = ux * x + uy * y + uz * z;
                vmx += (ux - ud * x) * inv, vmy += (uy - ud * y) * inv, vmz += (uz - ud * z) * inv;
            }
        }
        if (c + 1 < a.C) __syncthreads();  // camera c's buffers read before camera c + 2's overwrite them
    }
    if (a.C == 0) {  // (else the last camera's wait and barrier did this) no copy lands on the gradients
        __pipeline_wait_prior(0);
        __syncthreads();
    }
    // this thread's row: only this thread read it while computing
    if (t < rows) s_means[3 * t] = vmx, s_means[3 * t + 1] = vmy, s_means[3 * t + 2] = vmz;
    __syncthreads();
    for_each_in_tile<3>(rows, [&](int r, int j) {
        v_dc[(i0 + r) * v_dc_stride + j] = s_vco[r * P + j];
        v_means[(i0 + r) * 3 + j] = s_means[r * 3 + j];
    });
    if constexpr (kRest > 0) {
        for_each_in_tile<kRest>(
            rows, [&](int r, int j) { v_rest[(i0 + r) * v_rest_stride + j] = s_vco[r * P + 3 + j]; });
    }
    const int unused = (a.K - n) * 3;  // floats of the rest past the bases in use: gradient 0
    for (int e = t; e < rows * unused; e += kShGaussians) {
        const int r = e / unused;
        v_rest[(i0 + r) * v_rest_stride + kRest + e % unused] = 0.f;
    }
}

}  // namespace

// Writes the coefficient gradients into v_dc / v_rest (shaped as dc / rest, row-strided views
// allowed: the caller allocates them, so a stacked [N,K,3] gradient is filled through its two
// views) and returns the means' [N,3].
at::Tensor sh_views_bwd(const at::Tensor &means, const at::Tensor &dc, const at::Tensor &rest,
                        const at::Tensor &viewmats, const at::Tensor &radii, int64_t degree,
                        const at::Tensor &v_colors, at::Tensor v_dc, at::Tensor v_rest) {
    const ShArgs a = check_args(means, dc, rest, viewmats, radii, degree);
    TORCH_CHECK(v_colors.is_cuda() && v_colors.scalar_type() == at::kFloat && v_colors.is_contiguous() &&
                    v_colors.dim() == 3 && v_colors.size(0) == a.C && v_colors.size(1) == a.N &&
                    v_colors.size(2) == 3,
                "bytesplat: v_colors must be contiguous float32 [C,N,3]");
    TORCH_CHECK(v_dc.is_cuda() && v_rest.is_cuda() && v_dc.scalar_type() == at::kFloat &&
                    v_rest.scalar_type() == at::kFloat && v_dc.sizes() == dc.sizes() &&
                    v_rest.sizes() == rest.sizes() && rows_contiguous(v_dc, v_rest),
                "bytesplat: v_dc / v_rest must be float32 CUDA tensors shaped as dc / rest, rows contiguous");
    const at::cuda::CUDAGuard guard(means.device());
    at::Tensor v_means = at::empty_like(means);
    if (a.N == 0) return v_means;
    with_bases(a.n, [&](auto nb) {
        sh_views_bwd_kernel<decltype(nb)::value><<<sh_blocks(a.N), kShGaussians, 0, at::cuda::getCurrentCUDAStream()>>>(
            a, v_colors.data_ptr<float>(), v_dc.data_ptr<float>(), v_dc.stride(0), v_rest.data_ptr<float>(),
            v_rest.stride(0), v_means.data_ptr<float>());
    });
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return v_means;
}

}  // namespace bytesplat
