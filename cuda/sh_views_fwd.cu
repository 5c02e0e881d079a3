// Spherical-harmonics colors of N Gaussians from C cameras, forward: one launch (sh_views.cuh).
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "sh_views.cuh"

namespace bytesplat {

namespace {

using namespace sh;

template <int n>
__global__ void __launch_bounds__(kShGaussians) sh_views_fwd_kernel(ShArgs a, float *__restrict__ colors) {
    constexpr int P = tile_pitch<n>();
    __shared__ float s_co[kShGaussians * P], s_means[kShGaussians * 3];
    // two buffers each: camera c + 1's radii arrive while camera c's are read, and camera c's colors
    // are written while camera c - 1's may still be stored
    __shared__ int32_t s_radii[2][kShGaussians];
    __shared__ float s_colors[2][kShGaussians * 3];
    const int t = threadIdx.x;
    const int64_t i0 = (int64_t)blockIdx.x * kShGaussians;
    const int rows = tile_rows(a.N, i0);
    load_tile<n>(a, i0, rows, s_co, s_means);
    if (a.C > 0) load_camera(a, 0, i0, rows, s_radii[0]);
    __pipeline_commit();
    const float *co = s_co + t * P;
    float Y[n];
    for (int c = 0; c < a.C; ++c) {
        next_camera(c, a.C, [&] { load_camera(a, c + 1, i0, rows, s_radii[(c + 1) & 1]); });
        float *out = s_colors[c & 1];
        if (t < rows) {
            float *o = out + 3 * t;
            if (s_radii[c & 1][t] <= 0) {
                o[0] = o[1] = o[2] = 0.f;
            } else {
                float inv;
                const float3 d = view_direction(a.viewmats, c, s_means[3 * t], s_means[3 * t + 1],
                                                s_means[3 * t + 2], inv);
                sh_bases<false, n>(d.x, d.y, d.z, Y, nullptr, nullptr, nullptr);
#pragma unroll
                for (int ch = 0; ch < 3; ++ch) {
                    float v = 0.5f;
#pragma unroll
                    for (int k = 0; k < n; ++k) v += Y[k] * co[k * 3 + ch];
                    o[ch] = fmaxf(v, 0.f);
                }
            }
        }
        __syncthreads();
        float *dst = colors + ((int64_t)c * a.N + i0) * 3;
        for_each_in_tile<3>(rows, [&](int r, int j) { dst[r * 3 + j] = out[r * 3 + j]; });
    }
}

}  // namespace

at::Tensor sh_views_fwd(const at::Tensor &means, const at::Tensor &dc, const at::Tensor &rest,
                        const at::Tensor &viewmats, const at::Tensor &radii, int64_t degree) {
    const ShArgs a = check_args(means, dc, rest, viewmats, radii, degree);
    const at::cuda::CUDAGuard guard(means.device());
    at::Tensor colors = at::empty({a.C, a.N, 3}, means.options());
    if (a.N == 0 || a.C == 0) return colors;
    with_bases(a.n, [&](auto nb) {
        sh_views_fwd_kernel<decltype(nb)::value>
            <<<sh_blocks(a.N), kShGaussians, 0, at::cuda::getCurrentCUDAStream()>>>(a, colors.data_ptr<float>());
    });
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return colors;
}

}  // namespace bytesplat
