// The plain tile rasterizer's layout, shared by its forward (render_fwd.cu) and backward (render_bwd.cu):
// one block of kBlock threads per 16x16 tile, Gaussians staged in shared memory in batches, and the
// launchers' input checks.
#pragma once

#include <ATen/ATen.h>

#include "common.cuh"

namespace bytesplat {
namespace plain {

// Warps hold 8x4-pixel blocks (common.cuh, thread_pixel): fewer warps per small Gaussian than rows.
constexpr int kWarpWidth = 8;
// One batch of kBlock Gaussians staged in shared memory at a time; the backward reduces a whole
// batch between two barriers (backward_slots' CHUNK = kBatch).
constexpr int kBatch = kBlock;
constexpr int kSmemGauss = kBatch * SmemGaussians::kBytes;
// Each warp's list of the batch's slots it can see (common.cuh warp_slot_list): one byte per slot.
constexpr int kSmemWarpLists = kWarps * kBatch;
static_assert(kBatch <= 256, "a warp's slot list holds slots in one byte");

inline void check_inputs(const at::Tensor &means2d, const at::Tensor &conics, const at::Tensor &colors,
                         const at::Tensor &opacities, const at::Tensor &offsets, const at::Tensor &flatten_ids,
                         const c10::optional<at::Tensor> &warp_masks = c10::nullopt) {
    for (const at::Tensor *t : {&means2d, &conics, &colors, &opacities}) {
        TORCH_CHECK(t->is_cuda() && t->scalar_type() == at::kFloat && t->is_contiguous(),
                    "bytesplat: 2D Gaussian inputs must be contiguous float32 CUDA tensors");
    }
    TORCH_CHECK(offsets.scalar_type() == at::kInt && flatten_ids.scalar_type() == at::kInt,
                "bytesplat: tile offsets and flatten ids must be int32");
    TORCH_CHECK(colors.size(-1) == 3, "bytesplat: the fused rasterizer renders 3 channels");
    TORCH_CHECK(!warp_masks.has_value() ||
                    (warp_masks->is_cuda() && warp_masks->scalar_type() == at::kByte && warp_masks->is_contiguous() &&
                     warp_masks->numel() == flatten_ids.numel()),
                "bytesplat: warp masks must be a contiguous uint8 CUDA tensor, one byte per tile-list entry");
}

// A tile order holds the C*tiles tiles packed as block_tile reads them (int32, on the device; not checked
// to be a permutation), for grids whose tile coordinates fit its fields.
inline void check_tile_order(const c10::optional<at::Tensor> &tile_order, const at::Tensor &offsets, int64_t C,
                             int tw, int th) {
    if (!tile_order.has_value()) return;
    TORCH_CHECK(tile_order->is_cuda() && tile_order->scalar_type() == at::kInt && tile_order->is_contiguous() &&
                    tile_order->numel() == offsets.numel() - 1,
                "bytesplat: a tile order must be a contiguous int32 CUDA tensor of C*tiles entries");
    TORCH_CHECK(tw <= (1 << kTileOrderBits) && th <= (1 << kTileOrderBits) && C <= (1 << (31 - 2 * kTileOrderBits)),
                "bytesplat: a tile order holds at most 2048x2048 tiles and 512 views");
}

}  // namespace plain
}  // namespace bytesplat
