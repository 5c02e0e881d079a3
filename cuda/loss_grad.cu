// The middle launch of the split schedule (fused_render_loss(mode="split"), docs/fused_ssim.md):
// render_fwd (cuda/render.cu) has written the whole image (render + T*bg); this kernel computes
// splatfacto's loss gradient dL/d render per pixel and the per-tile loss partial sums; render_bwd
// then turns dL/d render (and bg into the alpha term) into the 2D Gaussian gradients.
//
// One block per 16x16 tile, no waiting on other blocks (the image is complete): the block loads
// clamp(render) and gt over tile +- 10 px and runs loss_grad_tile (cuda/ssim_tile.cuh, the very
// function the fused kernel runs), then multiplies by torch.clamp's mask on the raw render.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "common.cuh"
#include "ssim_tile.cuh"

namespace bytesplat {

namespace {

struct LossParams {
    int W, H, tw, th, clamp_inclusive;
    const float *rgb;  // [C,H,W,3] raw render + T*bg (loss_grad_tile clamps on load)
    const float *gt;   // [C,H,W,3]
    float *v_render, *rgb_out, *partials;
    float w_l1, w_ssim, C1, C2;
    float win[kWin];
};

__global__ void __launch_bounds__(kBlock) loss_grad_kernel(const LossParams P) {
    __shared__ float s_ssim[kSsimFloats];
    __shared__ float s_red[kWarps];
    const int cam = blockIdx.z, tx = blockIdx.x, ty = blockIdx.y;
    const int t = (cam * P.th + ty) * P.tw + tx;  // the fused kernel's tile id (partials' row)
    const int x = tx * kTile + (threadIdx.x % kTile), y = ty * kTile + (threadIdx.x / kTile);
    const bool inside = x < P.W && y < P.H;

    float dl[3];
    float ssim_sum;
    loss_grad_tile(P, cam, tx, ty, s_ssim, dl, ssim_sum, s_red);

    float l1 = 0.f;
    if (inside) {
        const int64_t pix = ((int64_t)cam * P.H + y) * P.W + x;
        const float raw[3] = {P.rgb[3 * pix], P.rgb[3 * pix + 1], P.rgb[3 * pix + 2]};
        const float *g = P.gt + 3 * pix;
        const float c0 = clamp01(raw[0]), c1 = clamp01(raw[1]), c2 = clamp01(raw[2]);
        l1 = fabsf(c0 - g[0]) + fabsf(c1 - g[1]) + fabsf(c2 - g[2]);  // as the fused kernel sums it
        P.rgb_out[3 * pix] = c0;
        P.rgb_out[3 * pix + 1] = c1;
        P.rgb_out[3 * pix + 2] = c2;
        const bool inc = P.clamp_inclusive != 0;
#pragma unroll
        for (int c = 0; c < 3; ++c) P.v_render[3 * pix + c] = dl[c] * clamp_grad_mask(raw[c], inc);
    }
    const float l1_sum = block_sum(l1, s_red);
    if (threadIdx.x == 0) {
        P.partials[2 * t] = l1_sum;
        P.partials[2 * t + 1] = ssim_sum;
    }
}

}  // namespace

// render [C,H,W,3]: render_fwd's output with the backgrounds (render + T*bg, not clamped);
// gt [C,H,W,3]. Returns {v_render [C,H,W,3] = dL/d render (the loss gradient times torch.clamp's
// mask), rgb [C,H,W,3] = clamp(render, 0, 1), partials [C*tiles,2] (L1 sum, SSIM sum per tile, the
// fused kernel's layout)}. The gradient is of the loss itself (grad_output 1).
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
    const int tw = (W + kTile - 1) / kTile, th = (H + kTile - 1) / kTile;
    const int64_t ntot = C * (int64_t)tw * th;
    auto fopt = render.options();
    at::Tensor v_render = at::empty({C, H, W, 3}, fopt);
    at::Tensor rgb = at::empty({C, H, W, 3}, fopt);
    at::Tensor partials = at::zeros({ntot, 2}, fopt);
    if (ntot == 0) return {v_render, rgb, partials};

    LossParams P;
    P.W = (int)W; P.H = (int)H; P.tw = tw; P.th = th;
    P.clamp_inclusive = clamp_inclusive ? 1 : 0;
    P.rgb = render.data_ptr<float>();
    P.gt = gt.data_ptr<float>();
    P.v_render = v_render.data_ptr<float>();
    P.rgb_out = rgb.data_ptr<float>();
    P.partials = partials.data_ptr<float>();
    at::Tensor win = window.to(at::kFloat).contiguous();
    set_loss_constants(P, C, H, W, ssim_lambda, win.data_ptr<float>());  // cuda/ssim_tile.cuh

    auto stream = at::cuda::getCurrentCUDAStream();
    dim3 grid(tw, th, C);
    loss_grad_kernel<<<grid, kBlock, 0, stream>>>(P);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return {v_render, rgb, partials};
}

}  // namespace bytesplat
