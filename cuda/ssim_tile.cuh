// The SSIM + L1 loss gradient of one 16x16 tile (shared by the fused kernel, cuda/fused_loss.cu,
// and the split schedule's loss_grad kernel, cuda/loss_grad.cu). See docs/fused_ssim.md.
//
// splatfacto's loss (1-l)*mean|x-y| + l*(1-SSIM(x, y)), x = clamp(render, 0, 1), SSIM as
// pytorch_msssim (11-tap Gaussian window, VALID convolution, C1 = 0.01^2, C2 = 0.03^2). For one
// tile the exact dL/dx needs x and y over tile +- 10 px (26x26 SSIM centers, 36x36 pixels).
#pragma once

#include "common.cuh"

namespace bytesplat {

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

__device__ __forceinline__ float clamp01(float v) { return fminf(fmaxf(v, 0.f), 1.f); }

// torch.clamp(v, 0, 1)'s gradient mask: 1 inside (0, 1); at exactly 0 or 1 it follows the installed
// torch's rule (`inclusive`, detected by the Python caller: strict in recent torch).
__device__ __forceinline__ float clamp_grad_mask(float v, bool inclusive) {
    return (inclusive ? (v >= 0.f && v <= 1.f) : (v > 0.f && v < 1.f)) ? 1.f : 0.f;
}

// dL/d rgb for this thread's pixel (3 channels) of tile (tx, ty) of view `cam`, given that the
// image of every tile within one tile of ours is in P.rgb (the loads clamp it to [0, 1]: the
// fused kernel publishes clamped rgb, where clamping again changes nothing; the split schedule's
// loss_grad kernel passes the raw render + T*bg). Also returns this block's sum of SSIM over the
// centers inside our tile. `s`: kSsimFloats floats of shared memory; `s_red`: kWarps floats.
// Called by the whole block (kBlock threads, one per pixel of the tile).
//
// Prm is the caller's launch parameter struct; it must have: int W, H; const float *rgb, *gt
// ([C,H,W,3]); float w_l1, w_ssim (the loss weights over the element counts), C1, C2;
// float win[kWin] (pytorch_msssim's normalised window).
template <class Prm>
__device__ __forceinline__ void loss_grad_tile(const Prm &P, int cam, int tx, int ty, float *s, float dl[3],
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
                // one-launch: written by other blocks of this launch, so bypass L1
                xv = clamp01(__ldcg(P.rgb + q));
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
