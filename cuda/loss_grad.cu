// The middle launch of the split schedule (fused_render_loss(mode="split"), docs/fused_ssim.md):
// render_fwd (cuda/render_fwd.cu) has written the whole image (render + T*bg); this kernel computes
// splatfacto's loss gradient dL/d render per pixel and the per-region loss partial sums; render_bwd
// then turns dL/d render (and bg into the alpha term) into the 2D Gaussian gradients.
//
// One block per 32x32-pixel region, no waiting on other blocks (the image is complete): the block
// loads clamp(render) and gt over region +- 10 px and runs loss_grad_region (cuda/ssim_tile.cuh, the
// code the fused kernel runs on its 16x16 tile), then multiplies by torch.clamp's mask on the raw
// render. A 32x32 region computes 42x42 SSIM centers for 1024 pixels where a 16x16 tile computes
// 26x26 for 256: 42% fewer instructions at 1080p (Nsight Compute; commit 8757b9f, docs/benchmarks.md, "The
// backward's reciprocal and the loss kernel's region").
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "common.cuh"
#include "ssim_tile.cuh"

namespace bytesplat {

namespace {

struct LossParams {
    int W, H, clamp_inclusive;
    const float *rgb;  // [C,H,W,3] raw render + T*bg (loss_grad_region clamps on load)
    const float *gt;   // [C,H,W,3]
    float *v_render, *rgb_out, *partials;
    float w_l1, w_ssim, C1, C2;
    float win[kWin];
};

constexpr int kRegionW = 32, kRegionH = 32;
// the partials over x and y (ssim_tile.cuh): 71.8 KB, three blocks per SM
using Region = SsimRegion<kRegionW, kRegionH, true>;
constexpr int kSmemBytes = Region::kFloats * 4;  // above 48 KB: opted into at launch
// three blocks per SM on sm_90 (228 KB of shared memory per SM, 1 KB of it reserved per block)
static_assert(3 * (kSmemBytes + kWarps * 4 + 1024) <= 228 * 1024, "three loss_grad blocks per SM");

// Three blocks per SM (the region's shared memory allows three): up to 80 registers, which the passes'
// strips of 7 outputs need (at the default bound ptxas kept 64 and spilled).
__global__ void __launch_bounds__(kBlock, 3) loss_grad_kernel(const LossParams P) {
    extern __shared__ float s_ssim[];
    __shared__ float s_red[kWarps];
    const int cam = blockIdx.z;
    const int X = blockIdx.x * kRegionW, Y = blockIdx.y * kRegionH;

    float dl[Region::kPixels][3];
    float ssim_sum;
    loss_grad_region<kRegionW, kRegionH, true>(P, cam, X, Y, s_ssim, dl, ssim_sum, s_red);

    float l1 = 0.f;
    const bool inc = P.clamp_inclusive != 0;
#pragma unroll
    for (int k = 0; k < Region::kPixels; ++k) {
        const int2 px = Region::pixel(k);
        const int x = X + px.x, y = Y + px.y;
        if (x >= P.W || y >= P.H) continue;
        const int64_t pix = ((int64_t)cam * P.H + y) * P.W + x;
        const float raw[3] = {P.rgb[3 * pix], P.rgb[3 * pix + 1], P.rgb[3 * pix + 2]};
        const float *g = P.gt + 3 * pix;
        const float c0 = clamp01(raw[0]), c1 = clamp01(raw[1]), c2 = clamp01(raw[2]);
        l1 += fabsf(c0 - g[0]) + fabsf(c1 - g[1]) + fabsf(c2 - g[2]);
        P.rgb_out[3 * pix] = c0;
        P.rgb_out[3 * pix + 1] = c1;
        P.rgb_out[3 * pix + 2] = c2;
#pragma unroll
        for (int c = 0; c < 3; ++c) P.v_render[3 * pix + c] = dl[k][c] * clamp_grad_mask(raw[c], inc);
    }
    const float l1_sum = block_sum(l1, s_red);
    if (threadIdx.x == 0) {
        const int r = (cam * gridDim.y + blockIdx.y) * gridDim.x + blockIdx.x;
        P.partials[2 * r] = l1_sum;
        P.partials[2 * r + 1] = ssim_sum;
    }
}

}  // namespace

// render [C,H,W,3]: render_fwd's output with the backgrounds (render + T*bg, not clamped);
// gt [C,H,W,3]. Returns {v_render [C,H,W,3] = dL/d render (the loss gradient times torch.clamp's
// mask), rgb [C,H,W,3] = clamp(render, 0, 1), partials [C*regions,2] (L1 sum, SSIM sum per 32x32
// region; the caller sums them)}. The gradient is of the loss itself (grad_output 1).
std::vector<at::Tensor> loss_grad(const at::Tensor &render, const at::Tensor &gt, double ssim_lambda,
                                  const at::Tensor &window, bool clamp_inclusive) {
    for (const at::Tensor *t : {&render, &gt}) {
        TORCH_CHECK(t->is_cuda() && t->scalar_type() == at::kFloat && t->is_contiguous() && t->dim() == 4 &&
                        t->size(3) == 3,
                    "bytesplat: loss_grad inputs must be contiguous float32 CUDA tensors [C,H,W,3]");
    }
    TORCH_CHECK(render.sizes() == gt.sizes(), "bytesplat: loss_grad: render and gt shapes differ");
    const int64_t C = render.size(0), H = render.size(1), W = render.size(2);
    TORCH_CHECK(W >= kWin && H >= kWin, "bytesplat: SSIM needs images of at least 11x11 pixels");
    TORCH_CHECK(window.numel() == kWin && window.device().is_cpu(), "bytesplat: window must be 11 CPU floats");
    const at::cuda::CUDAGuard guard(render.device());
    const int rw = (W + kRegionW - 1) / kRegionW, rh = (H + kRegionH - 1) / kRegionH;
    const int64_t ntot = C * (int64_t)rw * rh;
    auto fopt = render.options();
    at::Tensor v_render = at::empty({C, H, W, 3}, fopt);
    at::Tensor rgb = at::empty({C, H, W, 3}, fopt);
    at::Tensor partials = at::zeros({ntot, 2}, fopt);
    if (ntot == 0) return {v_render, rgb, partials};

    LossParams P;
    P.W = (int)W; P.H = (int)H;
    P.clamp_inclusive = clamp_inclusive ? 1 : 0;
    P.rgb = render.data_ptr<float>();
    P.gt = gt.data_ptr<float>();
    P.v_render = v_render.data_ptr<float>();
    P.rgb_out = rgb.data_ptr<float>();
    P.partials = partials.data_ptr<float>();
    at::Tensor win = window.to(at::kFloat).contiguous();
    set_loss_constants(P, C, H, W, ssim_lambda, win.data_ptr<float>());  // cuda/ssim_tile.cuh

    auto stream = at::cuda::getCurrentCUDAStream();
    C10_CUDA_CHECK(cudaFuncSetAttribute(loss_grad_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes));
    dim3 grid(rw, rh, C);
    loss_grad_kernel<<<grid, kBlock, kSmemBytes, stream>>>(P);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return {v_render, rgb, partials};
}

}  // namespace bytesplat
