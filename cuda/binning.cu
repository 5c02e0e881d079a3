// Tile binning: per-tile Gaussian lists for the rasterizers (the CUDA twin of the torch
// `bin_tiles_torch` in bytesplat_ns/raster/_torch_impl.py, same result bit for bit).
//
// A Gaussian with radius > 0 covers tiles x in [floor(tx - r), ceil(tx + r)) clamped to [0, tw]
// (same for y) with tx = mean.x / tile_size, r = radius / tile_size in float32. Radii are [C,N]
// (the same along x and y) or [C,N,2] (x, y: the opacity-aware reach, raster/tile_reach.py).
// Entries with a radius <= 0 on either axis are culled (their means may be uninitialised). Each
// tile's list is sorted by the depth's float32 bits, ties in flattened (camera * N + gaussian) order.
//
// 1. count intersections per flattened Gaussian; 2. inclusive cumsum (int64) gives each its slot
// range; 3. write (tile << 32 | depth bits, gid) pairs in gid order; 4. stable radix sort of the
// pairs over the bits actually used; 5. tile offsets from the sorted keys.
//
// Step 2's total is read back to size the pairs: the one device read of binning. A caller that
// already knows the total (the sharded step gathers every sender's `tile_intersections` with its
// record counts) or that gives room for at least that many pairs (the training step's pair
// capacity, bytesplat_ns/pair_capacity.py) passes it and the read is skipped. Nothing is written out
// of bounds: pairs past the true total keep a sentinel key that sorts behind every tile, and a total
// above the room given drops the pairs past it (the lists are then incomplete: the caller compares
// the true total, returned on the device, with the room it gave).
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cub/device/device_radix_sort.cuh>

#include <climits>
#include <vector>

namespace bytesplat {

namespace {

constexpr int kBinThreads = 256;

// Tile bound like torch's `floor/ceil(v).clamp(0, lim).long()` on CUDA: NaN stays NaN through
// clamp and converts to 0, so a non-finite mean yields an empty box (nothing, as in torch).
__device__ __forceinline__ int64_t clamp_tile(float v, int64_t lim) {
    if (isnan(v)) return 0;
    v = fminf(fmaxf(v, 0.f), (float)lim);
    return (int64_t)v;
}

struct Box {
    int64_t x0, x1, y0, y1;
    __device__ __forceinline__ int64_t count() const {
        return max(x1 - x0, (int64_t)0) * max(y1 - y0, (int64_t)0);
    }
};

// torch divides a float tensor by a Python number as a * (1 / b) on CUDA; the _rn intrinsics
// keep nvcc from contracting the multiply and the +-r into an FMA (a different rounding).
__device__ __forceinline__ Box tile_box(float mx, float my, int32_t radius_x, int32_t radius_y,
                                        float inv_ts, int64_t tw, int64_t th) {
    const float tx = __fmul_rn(mx, inv_ts), ty = __fmul_rn(my, inv_ts);
    const float rx = __fmul_rn((float)radius_x, inv_ts), ry = __fmul_rn((float)radius_y, inv_ts);
    Box b;
    b.x0 = clamp_tile(floorf(__fsub_rn(tx, rx)), tw);
    b.x1 = clamp_tile(ceilf(__fadd_rn(tx, rx)), tw);
    b.y0 = clamp_tile(floorf(__fsub_rn(ty, ry)), th);
    b.y1 = clamp_tile(ceilf(__fadd_rn(ty, ry)), th);
    return b;
}

// Gaussian i's radii along x and y: `axes` (1 or 2) int32 per Gaussian.
__device__ __forceinline__ int2 radii_of(const int32_t *__restrict__ radii, int64_t i, int axes) {
    return make_int2(radii[i * axes], radii[i * axes + axes - 1]);
}

__global__ void count_kernel(int64_t CN, const float2 *__restrict__ means2d,
                             const int32_t *__restrict__ radii, int axes, float inv_ts, int64_t tw,
                             int64_t th, int64_t *__restrict__ counts) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= CN) return;
    const int2 rad = radii_of(radii, i, axes);
    if (rad.x <= 0 || rad.y <= 0) {  // culled: means2d[i] may be garbage, never read it
        counts[i] = 0;
        return;
    }
    const float2 m = means2d[i];
    counts[i] = tile_box(m.x, m.y, rad.x, rad.y, inv_ts, tw, th).count();
}

// One thread per flattened Gaussian; its slots [cum[i] - count, cum[i]) follow gid order, which
// is the tie order the stable sort then preserves.
__global__ void emit_kernel(int64_t CN, int64_t N, const float2 *__restrict__ means2d,
                            const int32_t *__restrict__ radii, int axes,
                            const float *__restrict__ depths,
                            float inv_ts, int64_t tw, int64_t th,
                            const int64_t *__restrict__ cum, int64_t M,
                            uint64_t *__restrict__ keys, int32_t *__restrict__ vals) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= CN) return;
    const int2 rad = radii_of(radii, i, axes);
    if (rad.x <= 0 || rad.y <= 0) return;
    const float2 m = means2d[i];
    const Box b = tile_box(m.x, m.y, rad.x, rad.y, inv_ts, tw, th);
    const int64_t n = b.count();
    if (n == 0) return;
    int64_t slot = cum[i] - n;
    const uint64_t depth_bits = (uint64_t)__float_as_uint(depths[i]);
    const int64_t cam_base = (i / N) * tw * th;
    for (int64_t y = b.y0; y < b.y1; ++y) {
        for (int64_t x = b.x0; x < b.x1 && slot < M; ++x) {
            const uint64_t tile = (uint64_t)(cam_base + y * tw + x);
            keys[slot] = (tile << 32) | depth_bits;
            vals[slot] = (int32_t)i;
            ++slot;
        }
    }
}

// offsets[t] = first slot of tile t = number of entries with tile < t. Entry i writes it for the
// tiles in (tile[i-1], tile[i]] (from 0 for the first entry); the last entry also fills the tiles
// after its own with M. Every t in [0, ntot] is written exactly once.
__global__ void offsets_kernel(int64_t M, int64_t ntot, const uint64_t *__restrict__ keys,
                               int32_t *__restrict__ offsets) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= M) return;
    // min: a sentinel (tile ntot) ends every list
    const int64_t tile = min((int64_t)(keys[i] >> 32), ntot);
    const int64_t prev = i == 0 ? -1 : min((int64_t)(keys[i - 1] >> 32), ntot);
    for (int64_t t = prev + 1; t <= tile; ++t) offsets[t] = (int32_t)i;
    if (i == M - 1)
        for (int64_t t = tile + 1; t <= ntot; ++t) offsets[t] = (int32_t)M;
}

inline unsigned int blocks_for(int64_t n) {
    return (unsigned int)((n + kBinThreads - 1) / kBinThreads);
}

void check_inputs(const at::Tensor &means2d, const at::Tensor &radii, int64_t width, int64_t height,
                  int64_t tile_size) {
    TORCH_CHECK(means2d.is_cuda() && radii.is_cuda(), "bytesplat: binning needs CUDA tensors");
    TORCH_CHECK(means2d.dim() == 3 && means2d.size(2) == 2, "bytesplat: means2d must be [C,N,2]");
    TORCH_CHECK((radii.dim() == 2 || (radii.dim() == 3 && radii.size(2) == 2)) &&
                    radii.size(0) == means2d.size(0) && radii.size(1) == means2d.size(1),
                "bytesplat: radii must be [C,N] or [C,N,2] like means2d");
    TORCH_CHECK(means2d.scalar_type() == at::kFloat, "bytesplat: means2d must be float32");
    TORCH_CHECK(radii.scalar_type() == at::kInt, "bytesplat: radii must be int32");
    TORCH_CHECK(means2d.is_contiguous() && radii.is_contiguous(),
                "bytesplat: binning inputs must be contiguous");
    TORCH_CHECK(width > 0 && height > 0 && tile_size > 0,
                "bytesplat: width, height and tile_size must be positive");
}

// Same reciprocal as torch's division by a Python scalar (exact for power-of-two tiles).
inline float inv_tile(int64_t tile_size) { return (float)(1.0 / (double)tile_size); }

// 1: [C,N] radii (the same along x and y); 2: [C,N,2] (x, y).
inline int radius_axes(const at::Tensor &radii) { return radii.dim() == 3 ? 2 : 1; }

// counts [C*N] int64: the tiles each flattened Gaussian reaches.
at::Tensor tile_counts(const at::Tensor &means2d, const at::Tensor &radii, int64_t width,
                       int64_t height, int64_t tile_size, cudaStream_t stream) {
    const int64_t CN = radii.size(0) * radii.size(1);
    const int64_t tw = (width + tile_size - 1) / tile_size, th = (height + tile_size - 1) / tile_size;
    at::Tensor counts = at::empty({CN}, radii.options().dtype(at::kLong));
    if (CN == 0) return counts;
    count_kernel<<<blocks_for(CN), kBinThreads, 0, stream>>>(
        CN, reinterpret_cast<const float2 *>(means2d.data_ptr<float>()), radii.data_ptr<int32_t>(),
        radius_axes(radii), inv_tile(tile_size), tw, th, counts.data_ptr<int64_t>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return counts;
}

}  // namespace

at::Tensor tile_intersections(const at::Tensor &means2d, const at::Tensor &radii, int64_t width,
                              int64_t height, int64_t tile_size) {
    check_inputs(means2d, radii, width, height, tile_size);
    const at::cuda::CUDAGuard guard(means2d.device());
    const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
    return tile_counts(means2d, radii, width, height, tile_size, stream)
        .view({radii.size(0), radii.size(1)})
        .sum(1);
}

std::vector<at::Tensor> bin_tiles(const at::Tensor &means2d, const at::Tensor &radii,
                                  const at::Tensor &depths, int64_t width, int64_t height,
                                  int64_t tile_size, int64_t known_total) {
    check_inputs(means2d, radii, width, height, tile_size);
    TORCH_CHECK(depths.is_cuda() && depths.dim() == 2 && depths.size(0) == radii.size(0) &&
                    depths.size(1) == radii.size(1),
                "bytesplat: depths must be [C,N] like radii, on the GPU");
    TORCH_CHECK(depths.scalar_type() == at::kFloat && depths.is_contiguous(),
                "bytesplat: depths must be contiguous float32");
    const at::cuda::CUDAGuard guard(means2d.device());
    const cudaStream_t stream = at::cuda::getCurrentCUDAStream();

    const int64_t C = radii.size(0), N = radii.size(1), CN = C * N;
    const int64_t tw = (width + tile_size - 1) / tile_size, th = (height + tile_size - 1) / tile_size;
    const int64_t ntot = C * tw * th;
    // flatten_ids are int32 gids and the tile id must fit the key's upper 32 bits.
    TORCH_CHECK(CN <= INT_MAX, "bytesplat: C*N = ", CN, " Gaussians exceed int32 flatten_ids");
    TORCH_CHECK(ntot < (int64_t(1) << 31), "bytesplat: ", ntot, " tiles exceed the 32-bit tile key");
    const auto i32 = radii.options().dtype(at::kInt);
    at::Tensor offsets = at::zeros({ntot + 1}, i32);
    if (CN == 0) return {offsets, at::empty({0}, i32), at::zeros({1}, radii.options().dtype(at::kLong))};

    const auto *m2 = reinterpret_cast<const float2 *>(means2d.data_ptr<float>());
    at::Tensor cum = at::cumsum(tile_counts(means2d, radii, width, height, tile_size, stream), 0);
    at::Tensor total = cum.narrow(0, CN - 1, 1);  // the true number of pairs, on the device
    const bool known = known_total >= 0;
    // one sync, as the torch twin, unless the caller knows the total
    const int64_t M = known ? known_total : total.item<int64_t>();
    if (M == 0) return {offsets, at::empty({0}, i32), total};
    // offsets are int32 and cub takes an int item count.
    TORCH_CHECK(M <= INT_MAX, "bytesplat: ", M, " tile intersections exceed int32 offsets");

    at::Tensor keys = at::empty({M}, radii.options().dtype(at::kLong));
    at::Tensor vals = at::empty({M}, i32);
    // the sentinel: tile ntot, after every real tile (see the top of the file); its vals are
    // never read, as no tile's list reaches it
    if (known) keys.fill_((int64_t)((uint64_t)ntot << 32 | 0xFFFFFFFFull));
    auto *keys_p = reinterpret_cast<uint64_t *>(keys.data_ptr<int64_t>());
    emit_kernel<<<blocks_for(CN), kBinThreads, 0, stream>>>(
        CN, N, m2, radii.data_ptr<int32_t>(), radius_axes(radii), depths.data_ptr<float>(),
        inv_tile(tile_size), tw, th,
        cum.data_ptr<int64_t>(), M, keys_p, vals.data_ptr<int32_t>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();

    // Keys are non-negative, so sorting them as uint64 over [0, 32 + tile bits) orders them as
    // torch's int64 sort does; LSD radix sort is stable (ties keep gid order). A sentinel needs
    // tile ntot itself to fit.
    int tile_bits = 0;
    while ((int64_t(1) << tile_bits) < ntot + (known ? 1 : 0)) ++tile_bits;
    const int end_bit = 32 + tile_bits;
    at::Tensor keys_out = at::empty_like(keys);
    at::Tensor flatten_ids = at::empty_like(vals);
    auto *keys_out_p = reinterpret_cast<uint64_t *>(keys_out.data_ptr<int64_t>());
    size_t temp_bytes = 0;
    C10_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(
        nullptr, temp_bytes, keys_p, keys_out_p, vals.data_ptr<int32_t>(),
        flatten_ids.data_ptr<int32_t>(), (int)M, 0, end_bit, stream));
    at::Tensor temp = at::empty({(int64_t)temp_bytes}, radii.options().dtype(at::kByte));
    C10_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(
        temp.data_ptr(), temp_bytes, keys_p, keys_out_p, vals.data_ptr<int32_t>(),
        flatten_ids.data_ptr<int32_t>(), (int)M, 0, end_bit, stream));

    offsets_kernel<<<blocks_for(M), kBinThreads, 0, stream>>>(M, ntot, keys_out_p,
                                                              offsets.data_ptr<int32_t>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return {offsets, flatten_ids, total};
}

}  // namespace bytesplat
