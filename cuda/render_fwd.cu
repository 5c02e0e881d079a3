// Plain tile rasterizer, forward: colors, alphas, per-pixel T and last index (and, for the pruning
// score, each pixel's stopping Gaussian), one block per 16x16 tile. Used by rasterize_fused for
// rendering with arbitrary losses (eval, viewer, custom training losses) and as the first launch of
// the fused loss's split schedule. The backward is render_bwd.cu.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "render.cuh"

namespace bytesplat {

namespace {

using namespace plain;

constexpr int kSmemFwdBytes = kSmemGauss + kSmemWarpLists;

// 8 blocks per SM (32 registers): walking the warps' slot lists took 38 registers unbounded, 6 blocks per
// SM; at 32 the 20 bytes spilled are outside the compositing loop (suite sass-loops).
template <bool FASTEXP>
__global__ void __launch_bounds__(kBlock, 8) render_fwd_kernel(
    int W, int H, int tw, int th, const float *__restrict__ means2d,
    const float *__restrict__ conics, const float *__restrict__ colors,
    const float *__restrict__ opacities, const float *__restrict__ bg,
    const int32_t *__restrict__ offsets, const int32_t *__restrict__ flatten_ids,
    float *__restrict__ out_rgb, float *__restrict__ out_alpha, float *__restrict__ out_T,
    int32_t *__restrict__ out_last, int32_t *__restrict__ out_stop, bool cull,
    const int32_t *__restrict__ tile_order) {
    extern __shared__ float4 smem4[];
    SmemGaussians s;
    const int warp = threadIdx.x >> 5;
    uint8_t *list = reinterpret_cast<uint8_t *>(s.carve(reinterpret_cast<char *>(smem4), kBatch)) + warp * kBatch;

    const int3 tile = block_tile(tile_order, tw, th);
    const int tx = tile.x, ty = tile.y, cam = tile.z;
    const int t = (cam * th + ty) * tw + tx;
    const int2 xy = thread_pixel<kWarpWidth>(tx, ty);
    const int x = xy.x, y = xy.y;
    const bool inside = x < W && y < H;
    const float px = x + 0.5f, py = y + 0.5f;
    const int start = offsets[t], end = offsets[t + 1];

    float T = 1.f;
    float3 acc = make_float3(0.f, 0.f, 0.f);
    int last = 0, stop = -1;
    bool done = !inside;
    for (int b0 = start; b0 < end; b0 += kBatch) {
        // Also the barrier that frees the previous batch's shared memory.
        if (__syncthreads_count(done) == kBlock) break;
        const int cnt = min(kBatch, end - b0);
        load_gaussians<kWarpWidth, FASTEXP>(s, flatten_ids, b0, cnt, means2d, conics, colors, opacities,
                                            tx * kTile, ty * kTile, cull);
        __syncthreads();
        const int n = warp_slot_list(s.warps, 0, cnt, 1u << warp, list);  // rewritten after the next barrier
        composite_slots<FASTEXP>(s, WarpSlots{list}, n, b0 - start, px, py, T, acc, last, stop, done);
    }
    if (!inside) return;
    const int64_t pix = ((int64_t)cam * H + y) * W + x;
    float3 b = make_float3(0.f, 0.f, 0.f);
    if (bg != nullptr) b = make_float3(bg[3 * cam], bg[3 * cam + 1], bg[3 * cam + 2]);
    out_rgb[3 * pix] = acc.x + T * b.x;
    out_rgb[3 * pix + 1] = acc.y + T * b.y;
    out_rgb[3 * pix + 2] = acc.z + T * b.z;
    out_alpha[pix] = 1.f - T;
    out_T[pix] = T;
    out_last[pix] = last;
    if (out_stop != nullptr) out_stop[pix] = stop;
}

}  // namespace

// Returns {rgb [C,H,W,3] (+ T*bg), alpha [C,H,W,1], T [C,H,W], last [C,H,W] int32, stop [C,H,W]
// int32 (list index of the Gaussian that saturated the pixel, -1: none; empty unless with_stop)}.
std::vector<at::Tensor> render_fwd(const at::Tensor &means2d, const at::Tensor &conics,
                                   const at::Tensor &colors, const at::Tensor &opacities,
                                   const c10::optional<at::Tensor> &backgrounds,
                                   const at::Tensor &offsets, const at::Tensor &flatten_ids,
                                   int64_t C, int64_t W, int64_t H, bool with_stop, bool warp_cull,
                                   bool fast_exp, const c10::optional<at::Tensor> &tile_order) {
    check_inputs(means2d, conics, colors, opacities, offsets, flatten_ids);
    const at::cuda::CUDAGuard guard(means2d.device());
    const int tw = (W + kTile - 1) / kTile, th = (H + kTile - 1) / kTile;
    check_tile_order(tile_order, offsets, C, tw, th);
    TORCH_CHECK(offsets.numel() == C * tw * th + 1, "bytesplat: offsets must have C*tiles+1 entries");
    auto fopt = means2d.options();
    at::Tensor rgb = at::empty({C, H, W, 3}, fopt);
    at::Tensor alpha = at::empty({C, H, W, 1}, fopt);
    at::Tensor T = at::empty({C, H, W}, fopt);
    at::Tensor last = at::empty({C, H, W}, fopt.dtype(at::kInt));
    at::Tensor stop = at::empty({with_stop ? C : 0, H, W}, fopt.dtype(at::kInt));
    if (C == 0 || W == 0 || H == 0) return {rgb, alpha, T, last, stop};
    at::Tensor bg_keep = backgrounds.has_value() ? backgrounds->contiguous() : at::Tensor();
    const float *bg = backgrounds.has_value() ? bg_keep.data_ptr<float>() : nullptr;
    auto stream = at::cuda::getCurrentCUDAStream();
    dim3 grid(tw, th, C);
    // fast_exp: the falloff as 2^q from the prescaled conic (common.cuh staged_conic)
    dispatch_bools([&](auto fast) {
        render_fwd_kernel<decltype(fast)::value><<<grid, kBlock, kSmemFwdBytes, stream>>>(
            W, H, tw, th, means2d.data_ptr<float>(), conics.data_ptr<float>(), colors.data_ptr<float>(),
            opacities.data_ptr<float>(), bg, offsets.data_ptr<int32_t>(),
            flatten_ids.data_ptr<int32_t>(), rgb.data_ptr<float>(), alpha.data_ptr<float>(),
            T.data_ptr<float>(), last.data_ptr<int32_t>(), with_stop ? stop.data_ptr<int32_t>() : nullptr,
            warp_cull, tile_order.has_value() ? tile_order->data_ptr<int32_t>() : nullptr);
    }, fast_exp);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return {rgb, alpha, T, last, stop};
}

}  // namespace bytesplat
