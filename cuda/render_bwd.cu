// Plain tile rasterizer, backward: 2D gradients from dL/d render (and, on request, the pruning score:
// docs/pruning.md), one block per 16x16 tile, the tile's Gaussians walked back to front. Used by
// rasterize_fused and as the last launch of the fused loss's split schedule, which runs it in its autograd
// backward with the loss's incoming gradient as v_scale (read on the device: no host sync, no pass over
// the gradients to scale them); the forward is render_fwd.cu.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "render.cuh"

namespace bytesplat {

namespace {

using namespace plain;

// The staged batch, the block's gradient sums per Gaussian and component, the reduction scratch and the
// warps' slot lists.
constexpr int kSmemBwdBytes = kSmemGauss + kBatch * kAccComps * 4 + 64 + kSmemWarpLists;

// The plain backward's arguments (render_bwd_kernel, render_bwd_2px_kernel: one launcher for both).
// stop_ids and contrib only with the pruning score (CONTRIB), v_means2d_abs only with absgrad.
struct BwdArgs {
    int W, H, tw, th;
    const float *means2d, *conics, *colors, *opacities, *bg;
    const int32_t *offsets, *flatten_ids;
    const float *T_final;
    const int32_t *last_ids, *stop_ids;
    const float *v_render, *v_alpha;
    const float *v_scale;  // one float on the device multiplying v_render and v_alpha, or nullptr (1)
    float *v_means2d, *v_conics, *v_colors, *v_opacities, *v_means2d_abs, *contrib;
    bool cull;                  // the box test, where there are no masks
    const uint8_t *warp_masks;  // one byte per list entry (cuda/warp_masks.cu: the rows test) or nullptr
    const int32_t *tile_order;  // nullptr: blockIdx order (block_tile)
};

// A backward block's tile and shared memory: the staged Gaussians, the gradient sums (the first
// `acc_floats` zeroed by the NT threads; block_max_int's barrier orders that before their use), the
// reduction scratch and this warp's slot list (backward_slots' LISTS).
struct BwdBlock {
    SmemGaussians s;
    float *acc;
    int *red;
    uint8_t *list;
    int cam, tx, ty, start, end;
};

template <int NT>
__device__ __forceinline__ BwdBlock bwd_block(const BwdArgs &a, int acc_floats) {
    extern __shared__ float4 smem4[];
    BwdBlock blk;
    char *p_end = blk.s.carve(reinterpret_cast<char *>(smem4), kBatch);
    blk.acc = reinterpret_cast<float *>(p_end);
    blk.red = reinterpret_cast<int *>(blk.acc + kBatch * kAccComps);
    blk.list = reinterpret_cast<uint8_t *>(blk.red + 16) + (threadIdx.x >> 5) * kBatch;
    for (int i = threadIdx.x; i < acc_floats; i += NT) blk.acc[i] = 0.f;
    const int3 tile = block_tile(a.tile_order, a.tw, a.th);
    blk.tx = tile.x;
    blk.ty = tile.y;
    blk.cam = tile.z;
    const int t = (blk.cam * a.th + blk.ty) * a.tw + blk.tx;
    blk.start = a.offsets[t];
    blk.end = a.offsets[t + 1];
    return blk;
}

// The backward's state of pixel (x, y) of view cam: T_final, last (and with CONTRIB stop) from the
// forward, dL/d render, and the alpha term (v_alpha less the backgrounds' share); an empty pixel
// outside the image.
template <bool CONTRIB>
__device__ __forceinline__ PixelBwd pixel_bwd_state(const BwdArgs &a, int x, int y, int cam) {
    PixelBwd p;
    p.px = x + 0.5f;
    p.py = y + 0.5f;
    p.buf = make_float3(0.f, 0.f, 0.f);
    p.v_rgb = make_float3(0.f, 0.f, 0.f);
    p.v_aT = 0.f;
    p.T = p.T_final = 1.f;
    p.last = 0;
    p.stop = -1;
    if (x < a.W && y < a.H) {
        const int64_t pix = ((int64_t)cam * a.H + y) * a.W + x;
        p.T = p.T_final = a.T_final[pix];
        p.last = a.last_ids[pix];
        if (CONTRIB) p.stop = a.stop_ids[pix];
        const float k = a.v_scale != nullptr ? *a.v_scale : 1.f;
        p.v_rgb = make_float3(k * a.v_render[3 * pix], k * a.v_render[3 * pix + 1], k * a.v_render[3 * pix + 2]);
        float va = a.v_alpha != nullptr ? k * a.v_alpha[pix] : 0.f;
        if (a.bg != nullptr)
            va -= a.bg[3 * cam] * p.v_rgb.x + a.bg[3 * cam + 1] * p.v_rgb.y + a.bg[3 * cam + 2] * p.v_rgb.z;
        p.v_aT = p.T_final * va;
    }
    return p;
}

// 5 blocks per SM (at most 48 registers, was 61 and 4 blocks): Nsight Compute found this kernel
// issue-bound with no eligible warp in 21% of cycles at 50% occupancy; 5 blocks measured 2.7% faster
// at 4M Gaussians, 6 (40 registers, spilling) 2.1% (commit 8757b9f, docs/benchmarks.md, "Per-warp culling").
template <bool ABS, bool BUTTERFLY, bool CONTRIB, bool FASTEXP>
__global__ void __launch_bounds__(kBlock, 5) render_bwd_kernel(const BwdArgs a) {
    const BwdBlock blk = bwd_block<kBlock>(a, kBatch * kAccComps);
    const int2 xy = thread_pixel<kWarpWidth>(blk.tx, blk.ty);
    PixelBwd p = pixel_bwd_state<CONTRIB>(a, xy.x, xy.y, blk.cam);
    const int warp_end = warp_walk_end<CONTRIB>(p);  // the stopping Gaussians count for the score
    const int max_last = block_max_int(warp_end, blk.red);  // also syncs s_acc's zeroing
    if (max_last == 0 || blk.end <= blk.start) return;
    for (int b = (max_last - 1) / kBatch; b >= 0; --b) {
        const int cnt = min(kBatch, blk.end - blk.start - b * kBatch);
        __syncthreads();
        load_gaussians_masked<FASTEXP>(blk.s, a.flatten_ids, blk.start + b * kBatch, cnt, a.means2d, a.conics,
                                       a.colors, a.opacities, blk.tx * kTile, blk.ty * kTile, a.cull, a.warp_masks);
        __syncthreads();
        const int hi = min(cnt, max_last - b * kBatch);
        backward_slots<kBatch, ABS, BUTTERFLY, CONTRIB, FASTEXP, true>(
            blk.s, 0, hi, b * kBatch, warp_end, p, blk.acc, a.v_means2d, a.v_conics, a.v_colors, a.v_opacities,
            a.v_means2d_abs, a.contrib, blk.list);
    }
}

// render_bwd_kernel with two pixels per thread (backward_slots_2px): 128 threads per tile, warp w
// holding the 8x4 blocks of rows 2(w/2) and 2(w/2)+1 in column w%2 (the blocks of warp_mask's bits),
// so each Gaussian's warp reduction serves 64 pixels. No pruning score (that backward keeps one
// pixel per thread). 7 blocks per SM allow 72 registers: no spills with absgrad (at 8 blocks, 64
// registers, it spilled 20 bytes).
constexpr int kThreads2px = kBlock / 2;
template <bool ABS, bool FASTEXP>
__global__ void __launch_bounds__(kThreads2px, 7) render_bwd_2px_kernel(const BwdArgs a) {
    const BwdBlock blk = bwd_block<kThreads2px>(a, kBatch * kGradComps);
    const int w = threadIdx.x >> 5, lane = threadIdx.x & 31;
    PixelBwd p[2];
    uint32_t bits[2];
    int walk = 0;
#pragma unroll
    for (int j = 0; j < 2; ++j) {
        const int row = 2 * (w >> 1) + j, col = w & 1;  // this pixel's 8x4 block (thread_pixel<8>'s layout)
        bits[j] = 1u << (row * (kTile / kWarpWidth) + col);
        const int x = blk.tx * kTile + col * kWarpWidth + lane % kWarpWidth;
        const int y = blk.ty * kTile + row * (32 / kWarpWidth) + lane / kWarpWidth;
        p[j] = pixel_bwd_state<false>(a, x, y, blk.cam);
        walk = max(walk, p[j].last);
    }
    const int warp_end = warp_max_int(walk);
    const int max_last = block_max_int<kThreads2px>(warp_end, blk.red);  // also syncs s_acc's zeroing
    if (max_last == 0 || blk.end <= blk.start) return;
    for (int b = (max_last - 1) / kBatch; b >= 0; --b) {
        const int cnt = min(kBatch, blk.end - blk.start - b * kBatch);
        __syncthreads();
        load_gaussians_masked<FASTEXP, kThreads2px>(blk.s, a.flatten_ids, blk.start + b * kBatch, cnt, a.means2d,
                                                    a.conics, a.colors, a.opacities, blk.tx * kTile, blk.ty * kTile,
                                                    a.cull, a.warp_masks);
        __syncthreads();
        const int hi = min(cnt, max_last - b * kBatch);
        backward_slots_2px<kBatch, ABS, FASTEXP, kThreads2px>(blk.s, 0, hi, b * kBatch, warp_end, p, bits, blk.acc,
                                                              a.v_means2d, a.v_conics, a.v_colors, a.v_opacities,
                                                              a.v_means2d_abs);
    }
}

}  // namespace

std::vector<at::Tensor> render_bwd(const at::Tensor &means2d, const at::Tensor &conics,
                                   const at::Tensor &colors, const at::Tensor &opacities,
                                   const c10::optional<at::Tensor> &backgrounds,
                                   const at::Tensor &offsets, const at::Tensor &flatten_ids,
                                   int64_t C, int64_t W, int64_t H, const at::Tensor &T_final,
                                   const at::Tensor &last, const at::Tensor &v_render,
                                   const c10::optional<at::Tensor> &v_alpha, bool absgrad,
                                   bool butterfly, bool contribution,
                                   const c10::optional<at::Tensor> &stop,
                                   bool warp_cull, const c10::optional<at::Tensor> &warp_masks,
                                   bool fast_exp, int64_t pixels_per_thread,
                                   const c10::optional<at::Tensor> &tile_order,
                                   const c10::optional<at::Tensor> &v_scale) {
    TORCH_CHECK(pixels_per_thread == 1 || pixels_per_thread == 2,
                "bytesplat: the backward takes 1 or 2 pixels per thread, got ", pixels_per_thread);
    check_inputs(means2d, conics, colors, opacities, offsets, flatten_ids, warp_masks);
    TORCH_CHECK(!contribution || (stop.has_value() && stop->scalar_type() == at::kInt &&
                                  stop->numel() == T_final.numel()),
                "bytesplat: the contribution needs render_fwd's stop indices (with_stop=True)");
    const at::cuda::CUDAGuard guard(means2d.device());
    const int tw = (W + kTile - 1) / kTile, th = (H + kTile - 1) / kTile;
    check_tile_order(tile_order, offsets, C, tw, th);
    TORCH_CHECK(!v_scale.has_value() || (v_scale->is_cuda() && v_scale->scalar_type() == at::kFloat &&
                                         v_scale->numel() == 1 && v_scale->device() == means2d.device()),
                "bytesplat: v_scale must be one float32 on the Gaussians' GPU");
    // Every output is summed into by atomics: one zeroed buffer and one fill for all of them, each a
    // contiguous slice of it shaped like its input, starting 256-byte aligned as its own allocation
    // would (vectorized consumers such as torch's elementwise kernels check the alignment).
    const int64_t n_contrib = contribution ? means2d.size(0) : 0;
    auto padded = [](int64_t n) { return (n + 63) / 64 * 64; };
    at::Tensor sums = at::zeros({padded(means2d.numel()) * (absgrad ? 2 : 1) + padded(conics.numel()) +
                                 padded(colors.numel()) + padded(opacities.numel()) + n_contrib}, means2d.options());
    int64_t used = 0;
    auto slice = [&](int64_t n) { at::Tensor t = sums.narrow(0, used, n); used += padded(n); return t; };
    at::Tensor v_means2d = slice(means2d.numel()).view_as(means2d);
    at::Tensor v_conics = slice(conics.numel()).view_as(conics);
    at::Tensor v_colors = slice(colors.numel()).view_as(colors);
    at::Tensor v_opacities = slice(opacities.numel()).view_as(opacities);
    at::Tensor v_abs = absgrad ? slice(means2d.numel()).view_as(means2d) : at::empty({0}, means2d.options());
    at::Tensor contrib = slice(n_contrib);
    if (C == 0 || W == 0 || H == 0 || flatten_ids.numel() == 0)
        return {v_means2d, v_conics, v_colors, v_opacities, v_abs, contrib};
    at::Tensor stop_keep = contribution ? stop->contiguous() : at::Tensor();
    at::Tensor bg_keep = backgrounds.has_value() ? backgrounds->contiguous() : at::Tensor();
    const float *bg = backgrounds.has_value() ? bg_keep.data_ptr<float>() : nullptr;
    at::Tensor vr = v_render.contiguous();
    at::Tensor va_keep = v_alpha.has_value() ? v_alpha->contiguous() : at::Tensor();
    const float *va = v_alpha.has_value() ? va_keep.data_ptr<float>() : nullptr;
    auto stream = at::cuda::getCurrentCUDAStream();
    dim3 grid(tw, th, C);
    const BwdArgs args{(int)W, (int)H, tw, th, means2d.data_ptr<float>(), conics.data_ptr<float>(),
                       colors.data_ptr<float>(), opacities.data_ptr<float>(), bg, offsets.data_ptr<int32_t>(),
                       flatten_ids.data_ptr<int32_t>(), T_final.data_ptr<float>(), last.data_ptr<int32_t>(),
                       contribution ? stop_keep.data_ptr<int32_t>() : nullptr, vr.data_ptr<float>(), va,
                       v_scale.has_value() ? v_scale->data_ptr<float>() : nullptr, v_means2d.data_ptr<float>(),
                       v_conics.data_ptr<float>(), v_colors.data_ptr<float>(),
                       v_opacities.data_ptr<float>(), absgrad ? v_abs.data_ptr<float>() : nullptr,
                       contribution ? contrib.data_ptr<float>() : nullptr,
                       warp_cull, warp_masks.has_value() ? warp_masks->data_ptr<uint8_t>() : nullptr,
                       tile_order.has_value() ? tile_order->data_ptr<int32_t>() : nullptr};
    auto launch = [&](auto kernel, int threads) { kernel<<<grid, threads, kSmemBwdBytes, stream>>>(args); };
    // butterfly: the warp reduction of backward_slots (common.cuh); false = one warp_sum per
    // component, kept for A/B runs (--pipeline.model.fused.bwd-reduce shuffle). contribution: the pruning score
    // (its own kernel instance, so it costs nothing when off). fast_exp: as render_fwd's.
    // pixels_per_thread 2: render_bwd_2px_kernel, for the butterfly reduction without the score (the
    // others keep one pixel per thread).
    if (pixels_per_thread == 2 && butterfly && !contribution) {
        dispatch_bools([&](auto abs, auto fast) {
            launch(render_bwd_2px_kernel<decltype(abs)::value, decltype(fast)::value>, kThreads2px);
        }, absgrad, fast_exp);
    } else {
        dispatch_bools([&](auto abs, auto bfly, auto ctb, auto fast) {
            launch(render_bwd_kernel<decltype(abs)::value, decltype(bfly)::value, decltype(ctb)::value,
                                     decltype(fast)::value>, kBlock);
        }, absgrad, butterfly, contribution, fast_exp);
    }
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return {v_means2d, v_conics, v_colors, v_opacities, v_abs, contrib};
}

}  // namespace bytesplat
