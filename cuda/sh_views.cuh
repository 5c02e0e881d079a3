// Spherical-harmonics colors of N Gaussians seen from C cameras, forward (sh_views_fwd.cu) and backward
// (sh_views_bwd.cu), one launch each (the CUDA twin of `split_sh_colors_torch` in
// bytesplat_ns/raster/_torch_impl.py). This header holds what both directions share: the basis, the
// block's coefficient tile, the camera pipeline and the launchers' checks.
//
// colors[c, i] = max(sum_k coeffs[i, k] Y_k(d) + 0.5, 0) with d the unit vector from camera c's
// center (-R^T t of its rigid world-to-camera matrix) to mean i, and 0 where radii[c, i] <= 0
// (culled). Basis and signs: bytesplat_ns/raster/sh.py (gsplat 1.4.0's).
//
// The coefficients come as two tensors, the DC term dc [N,3] and the rest [N,K-1,3] (splatfacto's
// features_dc / features_rest), each with any row stride: the trainer's parameters are read and
// their gradients written in place, with no [N,K,3] concatenation either way, and a stacked
// [N,K,3] tensor is the same call on its two views coeffs[:, 0] and coeffs[:, 1:].
//
// Mapping: a block takes 64 consecutive Gaussians. Its threads first copy their coefficient rows
// (and means) into shared memory together, consecutive threads on consecutive floats, so each warp
// reads whole 128-byte lines; then each thread computes one Gaussian from its shared row for every
// camera (the next camera's radii and color gradients arrive meanwhile); the backward sums the
// coefficient gradients into a second shared tile and the block stores it the same coalesced way.
// A thread reading or writing its own 48-float row in global memory (192 bytes from its
// neighbour's) makes every warp access touch 32 sectors for 128 useful bytes, and the gradient
// stores partial sectors. A thread per Gaussian (not per channel) keeps the means gradient, which
// all three channels feed, in one thread: no cross-thread reduction or atomics. The coefficients
// are read from DRAM once per block, not once per camera, and each gradient is written once,
// summed over the cameras.
#pragma once

#include <ATen/ATen.h>
#include <cuda_pipeline_primitives.h>

#include <type_traits>

namespace bytesplat {
namespace sh {


constexpr int kMaxBases = 16;

// Normalisation constants of the real bases (see raster/sh.py for their derivation).
constexpr float kY00 = 0.28209479177387814f;
constexpr float kK1 = 0.4886025119029199f;
constexpr float kK2 = 1.0925484305920792f;
constexpr float kK20 = 0.31539156525252005f;
constexpr float kK22 = 0.5462742152960396f;
constexpr float kK33 = 0.5900435899266435f;
constexpr float kK32 = 2.890611442640554f;
constexpr float kK31 = 0.4570457994644658f;
constexpr float kK30 = 0.3731763325901154f;
constexpr float kK32b = 1.445305721320277f;

// The first n = (degree+1)^2 bases at unit direction (x, y, z); with `grad`, also their gradients
// with respect to (x, y, z) in gx, gy, gz. n is a template argument so the arrays stay in registers.
template <bool kGrad, int n>
__device__ __forceinline__ void sh_bases(float x, float y, float z, float *Y, float *gx, float *gy,
                                         float *gz) {
    Y[0] = kY00;
    if constexpr (kGrad) gx[0] = gy[0] = gz[0] = 0.f;
    if constexpr (n >= 4) {
        Y[1] = -kK1 * y;
        Y[2] = kK1 * z;
        Y[3] = -kK1 * x;
        if constexpr (kGrad) {
            gx[1] = 0.f, gy[1] = -kK1, gz[1] = 0.f;
            gx[2] = 0.f, gy[2] = 0.f, gz[2] = kK1;
            gx[3] = -kK1, gy[3] = 0.f, gz[3] = 0.f;
        }
    }
    if constexpr (n >= 9) {
        const float xx = x * x, yy = y * y, zz = z * z;
        Y[4] = kK2 * x * y;
        Y[5] = -kK2 * y * z;
        Y[6] = kK20 * (3.f * zz - 1.f);
        Y[7] = -kK2 * x * z;
        Y[8] = kK22 * (xx - yy);
        if constexpr (kGrad) {
            gx[4] = kK2 * y, gy[4] = kK2 * x, gz[4] = 0.f;
            gx[5] = 0.f, gy[5] = -kK2 * z, gz[5] = -kK2 * y;
            gx[6] = 0.f, gy[6] = 0.f, gz[6] = 6.f * kK20 * z;
            gx[7] = -kK2 * z, gy[7] = 0.f, gz[7] = -kK2 * x;
            gx[8] = 2.f * kK22 * x, gy[8] = -2.f * kK22 * y, gz[8] = 0.f;
        }
    }
    if constexpr (n >= 16) {
        const float xx = x * x, yy = y * y, zz = z * z;
        Y[9] = -kK33 * y * (3.f * xx - yy);
        Y[10] = kK32 * x * y * z;
        Y[11] = -kK31 * y * (5.f * zz - 1.f);
        Y[12] = kK30 * z * (5.f * zz - 3.f);
        Y[13] = -kK31 * x * (5.f * zz - 1.f);
        Y[14] = kK32b * z * (xx - yy);
        Y[15] = -kK33 * x * (xx - 3.f * yy);
        if constexpr (kGrad) {
            gx[9] = -6.f * kK33 * x * y, gy[9] = -3.f * kK33 * (xx - yy), gz[9] = 0.f;
            gx[10] = kK32 * y * z, gy[10] = kK32 * x * z, gz[10] = kK32 * x * y;
            gx[11] = 0.f, gy[11] = -kK31 * (5.f * zz - 1.f), gz[11] = -10.f * kK31 * y * z;
            gx[12] = 0.f, gy[12] = 0.f, gz[12] = kK30 * (15.f * zz - 3.f);
            gx[13] = -kK31 * (5.f * zz - 1.f), gy[13] = 0.f, gz[13] = -10.f * kK31 * x * z;
            gx[14] = 2.f * kK32b * x * z, gy[14] = -2.f * kK32b * y * z, gz[14] = kK32b * (xx - yy);
            gx[15] = -3.f * kK33 * (xx - yy), gy[15] = 6.f * kK33 * x * y, gz[15] = 0.f;
        }
    }
}

// Camera c's center in world space, -R^T t, from its row-major 4x4 world-to-camera matrix.
__device__ __forceinline__ float3 camera_center(const float *__restrict__ viewmats, int c) {
    const float *m = viewmats + 16 * c;
    const float t0 = m[3], t1 = m[7], t2 = m[11];
    return make_float3(-(m[0] * t0 + m[4] * t1 + m[8] * t2), -(m[1] * t0 + m[5] * t1 + m[9] * t2),
                       -(m[2] * t0 + m[6] * t1 + m[10] * t2));
}

struct ShArgs {
    int64_t N;
    int C, K, n;  // cameras, coefficients per Gaussian, bases used ((degree+1)^2, the kernels' template n)
    int64_t dc_stride, rest_stride;  // row strides (floats) of dc [N,3] and rest [N,K-1,3]
    const float *means, *dc, *rest, *viewmats;
    const int32_t *radii;
};

// Gaussians (= threads) per block. The backward's two coefficient tiles (below) take 2 * 64 * 49
// floats, 25 KB of shared memory, under the 48 KB a block may have statically.
constexpr int kShGaussians = 64;

// Floats from one Gaussian's row to the next in a block's coefficient tile in shared memory: the
// n*3 used coefficients, padded to an odd count so that the 32 threads of a warp, one row each,
// read and write 32 different banks.
template <int n>
constexpr int tile_pitch() {
    return (n * 3) % 2 == 1 ? n * 3 : n * 3 + 1;
}

// Rows r < rows of a block's tile, W floats each: calls f(r, j) once per float j, consecutive
// threads on consecutive floats, so that a warp's global loads or stores of rows laid out one after
// another cover one contiguous span (split at row ends when the row stride is wider).
template <int W, typename F>
__device__ __forceinline__ void for_each_in_tile(int rows, F &&f) {
#pragma unroll 4
    for (int e = threadIdx.x; e < rows * W; e += kShGaussians) f(e / W, e % W);
}

// Gaussian i0 + r's n used coefficients (DC first) into row r of s_co, its mean into
// s_means[3r..3r+2], with asynchronous copies (cp.async on sm_80+): they go to shared memory
// without staging in registers, so all of a thread's loads are in flight at once whatever the
// register count. The caller commits the copies as one group (with camera 0's inputs, load_camera);
// they are visible to the block after waiting for that group and a barrier.
template <int n>
__device__ __forceinline__ void load_tile(const ShArgs &a, int64_t i0, int rows, float *s_co, float *s_means) {
    constexpr int P = tile_pitch<n>();
    const float *dc = a.dc + i0 * a.dc_stride, *rest = a.rest + i0 * a.rest_stride, *means = a.means + i0 * 3;
    for_each_in_tile<3>(rows, [&](int r, int j) {
        __pipeline_memcpy_async(s_co + r * P + j, dc + r * a.dc_stride + j, sizeof(float));
        __pipeline_memcpy_async(s_means + r * 3 + j, means + r * 3 + j, sizeof(float));
    });
    if constexpr (n > 1) {
        for_each_in_tile<(n - 1) * 3>(rows, [&](int r, int j) {
            __pipeline_memcpy_async(s_co + r * P + 3 + j, rest + r * a.rest_stride + j, sizeof(float));
        });
    }
}

// Camera c's inputs of the block's Gaussians, asynchronously as load_tile: the radii into
// s_radii[r] and, with v_colors, the color gradients into s_vcolors[3r..3r+2]. The kernels fetch
// camera c + 1's while they compute camera c, into the other of two buffers.
__device__ __forceinline__ void load_camera(const ShArgs &a, int c, int64_t i0, int rows, int32_t *s_radii,
                                            const float *v_colors = nullptr, float *s_vcolors = nullptr) {
    const int64_t ci0 = (int64_t)c * a.N + i0;
    for_each_in_tile<1>(rows, [&](int r, int) {
        __pipeline_memcpy_async(s_radii + r, a.radii + ci0 + r, sizeof(int32_t));
    });
    if (v_colors != nullptr) {
        for_each_in_tile<3>(rows, [&](int r, int j) {
            __pipeline_memcpy_async(s_vcolors + r * 3 + j, v_colors + ci0 * 3 + r * 3 + j, sizeof(float));
        });
    }
}

// Before computing camera c of C: fetches camera c + 1's inputs (a new copy group) and waits for
// every earlier group, camera c's included, then a barrier makes all threads' copies visible. The
// buffer camera c + 1 goes to was last read for camera c - 1, before that iteration's last barrier.
template <typename Fetch>
__device__ __forceinline__ void next_camera(int c, int C, Fetch &&fetch_next) {
    if (c + 1 < C) {
        fetch_next();
        __pipeline_commit();
        __pipeline_wait_prior(1);
    } else {
        __pipeline_wait_prior(0);
    }
    __syncthreads();
}

// Gaussians of block blockIdx.x that exist: kShGaussians except in the last block.
__device__ __forceinline__ int tile_rows(int64_t N, int64_t i0) {
    return N - i0 < kShGaussians ? (int)(N - i0) : kShGaussians;
}

// Unit direction from camera c's center to mean m, and 1 / the distance (zero direction: 0, finite).
__device__ __forceinline__ float3 view_direction(const float *__restrict__ viewmats, int c, float mx, float my,
                                                 float mz, float &inv) {
    const float3 cc = camera_center(viewmats, c);
    const float dx = mx - cc.x, dy = my - cc.y, dz = mz - cc.z;
    inv = 1.f / fmaxf(sqrtf(dx * dx + dy * dy + dz * dz), 1e-20f);
    return make_float3(dx * inv, dy * inv, dz * inv);
}

// dc [N,3] and rest [N,K-1,3] may be row-strided views (one row's floats contiguous; a size-1
// dimension's stride does not matter, as in torch's is_contiguous).
inline bool rows_contiguous(const at::Tensor &dc, const at::Tensor &rest) {
    return dc.stride(1) == 1 &&
           (rest.size(1) == 0 || (rest.stride(2) == 1 && (rest.size(1) == 1 || rest.stride(1) == 3)));
}

inline ShArgs check_args(const at::Tensor &means, const at::Tensor &dc, const at::Tensor &rest,
                         const at::Tensor &viewmats, const at::Tensor &radii, int64_t degree) {
    TORCH_CHECK(means.is_cuda() && dc.is_cuda() && rest.is_cuda() && viewmats.is_cuda() && radii.is_cuda(),
                "bytesplat: multi-view SH needs CUDA tensors");
    TORCH_CHECK(means.dim() == 2 && means.size(1) == 3, "bytesplat: means must be [N,3]");
    TORCH_CHECK(dc.dim() == 2 && dc.size(0) == means.size(0) && dc.size(1) == 3,
                "bytesplat: SH DC coefficients must be [N,3]");
    TORCH_CHECK(rest.dim() == 3 && rest.size(0) == means.size(0) && rest.size(2) == 3,
                "bytesplat: the other SH coefficients must be [N,K-1,3]");
    TORCH_CHECK(viewmats.dim() == 3 && viewmats.size(1) == 4 && viewmats.size(2) == 4,
                "bytesplat: viewmats must be [C,4,4]");
    TORCH_CHECK(radii.dim() == 2 && radii.size(0) == viewmats.size(0) && radii.size(1) == means.size(0),
                "bytesplat: radii must be [C,N]");
    TORCH_CHECK(degree >= 0 && degree <= 3, "bytesplat: SH degree must be in 0..3, got ", degree);
    const int64_t n = (degree + 1) * (degree + 1);
    TORCH_CHECK(1 + rest.size(1) >= n, "bytesplat: SH degree ", degree, " needs ", n,
                " coefficients, got ", 1 + rest.size(1));
    TORCH_CHECK(means.scalar_type() == at::kFloat && dc.scalar_type() == at::kFloat &&
                    rest.scalar_type() == at::kFloat && viewmats.scalar_type() == at::kFloat &&
                    radii.scalar_type() == at::kInt,
                "bytesplat: multi-view SH takes float32 means/coefficients/viewmats and int32 radii");
    TORCH_CHECK(means.is_contiguous() && viewmats.is_contiguous() && radii.is_contiguous() &&
                    rows_contiguous(dc, rest),
                "bytesplat: multi-view SH inputs must be contiguous (the coefficients row by row)");
    ShArgs a;
    a.N = means.size(0);
    a.C = (int)viewmats.size(0);
    a.K = (int)(1 + rest.size(1));
    a.n = (int)n;
    a.dc_stride = dc.stride(0);
    a.rest_stride = rest.stride(0);
    a.means = means.data_ptr<float>();
    a.dc = dc.data_ptr<float>();
    a.rest = rest.data_ptr<float>();
    a.viewmats = viewmats.data_ptr<float>();
    a.radii = radii.data_ptr<int32_t>();
    return a;
}

inline unsigned int sh_blocks(int64_t n) {
    return (unsigned int)((n + kShGaussians - 1) / kShGaussians);
}

// Calls f(std::integral_constant<int, n>) for the bases in use.
template <typename F>
inline void with_bases(int n, F &&f) {
    switch (n) {
        case 1: return f(std::integral_constant<int, 1>());
        case 4: return f(std::integral_constant<int, 4>());
        case 9: return f(std::integral_constant<int, 9>());
        default: return f(std::integral_constant<int, kMaxBases>());
    }
}

}  // namespace sh
}  // namespace bytesplat
