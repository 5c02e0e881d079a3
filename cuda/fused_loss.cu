// One-launch rasterization + loss gradient + backward (ByteSplat idea 1).
//
// Per 16x16 tile, one block: stage the tile's Gaussians in shared memory (in batches of `cap`),
// composite front to back, rgb = clamp(render + T*bg, 0, 1), publish the tile's rgb, wait for the
// 8 neighbouring tiles, compute dL/drgb of splatfacto's loss (1-l)*L1 + l*(1-SSIM) for the tile's
// pixels from rgb/gt over tile+-10 px, then walk the same Gaussians back to front and write each
// Gaussian's 2D gradient once per tile. See docs/fused_ssim.md for why the SSIM part is exact and
// why the wait cannot deadlock. On request the backward walk also gathers the pruning score
// (largest alpha*T per view and Gaussian, docs/pruning.md).
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "common.cuh"
#include "ssim_tile.cuh"  // kWin.., kSsimFloats, clamp01, loss_grad_tile

namespace bytesplat {

namespace {

constexpr int kAccFloats = kChunk * kAccComps;  // gradients + pruning score (used or not: same capacity)
constexpr int kFixedBytes = (kSsimFloats + kAccFloats + 3 * kWarps) * 4;  // + reduction scratch

enum Phase : int { kFused = 0, kForwardOnly = 1, kLossAndBackward = 2 };

struct Params {
    int C, W, H, tw, th, cap, phase, clamp_inclusive, col_major, warp_cull;
    const float *means2d, *conics, *colors, *opacities, *bg, *gt;
    const int32_t *offsets, *flatten_ids;
    float *rgb, *alpha, *partials;
    int *flags, *counter;
    float *v_means2d, *v_conics, *v_colors, *v_opacities, *v_abs;
    float *contrib;  // [C*N] pruning score, CONTRIB only
    float w_l1, w_ssim, C1, C2;
    float win[kWin];
};

template <bool ABS, bool BUTTERFLY, bool CONTRIB, bool FASTEXP>
__global__ void __launch_bounds__(kBlock, 2) fused_loss_kernel(const Params P) {
    extern __shared__ float4 smem4[];
    SmemGaussians s;
    char *p_end = s.carve(reinterpret_cast<char *>(smem4), P.cap);
    float *s_ssim = reinterpret_cast<float *>(p_end);
    float *s_acc = s_ssim + kSsimFloats;
    float *s_red = s_acc + kAccFloats;
    int *s_int = reinterpret_cast<int *>(s_red + kWarps);  // 2*kWarps ints

    // Tiles are taken in increasing order from a global counter, not by blockIdx: a block then
    // only ever waits on tiles that a resident (or finished) block already holds, or on tiles at
    // most d+1 claims ahead (d = tiles along the inner axis of the claim order), which some
    // resident block must hold once >= d+2 blocks fit on the device. The inner axis is the shorter
    // image axis (column-major on landscape images): a smaller d also means shorter waits, since
    // a block waits about d/resident of a block lifetime for its last neighbour's forward.
    int claim;
    if (P.phase == kFused) {
        if (threadIdx.x == 0) s_int[0] = atomicAdd(P.counter, 1);
        __syncthreads();
        claim = s_int[0];
    } else {
        claim = blockIdx.x;
    }
    for (int i = threadIdx.x; i < kAccFloats; i += kBlock) s_acc[i] = 0.f;

    const int ntiles = P.tw * P.th;
    const int cam = claim / ntiles, r = claim % ntiles;
    const int tx = P.col_major ? r / P.th : r % P.tw;
    const int ty = P.col_major ? r % P.th : r / P.tw;
    const int t = cam * ntiles + ty * P.tw + tx;  // tile id: offsets, flags and partials use it
    // rows of 16 pixels per half-warp: the SSIM code (ssim_tile.cuh) maps threads to pixels the same way
    const int2 xy = thread_pixel<16>(tx, ty);
    const int x = xy.x, y = xy.y;
    const bool inside = x < P.W && y < P.H;
    const float px = x + 0.5f, py = y + 0.5f;
    const int start = P.offsets[t], n = P.offsets[t + 1] - start;
    const int64_t pix = ((int64_t)cam * P.H + y) * P.W + x;

    // ---- forward: front to back, batches of `cap` (one batch when the tile fits on chip) ----
    float T = 1.f;
    float3 acc = make_float3(0.f, 0.f, 0.f);
    int last = 0, stop = -1, loaded = -1;
    bool done = !inside;
    for (int b = 0; b * P.cap < n; ++b) {
        if (__syncthreads_count(done) == kBlock) break;
        const int cnt = min(P.cap, n - b * P.cap);
        load_gaussians<16, FASTEXP>(s, P.flatten_ids, start + b * P.cap, cnt, P.means2d, P.conics, P.colors,
                                    P.opacities, tx * kTile, ty * kTile, P.warp_cull != 0);
        loaded = b;
        __syncthreads();
        composite_slots<FASTEXP>(s, AllSlots{s.warps, 1u << (threadIdx.x >> 5)}, cnt, b * P.cap, px, py, T, acc, last,
                                 stop, done);
    }
    const float3 bgc = make_float3(P.bg[3 * cam], P.bg[3 * cam + 1], P.bg[3 * cam + 2]);
    const float raw[3] = {acc.x + T * bgc.x, acc.y + T * bgc.y, acc.z + T * bgc.z};

    if (P.phase != kLossAndBackward) {
        if (inside) {
            P.rgb[3 * pix] = clamp01(raw[0]);
            P.rgb[3 * pix + 1] = clamp01(raw[1]);
            P.rgb[3 * pix + 2] = clamp01(raw[2]);
            P.alpha[pix] = 1.f - T;
        }
        // Publish: every writer fences, then one release flag per tile.
        __threadfence();
        __syncthreads();
        if (threadIdx.x == 0) atomicExch(P.flags + t, 1);
        if (P.phase == kForwardOnly) return;
    }

    if (P.phase == kFused) {
        // Wait for the (up to) 8 neighbours of the same view.
        if (threadIdx.x == 0) {
            for (int dy = -1; dy <= 1; ++dy)
                for (int dx = -1; dx <= 1; ++dx) {
                    const int nx = tx + dx, ny = ty + dy;
                    if ((dx == 0 && dy == 0) || nx < 0 || ny < 0 || nx >= P.tw || ny >= P.th) continue;
                    const volatile int *f = P.flags + (cam * ntiles + ny * P.tw + nx);
                    while (*f == 0) __nanosleep(64);
                }
            __threadfence();
        }
        __syncthreads();
    }

    // ---- per-pixel loss gradient (exact, from the neighbours' published rgb) ----
    float dl[3];
    float ssim_sum;
    loss_grad_tile(P, cam, tx, ty, s_ssim, dl, ssim_sum, s_red);
    float l1 = 0.f;
    if (inside) {
        const float *g = P.gt + 3 * pix;
        l1 = fabsf(clamp01(raw[0]) - g[0]) + fabsf(clamp01(raw[1]) - g[1]) +
             fabsf(clamp01(raw[2]) - g[2]);
    }
    const float l1_sum = block_sum(l1, s_red);
    if (threadIdx.x == 0) {
        P.partials[2 * t] = l1_sum;
        P.partials[2 * t + 1] = ssim_sum;
    }

    // ---- backward: back to front over the same Gaussians ----
    PixelBwd p;
    p.px = px;
    p.py = py;
    p.T = p.T_final = T;
    p.buf = make_float3(0.f, 0.f, 0.f);
    p.last = inside ? last : 0;
    p.stop = inside ? stop : -1;
    // clamp() passes the gradient inside (0, 1); at exactly 0 or 1 it follows the installed
    // torch.clamp's rule (detected by the caller: strict in recent torch).
    float m[3];
#pragma unroll
    for (int c = 0; c < 3; ++c) m[c] = clamp_grad_mask(raw[c], P.clamp_inclusive != 0);
    p.v_rgb = inside ? make_float3(dl[0] * m[0], dl[1] * m[1], dl[2] * m[2]) : make_float3(0.f, 0.f, 0.f);
    p.v_aT = -T * (bgc.x * p.v_rgb.x + bgc.y * p.v_rgb.y + bgc.z * p.v_rgb.z);
    // the walk's end: the stopping Gaussians (all in batches the forward loaded) count for the score
    const int warp_end = warp_walk_end<CONTRIB>(p);
    const int max_last = block_max_int(warp_end, s_int + 1);
    if (max_last == 0) return;
    for (int b = (max_last - 1) / P.cap; b >= 0; --b) {
        const int cnt = min(P.cap, n - b * P.cap);
        if (b != loaded) {  // only over-capacity tiles re-stream from global memory
            __syncthreads();
            load_gaussians<16, FASTEXP>(s, P.flatten_ids, start + b * P.cap, cnt, P.means2d, P.conics,
                                        P.colors, P.opacities, tx * kTile, ty * kTile, P.warp_cull != 0);
            loaded = b;
            __syncthreads();
        }
        const int hi = min(cnt, max_last - b * P.cap);
        backward_slots<kChunk, ABS, BUTTERFLY, CONTRIB, FASTEXP>(s, 0, hi, b * P.cap, warp_end, p, s_acc, P.v_means2d,
                                                                 P.v_conics, P.v_colors, P.v_opacities, P.v_abs,
                                                                 P.contrib);
    }
}

int capacity_for(int blocks_per_sm, int device, int *smem_bytes) {
    int per_sm = 0, per_block_optin = 0, reserved = 0;
    C10_CUDA_CHECK(cudaDeviceGetAttribute(&per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, device));
    C10_CUDA_CHECK(cudaDeviceGetAttribute(&per_block_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
    C10_CUDA_CHECK(cudaDeviceGetAttribute(&reserved, cudaDevAttrReservedSharedMemoryPerBlock, device));
    int budget = std::min(per_block_optin, per_sm / std::max(1, blocks_per_sm) - reserved);
    int cap = (budget - kFixedBytes) / SmemGaussians::kBytes;
    cap = (cap / kChunk) * kChunk;
    TORCH_CHECK(cap >= kChunk, "bytesplat: too little shared memory per block for the fused kernel (",
                budget, " bytes)");
    *smem_bytes = kFixedBytes + cap * SmemGaussians::kBytes;
    return cap;
}

}  // namespace

// The kernel's shared-memory layout {bytes per staged Gaussian, fixed bytes per block, capacity
// granularity}: what bytesplat_ns.pruning.FUSED_SMEM_LAYOUT states for machines without the extension.
std::vector<int64_t> fused_smem_layout() {
    return {SmemGaussians::kBytes, kFixedBytes, kChunk};
}

// Number of Gaussians per tile the fused kernel keeps on chip for `blocks_per_sm` blocks per SM.
int64_t fused_capacity(int64_t blocks_per_sm) {
    int dev = 0, smem = 0;
    C10_CUDA_CHECK(cudaGetDevice(&dev));
    return capacity_for((int)blocks_per_sm, dev, &smem);
}

// Returns {rgb [C,H,W,3] (clamped), alpha [C,H,W,1], partials [C*tiles,2] (L1 sum, SSIM sum),
// v_means2d, v_conics, v_colors, v_opacities, v_means2d_abs, info (CPU int64: two_phase, cap),
// contribution [C*N] (the pruning score when `contribution`, else empty)}.
// The gradients are of the loss itself (grad_output 1).
std::vector<at::Tensor> fused_loss(const at::Tensor &means2d, const at::Tensor &conics,
                                   const at::Tensor &colors, const at::Tensor &opacities,
                                   const at::Tensor &backgrounds, const at::Tensor &gt,
                                   const at::Tensor &offsets, const at::Tensor &flatten_ids,
                                   int64_t C, int64_t W, int64_t H, double ssim_lambda,
                                   const at::Tensor &window, int64_t cap_override,
                                   int64_t blocks_per_sm, bool absgrad, bool force_two_phase,
                                   bool clamp_inclusive, bool butterfly, bool contribution,
                                   bool warp_cull, bool fast_exp) {
    for (const at::Tensor *t : {&means2d, &conics, &colors, &opacities, &backgrounds, &gt}) {
        TORCH_CHECK(t->is_cuda() && t->scalar_type() == at::kFloat && t->is_contiguous(),
                    "bytesplat: fused_loss inputs must be contiguous float32 CUDA tensors");
    }
    TORCH_CHECK(offsets.scalar_type() == at::kInt && flatten_ids.scalar_type() == at::kInt,
                "bytesplat: tile offsets and flatten ids must be int32");
    TORCH_CHECK(W >= kWin && H >= kWin, "bytesplat: SSIM needs images of at least 11x11 pixels");
    TORCH_CHECK(window.numel() == kWin && window.device().is_cpu(), "bytesplat: window must be 11 CPU floats");
    const at::cuda::CUDAGuard guard(means2d.device());
    const int dev = means2d.get_device();
    const int tw = (W + kTile - 1) / kTile, th = (H + kTile - 1) / kTile;
    const int64_t ntot = C * (int64_t)tw * th;
    TORCH_CHECK(offsets.numel() == ntot + 1, "bytesplat: offsets must have C*tiles+1 entries");

    int smem = 0;
    int cap = capacity_for((int)blocks_per_sm, dev, &smem);
    if (cap_override > 0) {
        cap = (int)cap_override;
        smem = kFixedBytes + cap * SmemGaussians::kBytes;
    }
    auto fopt = means2d.options();
    at::Tensor rgb = at::empty({C, H, W, 3}, fopt);
    at::Tensor alpha = at::empty({C, H, W, 1}, fopt);
    at::Tensor partials = at::zeros({ntot, 2}, fopt);
    at::Tensor v_means2d = at::zeros_like(means2d);
    at::Tensor v_conics = at::zeros_like(conics);
    at::Tensor v_colors = at::zeros_like(colors);
    at::Tensor v_opacities = at::zeros_like(opacities);
    at::Tensor v_abs = absgrad ? at::zeros_like(means2d) : at::empty({0}, fopt);
    at::Tensor contrib = contribution ? at::zeros({means2d.size(0)}, fopt) : at::empty({0}, fopt);
    at::Tensor sync = at::zeros({ntot + 1}, fopt.dtype(at::kInt));  // flags[ntot], counter

    Params P;
    P.C = C; P.W = W; P.H = H; P.tw = tw; P.th = th; P.cap = cap;
    P.clamp_inclusive = clamp_inclusive ? 1 : 0;
    P.warp_cull = warp_cull ? 1 : 0;
    P.means2d = means2d.data_ptr<float>();
    P.conics = conics.data_ptr<float>();
    P.colors = colors.data_ptr<float>();
    P.opacities = opacities.data_ptr<float>();
    P.bg = backgrounds.data_ptr<float>();
    P.gt = gt.data_ptr<float>();
    P.offsets = offsets.data_ptr<int32_t>();
    P.flatten_ids = flatten_ids.data_ptr<int32_t>();
    P.rgb = rgb.data_ptr<float>();
    P.alpha = alpha.data_ptr<float>();
    P.partials = partials.data_ptr<float>();
    P.flags = sync.data_ptr<int32_t>();
    P.counter = P.flags + ntot;
    P.v_means2d = v_means2d.data_ptr<float>();
    P.v_conics = v_conics.data_ptr<float>();
    P.v_colors = v_colors.data_ptr<float>();
    P.v_opacities = v_opacities.data_ptr<float>();
    P.v_abs = absgrad ? v_abs.data_ptr<float>() : nullptr;
    P.contrib = contribution ? contrib.data_ptr<float>() : nullptr;
    at::Tensor win = window.to(at::kFloat).contiguous();
    set_loss_constants(P, C, H, W, ssim_lambda, win.data_ptr<float>());  // cuda/ssim_tile.cuh

    // butterfly: the warp reduction of backward_slots (common.cuh); false = one warp_sum per
    // component, kept for A/B runs (--pipeline.model.fused.bwd-reduce shuffle). contribution: the pruning score,
    // a separate instance so that it costs nothing when off. fast_exp: the falloff as 2^q from the
    // prescaled conic (common.cuh staged_conic).
    void (*kernel)(const Params) = nullptr;
    dispatch_bools([&](auto abs, auto bfly, auto ctb, auto fast) {
        kernel = fused_loss_kernel<decltype(abs)::value, decltype(bfly)::value, decltype(ctb)::value,
                                   decltype(fast)::value>;
    }, absgrad, butterfly, contribution, fast_exp);
    C10_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    int per_sm = 0, sms = 0;
    C10_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kBlock, smem));
    C10_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    TORCH_CHECK(per_sm >= 1, "bytesplat: the fused kernel does not fit on this GPU (", smem,
                " bytes of shared memory per block)");
    // Deadlock freedom of the neighbour wait needs inner+2 co-resident blocks (docs/fused_ssim.md).
    P.col_major = th < tw ? 1 : 0;
    const int inner = P.col_major ? th : tw;
    const bool two_phase = force_two_phase || (int64_t)per_sm * sms < inner + 2;
    auto stream = at::cuda::getCurrentCUDAStream();
    if (ntot > 0) {
        if (!two_phase) {
            P.phase = kFused;
            kernel<<<(unsigned)ntot, kBlock, smem, stream>>>(P);
            C10_CUDA_KERNEL_LAUNCH_CHECK();
        } else {
            P.phase = kForwardOnly;
            kernel<<<(unsigned)ntot, kBlock, smem, stream>>>(P);
            C10_CUDA_KERNEL_LAUNCH_CHECK();
            P.phase = kLossAndBackward;
            kernel<<<(unsigned)ntot, kBlock, smem, stream>>>(P);
            C10_CUDA_KERNEL_LAUNCH_CHECK();
        }
    }
    at::Tensor info = at::empty({4}, at::TensorOptions().dtype(at::kLong));
    auto ia = info.accessor<int64_t, 1>();
    ia[0] = (int64_t)two_phase;
    ia[1] = (int64_t)cap;
    ia[2] = (int64_t)per_sm * sms;
    ia[3] = (int64_t)smem;
    return {rgb, alpha, partials, v_means2d, v_conics, v_colors, v_opacities, v_abs, info, contrib};
}

}  // namespace bytesplat
