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
// for 256 pixels, 32x32: 42x42 for 1024).
template <int RW, int RH>
struct SsimRegion {
    static constexpr int kRegW = RW + 4 * kHalf, kRegH = RH + 4 * kHalf;  // pixels needed (region +- 10)
    static constexpr int kCenW = RW + 2 * kHalf, kCenH = RH + 2 * kHalf;  // SSIM centers (region +- 5)
    static constexpr int kXY = 2 * kRegW * kRegH;
    static constexpr int kH = kRegH * kCenW * 5 > kCenH * RW * 3 ? kRegH * kCenW * 5 : kCenH * RW * 3;
    static constexpr int kP = kCenW * kCenH * 3;
    static constexpr int kFloats = kXY + kH + kP;
    static constexpr int kPixels = RW * RH / kBlock;  // pixels per thread
    static_assert(RW * RH % kBlock == 0, "a region is a whole number of pixels per thread");
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

// dL/d rgb (3 channels) for this thread's pixels of the RW x RH region whose top-left pixel is
// (X, Y) in view `cam`: pixel k (k < kPixels) is region pixel threadIdx.x + k * kBlock, row-major
// (RW = 16: one pixel, thread i at column i % 16, row i / 16). The image of every pixel within 10 of
// the region must be in P.rgb (the loads clamp it to [0, 1]: the fused kernel publishes clamped rgb,
// where clamping again changes nothing; the split schedule's loss_grad kernel passes the raw
// render + T*bg). Also returns the block's sum of SSIM over the centers inside the region. `s`:
// SsimRegion<RW, RH>::kFloats floats of shared memory; `s_red`: kWarps floats. Called by the whole
// block (kBlock threads).
//
// Prm is the caller's launch parameter struct; it must have: int W, H; const float *rgb, *gt
// ([C,H,W,3]); float w_l1, w_ssim (the loss weights over the element counts), C1, C2;
// float win[kWin] (pytorch_msssim's normalised window).
template <int RW, int RH, class Prm>
__device__ __forceinline__ void loss_grad_region(const Prm &P, int cam, int X, int Y, float *s,
                                                 float dl[][3], float &ssim_sum, float *s_red) {
    using R = SsimRegion<RW, RH>;
    constexpr int kRegW = R::kRegW, kRegH = R::kRegH, kCenW = R::kCenW, kCenH = R::kCenH;
    float *s_x = s, *s_y = s + kRegW * kRegH;
    float *s_h = s + R::kXY;           // [kRegH][kCenW][5], later [kCenH][RW][3]
    float *s_p = s + R::kXY + R::kH;   // [kCenH][kCenW][3]
    const int X0 = X - 2 * kHalf, Y0 = Y - 2 * kHalf;
    const int64_t img = (int64_t)cam * P.H * P.W;
    float ssum = 0.f;
    // unrolled for several pixels per thread, so that dl[k][c] stays in registers (one pixel: as
    // the fused kernel always compiled it)
#pragma unroll(R::kPixels > 1 ? 3 : 1)
    for (int c = 0; c < 3; ++c) {
        for (int i = threadIdx.x; i < kRegW * kRegH; i += kBlock) {
            const int gx = X0 + i % kRegW, gy = Y0 + i / kRegW;
            float xv = 0.f, yv = 0.f;
            if (gx >= 0 && gx < P.W && gy >= 0 && gy < P.H) {
                const int64_t q = 3 * (img + (int64_t)gy * P.W + gx) + c;
                // one-launch: written by other blocks of this launch, so bypass L1
                xv = clamp01(__ldcg(P.rgb + q));
                yv = P.gt[q];
            }
            s_x[i] = xv;
            s_y[i] = yv;
        }
        __syncthreads();
        // Horizontal window sums of x, y, x^2, y^2, xy for every row and center column.
        for (int i = threadIdx.x; i < kRegH * kCenW; i += kBlock) {
            const int r = i / kCenW, j = i % kCenW;
            float m0 = 0.f, m1 = 0.f, m2 = 0.f, m3 = 0.f, m4 = 0.f;
#pragma unroll
            for (int k = 0; k < kWin; ++k) {
                const float w = P.win[k];
                const float xv = s_x[r * kRegW + j + k], yv = s_y[r * kRegW + j + k];
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
        for (int i = threadIdx.x; i < kCenW * kCenH; i += kBlock) {
            const int ci = i / kCenW, cj = i % kCenW;
            const int sy = Y - kHalf + ci, sx = X - kHalf + cj;
            float pa = 0.f, pb = 0.f, pc = 0.f;
            if (sy >= kHalf && sy < P.H - kHalf && sx >= kHalf && sx < P.W - kHalf) {
                float m[5] = {0.f, 0.f, 0.f, 0.f, 0.f};
#pragma unroll
                for (int k = 0; k < kWin; ++k) {
                    const float w = P.win[k];
                    const float *h = s_h + 5 * ((ci + k) * kCenW + cj);
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
                if (ci >= kHalf && ci < kHalf + RH && cj >= kHalf && cj < kHalf + RW) ssum += S;
            }
            s_p[3 * i] = pa;
            s_p[3 * i + 1] = pb;
            s_p[3 * i + 2] = pc;
        }
        __syncthreads();
        // Transposed window, horizontal: per center row and pixel column.
        for (int i = threadIdx.x; i < kCenH * RW; i += kBlock) {
            const int ci = i / RW, u = i % RW;
            float a0 = 0.f, a1 = 0.f, a2 = 0.f;
#pragma unroll
            for (int k = 0; k < kWin; ++k) {
                const float w = P.win[k];
                const float *pp = s_p + 3 * (ci * kCenW + u + k);
                a0 += w * pp[0];
                a1 += w * pp[1];
                a2 += w * pp[2];
            }
            s_h[3 * i] = a0;
            s_h[3 * i + 1] = a1;
            s_h[3 * i + 2] = a2;
        }
        __syncthreads();
        // Vertical, per pixel: dS/dx = A + 2 x B + y C.
#pragma unroll
        for (int k = 0; k < R::kPixels; ++k) {
            const int i = threadIdx.x + k * kBlock, lx = i % RW, ly = i / RW;
            float a0 = 0.f, a1 = 0.f, a2 = 0.f;
#pragma unroll
            for (int t = 0; t < kWin; ++t) {
                const float w = P.win[t];
                const float *hh = s_h + 3 * ((ly + t) * RW + lx);
                a0 += w * hh[0];
                a1 += w * hh[1];
                a2 += w * hh[2];
            }
            const float xv = s_x[(ly + 2 * kHalf) * kRegW + lx + 2 * kHalf];
            const float yv = s_y[(ly + 2 * kHalf) * kRegW + lx + 2 * kHalf];
            const float dS = a0 + 2.f * xv * a1 + yv * a2;
            const float d = xv - yv;
            const float sgn = d > 0.f ? 1.f : (d < 0.f ? -1.f : 0.f);
            dl[k][c] = P.w_l1 * sgn - P.w_ssim * dS;
        }
        __syncthreads();  // s_x/s_y/s_h are reused by the next channel
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
