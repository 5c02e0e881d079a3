// One-launch rasterization + loss gradient + backward (ByteSplat idea 1).
//
// Per 16x16 tile, one block: stage the tile's Gaussians in shared memory (in batches of `cap`),
// composite front to back, rgb = clamp(render + T*bg, 0, 1), publish the tile's rgb, wait for the
// 8 neighbouring tiles, compute dL/drgb of splatfacto's loss (1-l)*L1 + l*(1-SSIM) for the tile's
// pixels from rgb/gt over tile+-10 px, then walk the same Gaussians back to front and write each
// Gaussian's 2D gradient once per tile. See docs/fused_ssim.md for why the SSIM part is exact and
// why the wait cannot deadlock.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "common.cuh"

namespace bytesplat {

namespace {

constexpr int kWin = 11;                   // SSIM window
constexpr int kHalf = kWin / 2;            // 5
constexpr int kReg = kTile + 4 * kHalf;    // 36: pixels needed per axis (tile +- 10)
constexpr int kCen = kTile + 2 * kHalf;    // 26: SSIM centers per axis (tile +- 5)
// SSIM scratch (floats): x and y over kReg^2; horizontal sums [kReg][kCen][5] (later reused for
// the backward horizontal pass [kCen][kTile][3]); per-center partials [kCen][kCen][3].
constexpr int kSsimXY = 2 * kReg * kReg;
constexpr int kSsimH = kReg * kCen * 5;
constexpr int kSsimP = kCen * kCen * 3;
constexpr int kSsimFloats = kSsimXY + kSsimH + kSsimP;
constexpr int kAccFloats = kChunk * kGradComps;
constexpr int kFixedBytes = (kSsimFloats + kAccFloats + 3 * kWarps) * 4;  // + reduction scratch

enum Phase : int { kFused = 0, kForwardOnly = 1, kLossAndBackward = 2 };

struct Params {
    int C, W, H, tw, th, cap, phase, clamp_inclusive, col_major;
    const float *means2d, *conics, *colors, *opacities, *bg, *gt;
    const int32_t *offsets, *flatten_ids;
    float *rgb, *alpha, *partials;
    int *flags, *counter;
    float *v_means2d, *v_conics, *v_colors, *v_opacities, *v_abs;
    float w_l1, w_ssim, C1, C2;
    float win[kWin];
};

__device__ __forceinline__ float clamp01(float v) { return fminf(fmaxf(v, 0.f), 1.f); }

// dL/d rgb for this thread's pixel (3 channels), given that the rgb of every tile within one tile
// of ours is in p.rgb. Also returns this block's sum of SSIM over the centers inside our tile.
__device__ __forceinline__ void loss_grad_tile(const Params &P, int cam, int tx, int ty, float *s, float dl[3],
                               float &ssim_sum, float *s_red) {
    float *s_x = s, *s_y = s + kReg * kReg;
    float *s_h = s + kSsimXY;               // [kReg][kCen][5], later [kCen][kTile][3]
    float *s_p = s + kSsimXY + kSsimH;      // [kCen][kCen][3]
    const int X0 = tx * kTile - 2 * kHalf, Y0 = ty * kTile - 2 * kHalf;
    const int lx = threadIdx.x % kTile, ly = threadIdx.x / kTile;
    const int64_t img = (int64_t)cam * P.H * P.W;
    float ssum = 0.f;
    for (int c = 0; c < 3; ++c) {
        for (int i = threadIdx.x; i < kReg * kReg; i += kBlock) {
            const int gx = X0 + i % kReg, gy = Y0 + i / kReg;
            float xv = 0.f, yv = 0.f;
            if (gx >= 0 && gx < P.W && gy >= 0 && gy < P.H) {
                const int64_t q = 3 * (img + (int64_t)gy * P.W + gx) + c;
                xv = __ldcg(P.rgb + q);  // written by other blocks of this launch: bypass L1
                yv = P.gt[q];
            }
            s_x[i] = xv;
            s_y[i] = yv;
        }
        __syncthreads();
        // Horizontal window sums of x, y, x^2, y^2, xy for every row and center column.
        for (int i = threadIdx.x; i < kReg * kCen; i += kBlock) {
            const int r = i / kCen, j = i % kCen;
            float m0 = 0.f, m1 = 0.f, m2 = 0.f, m3 = 0.f, m4 = 0.f;
#pragma unroll
            for (int k = 0; k < kWin; ++k) {
                const float w = P.win[k];
                const float xv = s_x[r * kReg + j + k], yv = s_y[r * kReg + j + k];
                m0 += w * xv;
                m1 += w * yv;
                m2 += w * xv * xv;
                m3 += w * yv * yv;
                m4 += w * xv * yv;
            }
            float *h = s_h + 5 * i;
            h[0] = m0; h[1] = m1; h[2] = m2; h[3] = m3; h[4] = m4;
        }
        __syncthreads();
        // Vertical sums -> SSIM statistics per center; per-center partials of S wrt
        // (mu_x, E[x^2], E[xy]) (mu_x's includes its effect through the variances).
        for (int i = threadIdx.x; i < kCen * kCen; i += kBlock) {
            const int ci = i / kCen, cj = i % kCen;
            const int sy = ty * kTile - kHalf + ci, sx = tx * kTile - kHalf + cj;
            float pa = 0.f, pb = 0.f, pc = 0.f;
            if (sy >= kHalf && sy < P.H - kHalf && sx >= kHalf && sx < P.W - kHalf) {
                float m[5] = {0.f, 0.f, 0.f, 0.f, 0.f};
#pragma unroll
                for (int k = 0; k < kWin; ++k) {
                    const float w = P.win[k];
                    const float *h = s_h + 5 * ((ci + k) * kCen + cj);
#pragma unroll
                    for (int q = 0; q < 5; ++q) m[q] += w * h[q];
                }
                const float mx = m[0], my = m[1];
                const float sxx = m[2] - mx * mx, syy = m[3] - my * my, sxy = m[4] - mx * my;
                const float n1 = 2.f * mx * my + P.C1, d1 = mx * mx + my * my + P.C1;
                const float n2 = 2.f * sxy + P.C2, d2 = sxx + syy + P.C2;
                const float A = n1 / d1, B = n2 / d2, S = A * B;
                const float dS_dsxy = 2.f * A / d2;
                const float dS_dsxx = -S / d2;
                pa = 2.f * B * (my - A * mx) / d1 - dS_dsxy * my - 2.f * dS_dsxx * mx;
                pb = dS_dsxx;
                pc = dS_dsxy;
                if (ci >= kHalf && ci < kHalf + kTile && cj >= kHalf && cj < kHalf + kTile) ssum += S;
            }
            s_p[3 * i] = pa;
            s_p[3 * i + 1] = pb;
            s_p[3 * i + 2] = pc;
        }
        __syncthreads();
        // Transposed window, horizontal: per center row and pixel column.
        for (int i = threadIdx.x; i < kCen * kTile; i += kBlock) {
            const int ci = i / kTile, u = i % kTile;
            float a0 = 0.f, a1 = 0.f, a2 = 0.f;
#pragma unroll
            for (int k = 0; k < kWin; ++k) {
                const float w = P.win[k];
                const float *pp = s_p + 3 * (ci * kCen + u + k);
                a0 += w * pp[0];
                a1 += w * pp[1];
                a2 += w * pp[2];
            }
            s_h[3 * i] = a0;
            s_h[3 * i + 1] = a1;
            s_h[3 * i + 2] = a2;
        }
        __syncthreads();
        // Vertical, one pixel per thread: dS/dx = A + 2 x B + y C.
        float a0 = 0.f, a1 = 0.f, a2 = 0.f;
#pragma unroll
        for (int k = 0; k < kWin; ++k) {
            const float w = P.win[k];
            const float *hh = s_h + 3 * ((ly + k) * kTile + lx);
            a0 += w * hh[0];
            a1 += w * hh[1];
            a2 += w * hh[2];
        }
        const float xv = s_x[(ly + 2 * kHalf) * kReg + lx + 2 * kHalf];
        const float yv = s_y[(ly + 2 * kHalf) * kReg + lx + 2 * kHalf];
        const float dS = a0 + 2.f * xv * a1 + yv * a2;
        const float d = xv - yv;
        const float sgn = d > 0.f ? 1.f : (d < 0.f ? -1.f : 0.f);
        dl[c] = P.w_l1 * sgn - P.w_ssim * dS;
        __syncthreads();  // s_x/s_y/s_h are reused by the next channel
    }
    ssim_sum = block_sum(ssum, s_red);
}

template <bool ABS, bool BUTTERFLY>
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
    const int x = tx * kTile + (threadIdx.x % kTile), y = ty * kTile + (threadIdx.x / kTile);
    const bool inside = x < P.W && y < P.H;
    const float px = x + 0.5f, py = y + 0.5f;
    const int start = P.offsets[t], n = P.offsets[t + 1] - start;
    const int64_t pix = ((int64_t)cam * P.H + y) * P.W + x;

    // ---- forward: front to back, batches of `cap` (one batch when the tile fits on chip) ----
    float T = 1.f;
    float3 acc = make_float3(0.f, 0.f, 0.f);
    int last = 0, loaded = -1;
    bool done = !inside;
    for (int b = 0; b * P.cap < n; ++b) {
        if (__syncthreads_count(done) == kBlock) break;
        const int cnt = min(P.cap, n - b * P.cap);
        load_gaussians(s, P.flatten_ids, start + b * P.cap, cnt, P.means2d, P.conics, P.colors,
                       P.opacities);
        loaded = b;
        __syncthreads();
        composite_slots(s, cnt, b * P.cap, px, py, T, acc, last, done);
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
    // clamp() passes the gradient inside (0, 1); at exactly 0 or 1 it follows the installed
    // torch.clamp's rule (detected by the caller: strict in recent torch).
    float m[3];
#pragma unroll
    for (int c = 0; c < 3; ++c)
        m[c] = (P.clamp_inclusive ? (raw[c] >= 0.f && raw[c] <= 1.f) : (raw[c] > 0.f && raw[c] < 1.f)) ? 1.f : 0.f;
    p.v_rgb = inside ? make_float3(dl[0] * m[0], dl[1] * m[1], dl[2] * m[2]) : make_float3(0.f, 0.f, 0.f);
    p.v_a = -(bgc.x * p.v_rgb.x + bgc.y * p.v_rgb.y + bgc.z * p.v_rgb.z);
    const int max_last = block_max_int(p.last, s_int + 1);
    if (max_last == 0) return;
    for (int b = (max_last - 1) / P.cap; b >= 0; --b) {
        const int cnt = min(P.cap, n - b * P.cap);
        if (b != loaded) {  // only over-capacity tiles re-stream from global memory
            __syncthreads();
            load_gaussians(s, P.flatten_ids, start + b * P.cap, cnt, P.means2d, P.conics, P.colors,
                           P.opacities);
            loaded = b;
            __syncthreads();
        }
        const int hi = min(cnt, max_last - b * P.cap);
        backward_slots<ABS, BUTTERFLY>(s, 0, hi, b * P.cap, p, s_acc, P.v_means2d, P.v_conics, P.v_colors,
                            P.v_opacities, P.v_abs);
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

// Number of Gaussians per tile the fused kernel keeps on chip for `blocks_per_sm` blocks per SM.
int64_t fused_capacity(int64_t blocks_per_sm) {
    int dev = 0, smem = 0;
    C10_CUDA_CHECK(cudaGetDevice(&dev));
    return capacity_for((int)blocks_per_sm, dev, &smem);
}

// Returns {rgb [C,H,W,3] (clamped), alpha [C,H,W,1], partials [C*tiles,2] (L1 sum, SSIM sum),
// v_means2d, v_conics, v_colors, v_opacities, v_means2d_abs, info (CPU int64: two_phase, cap)}.
// The gradients are of the loss itself (grad_output 1).
std::vector<at::Tensor> fused_loss(const at::Tensor &means2d, const at::Tensor &conics,
                                   const at::Tensor &colors, const at::Tensor &opacities,
                                   const at::Tensor &backgrounds, const at::Tensor &gt,
                                   const at::Tensor &offsets, const at::Tensor &flatten_ids,
                                   int64_t C, int64_t W, int64_t H, double ssim_lambda,
                                   const at::Tensor &window, int64_t cap_override,
                                   int64_t blocks_per_sm, bool absgrad, bool force_two_phase,
                                   bool clamp_inclusive, bool butterfly) {
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
    at::Tensor sync = at::zeros({ntot + 1}, fopt.dtype(at::kInt));  // flags[ntot], counter

    Params P;
    P.C = C; P.W = W; P.H = H; P.tw = tw; P.th = th; P.cap = cap;
    P.clamp_inclusive = clamp_inclusive ? 1 : 0;
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
    const double nvalid = (double)C * 3.0 * (double)(H - 2 * kHalf) * (double)(W - 2 * kHalf);
    P.w_l1 = (float)((1.0 - ssim_lambda) / ((double)C * H * W * 3.0));
    P.w_ssim = (float)(ssim_lambda / nvalid);
    P.C1 = 0.01f * 0.01f;
    P.C2 = 0.03f * 0.03f;
    at::Tensor win = window.to(at::kFloat).contiguous();
    for (int k = 0; k < kWin; ++k) P.win[k] = win.data_ptr<float>()[k];

    // butterfly: the warp reduction of backward_slots (common.cuh); false = one warp_sum per
    // component, kept for A/B runs (BYTESPLAT_BWD_REDUCE=shuffle).
    auto kernel = absgrad ? (butterfly ? fused_loss_kernel<true, true> : fused_loss_kernel<true, false>)
                          : (butterfly ? fused_loss_kernel<false, true> : fused_loss_kernel<false, false>);
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
    return {rgb, alpha, partials, v_means2d, v_conics, v_colors, v_opacities, v_abs, info};
}

}  // namespace bytesplat
