// The plain render kernels' per-warp culling masks, one byte per tile-list entry, computed once per pass:
// render_fwd.cu and render_bwd.cu read them when they stage a Gaussian (load_gaussians_masked), so the
// forward and the backward share them and their compositing loops keep their registers. Bit w of entry
// i's byte is set when warp w's 8x4 pixel block of the entry's tile can composite the entry's Gaussian
// (warp_mask in common.cuh: the box of its alpha >= 1/255 ellipse, then with `rows` each row of blocks
// against the ellipse's own extent over it). One block per tile, its threads over the tile's entries.
//
// The binning (cuda/binning.cu) runs the same rows test per tile to leave such entries out of the lists
// (FusedOptions.trim_tile_lists).
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <vector>

#include "render.cuh"

namespace bytesplat {

namespace {

using namespace plain;

__global__ void __launch_bounds__(kBlock) warp_masks_kernel(
    int tw, int th, const float *__restrict__ means2d, const float *__restrict__ conics,
    const float *__restrict__ opacities, const int32_t *__restrict__ offsets, const int32_t *__restrict__ flatten_ids,
    uint8_t *__restrict__ masks, bool rows) {
    const int t = (blockIdx.z * th + blockIdx.y) * tw + blockIdx.x;
    const int x0 = blockIdx.x * kTile, y0 = blockIdx.y * kTile;
    for (int i = offsets[t] + threadIdx.x, end = offsets[t + 1]; i < end; i += kBlock) {
        const int32_t g = flatten_ids[i];
        const float2 xy = reinterpret_cast<const float2 *>(means2d)[g];
        masks[i] = uint8_t(warp_mask<kWarpWidth>(xy.x, xy.y, opacities[g], conics[3 * g], conics[3 * g + 1],
                                                 conics[3 * g + 2], x0, y0, rows));
    }
}

void check_lists(const at::Tensor &means2d, const at::Tensor &conics, const at::Tensor &opacities,
                 const at::Tensor &offsets, const at::Tensor &flatten_ids, int64_t C, int tw, int th) {
    for (const at::Tensor *x : {&means2d, &conics, &opacities}) {
        TORCH_CHECK(x->is_cuda() && x->scalar_type() == at::kFloat && x->is_contiguous(),
                    "bytesplat: 2D Gaussian inputs must be contiguous float32 CUDA tensors");
    }
    TORCH_CHECK(offsets.scalar_type() == at::kInt && flatten_ids.scalar_type() == at::kInt && offsets.is_cuda() &&
                    flatten_ids.is_cuda() && offsets.is_contiguous() && flatten_ids.is_contiguous(),
                "bytesplat: tile offsets and flatten ids must be contiguous int32 CUDA tensors");
    TORCH_CHECK(offsets.numel() == C * tw * th + 1, "bytesplat: offsets must have C*tiles+1 entries");
}

}  // namespace

at::Tensor warp_masks(const at::Tensor &means2d, const at::Tensor &conics, const at::Tensor &opacities,
                      const at::Tensor &offsets, const at::Tensor &flatten_ids, int64_t C, int64_t W, int64_t H,
                      bool rows) {
    const at::cuda::CUDAGuard guard(means2d.device());
    const int tw = (W + kTile - 1) / kTile, th = (H + kTile - 1) / kTile;
    check_lists(means2d, conics, opacities, offsets, flatten_ids, C, tw, th);
    at::Tensor masks = at::empty({flatten_ids.numel()}, means2d.options().dtype(at::kByte));
    if (flatten_ids.numel() == 0) return masks;
    warp_masks_kernel<<<dim3(tw, th, C), kBlock, 0, at::cuda::getCurrentCUDAStream()>>>(
        tw, th, means2d.data_ptr<float>(), conics.data_ptr<float>(), opacities.data_ptr<float>(),
        offsets.data_ptr<int32_t>(), flatten_ids.data_ptr<int32_t>(), masks.data_ptr<uint8_t>(), rows);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return masks;
}

}  // namespace bytesplat
