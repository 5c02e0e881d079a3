// The SSIM + L1 loss gradient of one image region (shared by the fused kernel, cuda/fused_loss.cu,
// one 16x16 tile per block, and the split schedule's loss_grad kernel, cuda/loss_grad.cu, 32x32
// pixels per block). See docs/fused_ssim.md.
//
// splatfacto's loss (1-l)*mean|x-y| + l*(1-SSIM(x, y)), x = clamp(render, 0, 1), SSIM as
// pytorch_msssim (11-tap Gaussian window, VALID convolution, C1 = 0.01^2, C2 = 0.03^2). For an RW x RH
// region the exact dL/dx needs x and y over region +- 10 px ((RW+10) x (RH+10) SSIM centers).
#pragma once

#include "common.cuh"

namespace bytesplat {

constexpr int kWin = 11;                   // SSIM window
constexpr int kHalf = kWin / 2;            // 5

// Shared-memory layout of an RW x RH region (floats): x and y over the pixels needed; horizontal sums
// [RegH][CenW][5] (later reused for the backward horizontal pass [CenH][RW][3]); per-center
// partials [CenH][CenW][3]. The halo costs less per pixel in a larger region (16x16: 26x26 centers
// for 256 pixels, 32x32: 42x42 for 1024). PARTIALS_OVER_XY puts the partials over x and y, which
// are dead once the horizontal sums are taken, except at the region's own pixels, which the last
// pass reads: those are copied aside first ([2][RH][RW]; read again from global memory instead,
// the kernel spilled at three blocks' 80 registers). The 32x32 region's 84.5 KB become 71.8 KB, three
// blocks per SM instead of two. The fused kernel keeps the separate layout (its capacity is sized
// on it: bytesplat_ns/pruning.py).
//
// Each pass of the separable window gives a thread a strip of consecutive outputs along the
// window's direction, so each input it loads from shared memory serves every output of the strip
// whose window covers it (a strip of S outputs loads S + 10 inputs, not 11 S). Shared-memory loads
// bound the passes otherwise: an H100 SM serves one warp-wide 32-bit load per cycle against four
// warp-wide FMAs. Every output still sums its 11 taps in window order, so the strips change no
// value. The fused kernel's 16x16 tile (one pixel per thread, its registers shared with the
// compositing state) keeps strips of one.
template <int RW, int RH, bool PARTIALS_OVER_XY = false>
struct SsimRegion {
    static constexpr int kRegW = RW + 4 * kHalf, kRegH = RH + 4 * kHalf;  // pixels needed (region +- 10)
    static constexpr int kCenW = RW + 2 * kHalf, kCenH = RH + 2 * kHalf;  // SSIM centers (region +- 5)
    static constexpr int kXY = 2 * kRegW * kRegH;
    static constexpr int kH = kRegH * kCenW * 5 > kCenH * RW * 3 ? kRegH * kCenW * 5 : kCenH * RW * 3;
    static constexpr int kP = kCenW * kCenH * 3;
    // offsets of the horizontal sums and of the partials (x at 0, y at kRegW * kRegH)
    static constexpr int kHOffset = PARTIALS_OVER_XY ? (kXY > kP ? kXY : kP) : kXY;
    static constexpr int kPOffset = PARTIALS_OVER_XY ? 0 : kXY + kH;
    static constexpr int kOwnOffset = kHOffset + kH;  // PARTIALS_OVER_XY: the own pixels' x, y
    static constexpr int kFloats = PARTIALS_OVER_XY ? kOwnOffset + 2 * RW * RH : kXY + kH + kP;
    static constexpr int kPixels = RW * RH / kBlock;  // pixels per thread: consecutive rows of one column
    static_assert(RW * RH % kBlock == 0 && kBlock % RW == 0, "a region is whole columns of pixels per thread");
    static constexpr bool kStrips = kPixels > 1;
    static constexpr int kStripCen = kStrips ? 7 : 1;  // centers per strip (forward passes)
    static constexpr int kStripPix = kStrips ? 8 : 1;  // pixel columns per strip (backward horizontal pass)
    static_assert(kCenW % kStripCen == 0 && kCenH % kStripCen == 0 && RW % kStripPix == 0, "whole strips");

    // Region pixel (column, row) of this thread's pixel k < kPixels.
    __device__ __forceinline__ static int2 pixel(int k) {
        return make_int2(threadIdx.x % RW, (threadIdx.x / RW) * kPixels + k);
    }
};

// The fused kernel's region, its 16x16 tile (one pixel per thread), spelled out in plain constants
// for the shared-memory layout that fused_smem_layout() (cuda/fused_loss.cu) reports to bytesplat_ns/pruning.py.
constexpr int kTileReg = kTile + 4 * kHalf;  // 36
constexpr int kTileCen = kTile + 2 * kHalf;  // 26
constexpr int kSsimFloats = 2 * kTileReg * kTileReg + kTileReg * kTileCen * 5 + kTileCen * kTileCen * 3;
static_assert(kSsimFloats == SsimRegion<kTile, kTile>::kFloats, "the tile's SSIM scratch");

__device__ __forceinline__ float clamp01(float v) { return fminf(fmaxf(v, 0.f), 1.f); }

// torch.clamp(v, 0, 1)'s gradient mask: 1 inside (0, 1); at exactly 0 or 1 it follows the installed
// torch's rule (`inclusive`, detected by the Python caller: strict in recent torch).
__device__ __forceinline__ float clamp_grad_mask(float v, bool inclusive) {
    return (inclusive ? (v >= 0.f && v <= 1.f) : (v > 0.f && v < 1.f)) ? 1.f : 0.f;
}

// The 11-tap window over a strip of S consecutive outputs whose inputs are V-value elements
// `stride` floats apart in shared memory: out[o][q] = sum_t win[t] * base[(o + t) * stride + q], each
// output's taps summed in window order. A strip loads S + kWin - 1 inputs, each serving every output
// whose window covers it.
template <int S, int V>
__device__ __forceinline__ void strip_window_sums(const float *base, int stride, const float *win,
                                                  float (&out)[S][V]) {
#pragma unroll
    for (int o = 0; o < S; ++o)
#pragma unroll
        for (int q = 0; q < V; ++q) out[o][q] = 0.f;
#pragma unroll
    for (int u = 0; u < S + kWin - 1; ++u) {
        float v[V];
#pragma unroll
        for (int q = 0; q < V; ++q) v[q] = base[u * stride + q];
#pragma unroll
        for (int o = 0; o < S; ++o) {
            if (u - o < 0 || u - o >= kWin) continue;
            const float w = win[u - o];
#pragma unroll
            for (int q = 0; q < V; ++q) out[o][q] += w * v[q];
        }
    }
}

// dL/d rgb (3 channels) for this thread's pixels of the RW x RH region whose top-left pixel is
// (X, Y) in view `cam`: pixel k (k < kPixels) is region pixel SsimRegion<RW, RH>::pixel(k), the
// thread's column and kPixels consecutive rows (RW = 16: one pixel, thread i at column i % 16, row i / 16). The image of every pixel within 10 of
// the region must be in P.rgb (the loads clamp it to [0, 1]: the fused kernel publishes clamped rgb,
// where clamping again changes nothing; the split schedule's loss_grad kernel passes the raw
// render + T*bg). Also returns the block's sum of SSIM over the centers inside the region. `s`:
// SsimRegion<RW, RH, PARTIALS_OVER_XY>::kFloats floats of shared memory; `s_red`: kWarps floats.
// Called by the whole block (kBlock threads).
//
// Prm is the caller's launch parameter struct; it must have: int W, H; const float *rgb, *gt
// ([C,H,W,3]); float w_l1, w_ssim (the loss weights over the element counts), C1, C2;
// float win[kWin] (pytorch_msssim's normalised window).
template <int RW, int RH, bool PARTIALS_OVER_XY = false, class Prm>
__device__ __forceinline__ void loss_grad_region(const Prm &P, int cam, int X, int Y, float *s,
                                                 float dl[][3], float &ssim_sum, float *s_red) {
    using R = SsimRegion<RW, RH, PARTIALS_OVER_XY>;
    constexpr int kRegW = R::kRegW, kRegH = R::kRegH, kCenW = R::kCenW, kCenH = R::kCenH;
    float *s_x = s, *s_y = s + kRegW * kRegH;
    float *s_h = s + R::kHOffset;  // [kRegH][kCenW][5], later [kCenH][RW][3]
    float *s_p = s + R::kPOffset;  // [kCenH][kCenW][3]
    float *s_own = s + R::kOwnOffset;  // PARTIALS_OVER_XY: [2][RH][RW]
    const int X0 = X - 2 * kHalf, Y0 = Y - 2 * kHalf;
    const int64_t img = (int64_t)cam * P.H * P.W;
    float ssum = 0.f;
    // unrolled for several pixels per thread, so that dl[k][c] stays in registers (one pixel: as
    // the fused kernel always compiled it)
#pragma unroll(R::kPixels > 1 ? 3 : 1)
    for (int c = 0; c < 3; ++c) {
        for (int i = threadIdx.x; i < kRegW * kRegH; i += kBlock) {
            const int rx = i % kRegW, ry = i / kRegW, gx = X0 + rx, gy = Y0 + ry;
            float xv = 0.f, yv = 0.f;
            if (gx >= 0 && gx < P.W && gy >= 0 && gy < P.H) {
                const int64_t q = 3 * (img + (int64_t)gy * P.W + gx) + c;
                // one-launch: written by other blocks of this launch, so bypass L1
                xv = clamp01(__ldcg(P.rgb + q));
                yv = P.gt[q];
            }
            s_x[i] = xv;
            s_y[i] = yv;
            const int ox = rx - 2 * kHalf, oy = ry - 2 * kHalf;  // region pixel
            if (PARTIALS_OVER_XY && ox >= 0 && ox < RW && oy >= 0 && oy < RH) {
                s_own[oy * RW + ox] = xv;
                s_own[RW * RH + oy * RW + ox] = yv;
            }
        }
        __syncthreads();
        // Horizontal window sums of x, y, x^2, y^2, xy for every row and center column.
        constexpr int SC = R::kStripCen, SP = R::kStripPix;
        for (int i = threadIdx.x; i < kRegH * (kCenW / SC); i += kBlock) {
            const int r = i / (kCenW / SC), j0 = (i % (kCenW / SC)) * SC;
            float m[SC][5];
#pragma unroll
            for (int o = 0; o < SC; ++o)
#pragma unroll
                for (int q = 0; q < 5; ++q) m[o][q] = 0.f;
#pragma unroll
            for (int u = 0; u < SC + kWin - 1; ++u) {
                const float xv = s_x[r * kRegW + j0 + u], yv = s_y[r * kRegW + j0 + u];
#pragma unroll
                for (int o = 0; o < SC; ++o) {
                    if (u - o < 0 || u - o >= kWin) continue;
                    const float w = P.win[u - o];
                    m[o][0] += w * xv;
                    m[o][1] += w * yv;
                    m[o][2] += w * xv * xv;
                    m[o][3] += w * yv * yv;
                    m[o][4] += w * xv * yv;
                }
            }
#pragma unroll
            for (int o = 0; o < SC; ++o) {
                float *h = s_h + 5 * (r * kCenW + j0 + o);
                h[0] = m[o][0]; h[1] = m[o][1]; h[2] = m[o][2]; h[3] = m[o][3]; h[4] = m[o][4];
            }
        }
        __syncthreads();
        // Vertical sums -> SSIM statistics per center; per-center partials of S wrt
        // (mu_x, E[x^2], E[xy]) (mu_x's includes its effect through the variances).
        for (int i = threadIdx.x; i < (kCenH / SC) * kCenW; i += kBlock) {
            const int ci0 = (i / kCenW) * SC, cj = i % kCenW;
            // the strip's centers inside the image's valid SSIM centers (rows ci0 .. ci0 + SC - 1)
            const int sx = X - kHalf + cj, sy0 = Y - kHalf + ci0;
            float part[SC][3];  // dS/d (mu_x, E[x^2], E[xy]); zero outside the valid centers
#pragma unroll
            for (int o = 0; o < SC; ++o) part[o][0] = part[o][1] = part[o][2] = 0.f;
            if (sx >= kHalf && sx < P.W - kHalf && sy0 + SC - 1 >= kHalf && sy0 < P.H - kHalf) {
                float m[SC][5];
                strip_window_sums(s_h + 5 * (ci0 * kCenW + cj), 5 * kCenW, P.win, m);
#pragma unroll
                for (int o = 0; o < SC; ++o) {
                    const int ci = ci0 + o, sy = sy0 + o;
                    if (sy < kHalf || sy >= P.H - kHalf) continue;
                    const float mx = m[o][0], my = m[o][1];
                    const float sxx = m[o][2] - mx * mx, syy = m[o][3] - my * my, sxy = m[o][4] - mx * my;
                    const float n1 = 2.f * mx * my + P.C1, d1 = mx * mx + my * my + P.C1;
                    const float n2 = 2.f * sxy + P.C2, d2 = sxx + syy + P.C2;
                    const float A = n1 / d1, B = n2 / d2, S = A * B;
                    const float dS_dsxy = 2.f * A / d2;
                    const float dS_dsxx = -S / d2;
                    part[o][0] = 2.f * B * (my - A * mx) / d1 - dS_dsxy * my - 2.f * dS_dsxx * mx;
                    part[o][1] = dS_dsxx;
                    part[o][2] = dS_dsxy;
                    if (ci >= kHalf && ci < kHalf + RH && cj >= kHalf && cj < kHalf + RW) ssum += S;
                }
            }
#pragma unroll
            for (int o = 0; o < SC; ++o) {
                float *pp = s_p + 3 * ((ci0 + o) * kCenW + cj);
                pp[0] = part[o][0];
                pp[1] = part[o][1];
                pp[2] = part[o][2];
            }
        }
        __syncthreads();
        // Transposed window, horizontal: per center row and pixel column.
        for (int i = threadIdx.x; i < kCenH * (RW / SP); i += kBlock) {
            const int ci = i / (RW / SP), u0 = (i % (RW / SP)) * SP;
            float a[SP][3];
            strip_window_sums(s_p + 3 * (ci * kCenW + u0), 3, P.win, a);
#pragma unroll
            for (int o = 0; o < SP; ++o) {
                float *hh = s_h + 3 * (ci * RW + u0 + o);
                hh[0] = a[o][0];
                hh[1] = a[o][1];
                hh[2] = a[o][2];
            }
        }
        __syncthreads();
        // Vertical, per pixel (this thread's kPixels rows of one column): dS/dx = A + 2 x B + y C.
        {
            const int2 p0 = R::pixel(0);
            float a[R::kPixels][3];
            strip_window_sums(s_h + 3 * (p0.y * RW + p0.x), 3 * RW, P.win, a);
#pragma unroll
            for (int k = 0; k < R::kPixels; ++k) {
                const int lx = p0.x, ly = p0.y + k;
                float xv, yv;
                if (PARTIALS_OVER_XY) {  // the partials overwrote s_x and s_y
                    xv = s_own[ly * RW + lx];
                    yv = s_own[RW * RH + ly * RW + lx];
                } else {
                    xv = s_x[(ly + 2 * kHalf) * kRegW + lx + 2 * kHalf];
                    yv = s_y[(ly + 2 * kHalf) * kRegW + lx + 2 * kHalf];
                }
                const float dS = a[k][0] + 2.f * xv * a[k][1] + yv * a[k][2];
                const float d = xv - yv;
                const float sgn = d > 0.f ? 1.f : (d < 0.f ? -1.f : 0.f);
                const float g = P.w_l1 * sgn - P.w_ssim * dS;
                dl[k][c] = g;
            }
        }
        __syncthreads();  // s_x/s_y (or s_p over them), s_h and s_own are reused by the next channel
    }
    ssim_sum = block_sum(ssum, s_red);
}

// The fused kernel's 16x16 tile (tx, ty): one pixel per thread, dl its 3 channels.
template <class Prm>
__device__ __forceinline__ void loss_grad_tile(const Prm &P, int cam, int tx, int ty, float *s, float dl[3],
                                               float &ssim_sum, float *s_red) {
    float d[1][3];
    loss_grad_region<kTile, kTile>(P, cam, tx * kTile, ty * kTile, s, d, ssim_sum, s_red);
    dl[0] = d[0][0];
    dl[1] = d[0][1];
    dl[2] = d[0][2];
}

// Host side: splatfacto's loss weights (mean over the C*H*W*3 values for L1, over the valid SSIM
// centers for SSIM), SSIM's constants and window, into a kernel's parameter struct.
template <class Prm>
inline void set_loss_constants(Prm &P, int64_t C, int64_t H, int64_t W, double ssim_lambda, const float *window) {
    const double nvalid = (double)C * 3.0 * (double)(H - 2 * kHalf) * (double)(W - 2 * kHalf);
    P.w_l1 = (float)((1.0 - ssim_lambda) / ((double)C * H * W * 3.0));
    P.w_ssim = (float)(ssim_lambda / nvalid);
    P.C1 = 0.01f * 0.01f;
    P.C2 = 0.03f * 0.03f;
    for (int k = 0; k < kWin; ++k) P.win[k] = window[k];
}

}  // namespace bytesplat
