// The plain render kernels' per-warp culling masks, one byte per tile-list entry, computed once per pass:
// render_fwd.cu and render_bwd.cu read them when they stage a Gaussian (load_gaussians_masked), so the
// forward and the backward share them and their compositing loops keep their registers. Bit w of entry
// i's byte is set when warp w's 8x4 pixel block of the entry's tile can composite the entry's Gaussian
// (warp_mask in common.cuh: the box of its alpha >= 1/255 ellipse, then with `rows` each row of blocks
// against the ellipse's own extent over it). One block per tile, its threads over the tile's entries.
//
// trim_tile_lists drops the entries whose rows mask is empty: the binning's per-axis box reaches tiles
// that no pixel block of the ellipse touches (a needle across the tile grid at an angle), and every render
// pass walks them. Kernel 1 writes the masks and counts each tile's kept entries, a cumsum gives the new
// offsets, kernel 2 compacts each tile's list in order (depth order is kept). No device read: the outputs
// are as long as the input lists, and only their first offsets[-1] entries are lists (as bin_tiles' with
// a known total).
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <vector>

#include "render.cuh"

namespace bytesplat {

namespace {

using namespace plain;

// kept (optional): each tile's entries with a non-empty mask, for trim_tile_lists.
__global__ void __launch_bounds__(kBlock) warp_masks_kernel(
    int tw, int th, const float *__restrict__ means2d, const float *__restrict__ conics,
    const float *__restrict__ opacities, const int32_t *__restrict__ offsets, const int32_t *__restrict__ flatten_ids,
    uint8_t *__restrict__ masks, bool rows, int32_t *__restrict__ kept) {
    const int t = (blockIdx.z * th + blockIdx.y) * tw + blockIdx.x;
    const int x0 = blockIdx.x * kTile, y0 = blockIdx.y * kTile;
    int n_kept = 0;
    // the same trip count in every thread: __syncthreads_count below
    for (int base = offsets[t], end = offsets[t + 1]; base < end; base += kBlock) {
        const int i = base + threadIdx.x;
        uint32_t mask = 0u;
        if (i < end) {
            const int32_t g = flatten_ids[i];
            const float2 xy = reinterpret_cast<const float2 *>(means2d)[g];
            mask = warp_mask<kWarpWidth>(xy.x, xy.y, opacities[g], conics[3 * g], conics[3 * g + 1], conics[3 * g + 2],
                                         x0, y0, rows);
            masks[i] = uint8_t(mask);
        }
        if (kept != nullptr) n_kept += __syncthreads_count(mask != 0u);
    }
    if (kept != nullptr && threadIdx.x == 0) kept[t] = n_kept;
}

// Tile t's entries with a non-empty mask, in order, from new_offsets[t] on (a block-wide compaction per
// chunk of kBlock entries: each warp's ballot, then the warps before it).
__global__ void __launch_bounds__(kBlock) trim_kernel(
    int tw, int th, const int32_t *__restrict__ offsets, const int32_t *__restrict__ flatten_ids,
    const uint8_t *__restrict__ masks, const int32_t *__restrict__ new_offsets, int32_t *__restrict__ out_ids,
    uint8_t *__restrict__ out_masks) {
    __shared__ int warp_kept[kWarps];
    const int t = (blockIdx.z * th + blockIdx.y) * tw + blockIdx.x;
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    int dst = new_offsets[t];
    for (int base = offsets[t], end = offsets[t + 1]; base < end; base += kBlock) {
        const int i = base + threadIdx.x;
        const uint8_t mask = i < end ? masks[i] : uint8_t(0);
        const uint32_t ballot = __ballot_sync(0xffffffffu, mask != 0);
        if (lane == 0) warp_kept[warp] = __popc(ballot);
        __syncthreads();
        int before = 0, chunk = 0;
        for (int w = 0; w < kWarps; ++w) {
            before += w < warp ? warp_kept[w] : 0;
            chunk += warp_kept[w];
        }
        if (mask != 0) {
            const int j = dst + before + __popc(ballot & ((1u << lane) - 1u));
            out_ids[j] = flatten_ids[i];
            out_masks[j] = mask;
        }
        dst += chunk;
        __syncthreads();  // warp_kept is rewritten by the next chunk
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
        offsets.data_ptr<int32_t>(), flatten_ids.data_ptr<int32_t>(), masks.data_ptr<uint8_t>(), rows, nullptr);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return masks;
}

std::vector<at::Tensor> trim_tile_lists(const at::Tensor &means2d, const at::Tensor &conics,
                                        const at::Tensor &opacities, const at::Tensor &offsets,
                                        const at::Tensor &flatten_ids, int64_t C, int64_t W, int64_t H) {
    const at::cuda::CUDAGuard guard(means2d.device());
    const int tw = (W + kTile - 1) / kTile, th = (H + kTile - 1) / kTile;
    check_lists(means2d, conics, opacities, offsets, flatten_ids, C, tw, th);
    const int64_t M = flatten_ids.numel(), ntot = offsets.numel() - 1;
    at::Tensor masks = at::empty({M}, means2d.options().dtype(at::kByte));
    at::Tensor new_offsets = at::zeros({ntot + 1}, offsets.options());
    at::Tensor out_ids = at::empty({M}, flatten_ids.options());
    at::Tensor out_masks = at::empty({M}, masks.options());
    if (M == 0) return {new_offsets, out_ids, out_masks};
    const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
    at::Tensor kept = at::empty({ntot}, offsets.options());
    warp_masks_kernel<<<dim3(tw, th, C), kBlock, 0, stream>>>(
        tw, th, means2d.data_ptr<float>(), conics.data_ptr<float>(), opacities.data_ptr<float>(),
        offsets.data_ptr<int32_t>(), flatten_ids.data_ptr<int32_t>(), masks.data_ptr<uint8_t>(), true,
        kept.data_ptr<int32_t>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    at::Tensor tail = new_offsets.narrow(0, 1, ntot);
    at::cumsum_out(tail, kept, 0);
    trim_kernel<<<dim3(tw, th, C), kBlock, 0, stream>>>(
        tw, th, offsets.data_ptr<int32_t>(), flatten_ids.data_ptr<int32_t>(), masks.data_ptr<uint8_t>(),
        new_offsets.data_ptr<int32_t>(), out_ids.data_ptr<int32_t>(), out_masks.data_ptr<uint8_t>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return {new_offsets, out_ids, out_masks};
}

}  // namespace bytesplat
