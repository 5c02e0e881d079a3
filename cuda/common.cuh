// Shared device code of bytesplat's rasterization kernels.
//
// Conventions (gsplat 1.4.0 classic, see docs/design.md "Rasterization conventions"): pixel centers at (x+0.5, y+0.5);
// sigma = 0.5*(a dx^2 + c dy^2) + b dx dy with (dx, dy) = mean - pixel and conic (a, b, c);
// alpha = min(0.999, o*exp(-sigma)), skipped when sigma < 0, NaN, or alpha < 1/255; a pixel stops before
// the Gaussian that would take T to 1e-4 or below; background enters as T*bg.
#pragma once

#include <cstdint>
#include <type_traits>
#include <cuda_runtime.h>

namespace bytesplat {

constexpr int kTile = 16;                 // tile side in pixels (the block is one tile)
constexpr int kBlock = kTile * kTile;     // threads per block, one per pixel
constexpr int kWarps = kBlock / 32;
constexpr int kChunk = 32;                // Gaussians per block-level gradient reduction
constexpr int kGradComps = 11;            // xy(2) conic(3) rgb(3) opacity(1) |xy|(2)
constexpr int kGradPad = 16;              // components padded to 16 for the butterfly reduction
// Pruning score (docs/pruning.md): the largest alpha*T a Gaussian gets in the tile rides along the
// gradient reduction as one more component, max-reduced instead of summed.
constexpr int kContribComp = kGradComps;  // its component index (11)
constexpr int kAccComps = kGradComps + 1; // s_acc floats per Gaussian: the gradients + the score
constexpr float kAlphaMin = 1.f / 255.f;
constexpr float kAlphaMax = 0.999f;
constexpr float kTMin = 1e-4f;
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// ---- A Gaussian's falloff exp(-sigma), in one of two forms (FASTEXP) ----
// false: the conic (a, b, c) as given, sigma = 0.5*(a dx^2 + c dy^2) + b dx dy, expf(-sigma).
// true: the conic is staged prescaled, (A, B, C) = -log2(e) * (a/2, b, c/2) (staged_conic), so the
// exponent q = A dx^2 + B dx dy + C dy^2 = -log2(e)*sigma takes 5 instructions instead of 7, and
// exp(-sigma) = 2^q is one hardware ex2.approx instead of expf's range reduction around it: 11 fewer
// instructions per Gaussian and pixel in the forward loop (sm_90; suite sass-loops). The rounding of the
// exponent itself dominates the error either way: |q| <= ~8 wherever alpha >= 1/255, so a few ulps
// of q are a relative error of about 2e-6 in the falloff, as a few ulps of sigma are now.
// Both forms are __host__ __device__: tests/raster/test_falloff_host.py runs them on the CPU.
template <bool FASTEXP>
__host__ __device__ __forceinline__ float3 staged_conic(float a, float b, float c) {
    if (FASTEXP) return make_float3(-0.5f * kLog2e * a, -kLog2e * b, -0.5f * kLog2e * c);
    return make_float3(a, b, c);
}

// The exponent at offset (dx, dy) = mean - pixel centre from the staged conic: sigma, or q.
template <bool FASTEXP>
__host__ __device__ __forceinline__ float falloff_exponent(float A, float B, float C, float dx, float dy) {
    if (FASTEXP) return dx * fmaf(A, dx, B * dy) + C * dy * dy;
    return 0.5f * (A * dx * dx + C * dy * dy) + B * dx * dy;
}

// sigma < 0 (a conic that is not positive definite there): the pixel is skipped, as in gsplat.
template <bool FASTEXP>
__host__ __device__ __forceinline__ bool sigma_nonnegative(float e) { return FASTEXP ? e <= 0.f : e >= 0.f; }

// Whether a pixel takes the Gaussian: sigma >= 0 and alpha = min(kAlphaMax, o*falloff) >= kAlphaMin. A
// NaN exponent (a non-finite conic or mean) fails it, in the forward and the backward alike and as in
// the reference; fminf would otherwise make its alpha kAlphaMax.
template <bool FASTEXP>
__host__ __device__ __forceinline__ bool falloff_kept(float e, float alpha) {
    return sigma_nonnegative<FASTEXP>(e) && alpha >= kAlphaMin;
}

__host__ __device__ __forceinline__ float exp2_approx(float q) {
#ifdef __CUDA_ARCH__
    float r;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(q));
    return r;
#else
    return exp2f(q);
#endif
}

template <bool FASTEXP>
__host__ __device__ __forceinline__ float falloff(float e) { return FASTEXP ? exp2_approx(e) : expf(-e); }

// The exponent's gradient times v_e (= dL/d exponent, or for FASTEXP dL/dq / ln2) into g[0..4]:
// (mean x, mean y, staged A, B, C). falloff_grad_scale turns these into the conic's and means'
// gradients when the block's sums are written out, once per Gaussian and tile instead of per pixel.
template <bool FASTEXP>
__host__ __device__ __forceinline__ void falloff_exponent_grads(float A, float B, float C, float dx, float dy,
                                                                float v_e, float *g) {
    if (FASTEXP) {
        const float Adx = A * dx, Cdy = C * dy;
        g[0] = v_e * (fmaf(B, dy, Adx) + Adx);  // dq/dmean_x = 2A dx + B dy
        g[1] = v_e * (fmaf(B, dx, Cdy) + Cdy);  // dq/dmean_y = B dx + 2C dy
        g[2] = v_e * dx * dx;
        g[3] = v_e * dx * dy;
        g[4] = v_e * dy * dy;
    } else {
        g[2] = 0.5f * v_e * dx * dx;
        g[3] = v_e * dx * dy;
        g[4] = 0.5f * v_e * dy * dy;
        g[0] = v_e * (A * dx + B * dy);
        g[1] = v_e * (B * dx + C * dy);
    }
}

// Factor from backward_slots' gradient component c (kGradComps layout) to the gradient of the
// means and the conic as given: for FASTEXP the chain rule through q = -log2(e)*sigma and the
// staged conic (means and |means|: ln 2; a, b, c: -log2(e)/2 * ln 2, -log2(e) * ln 2, ...).
template <bool FASTEXP>
__host__ __device__ __forceinline__ float falloff_grad_scale(int c) {
    if (!FASTEXP) return 1.f;
    if (c < 2 || c == 9 || c == 10) return kLn2;
    if (c == 2 || c == 4) return -0.5f;
    if (c == 3) return -1.f;
    return 1.f;
}

// One Gaussian as staged in shared memory (structure of arrays, 44 bytes per Gaussian).
// g0 = (x, y, opacity, A), g1 = (B, C, r, g) with (A, B, C) = staged_conic(conic), g2 = b, id = flattened index,
// warps = warp_mask (which of the block's warps can see it).
struct SmemGaussians {
    float4 *g0;
    float4 *g1;
    float *g2;
    int32_t *id;
    uint32_t *warps;
    static constexpr int kBytes = 16 + 16 + 4 + 4 + 4;

    // Carve the arrays for `cap` Gaussians out of `base` (16-byte aligned), return the end.
    __device__ __forceinline__ char *carve(char *base, int cap) {
        g0 = reinterpret_cast<float4 *>(base);
        g1 = g0 + cap;
        g2 = reinterpret_cast<float *>(g1 + cap);
        id = reinterpret_cast<int32_t *>(g2 + cap);
        warps = reinterpret_cast<uint32_t *>(id + cap);
        return reinterpret_cast<char *>(warps + cap);
    }
};

// ---- Warp layout and per-warp culling ----
// A block's 8 warps each hold a WW x (32/WW) block of its 16x16 tile's pixels, row-major over the
// tile: WW = 16 gives warp w rows 2w and 2w+1 (thread i: column i % 16, row i / 16); WW = 8 gives
// 8x4 blocks, two per block row. Compact blocks see fewer small Gaussians per warp (the synthetic
// 1080p scene: 2.37 instead of 2.90 warps per Gaussian and tile); the fused one-launch kernel keeps
// WW = 16, which its SSIM code's pixel mapping shares.
template <int WW>
__device__ __forceinline__ int2 thread_pixel(int tx, int ty) {
    static_assert(WW == 8 || WW == 16, "warp blocks of 16x2 or 8x4 pixels");
    constexpr int kCols = kTile / WW;  // warp blocks per block row
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    return make_int2(tx * kTile + (w % kCols) * WW + lane % WW, ty * kTile + (w / kCols) * (32 / WW) + lane / WW);
}

// The tile a plain-rasterizer block (grid tw x th x C) renders, as (tx, ty, cam): its own blockIdx, or
// with a tile order the order's entry for its linear index, packed as tx | ty << 11 | cam << 22
// (raster/tiles.py tile_order; shifts, not divisions, in every block's prologue). The hardware starts
// blocks in linear order, so an order with the longest tile lists first keeps the long tiles out of
// the last wave (FusedOptions.tile_order; the same image and gradients).
constexpr int kTileOrderBits = 11;
__device__ __forceinline__ int3 block_tile(const int32_t *__restrict__ tile_order, int tw, int th) {
    if (tile_order == nullptr) return make_int3(blockIdx.x, blockIdx.y, blockIdx.z);
    const int v = tile_order[(blockIdx.z * th + blockIdx.y) * tw + blockIdx.x];
    constexpr int mask = (1 << kTileOrderBits) - 1;
    return make_int3(v & mask, (v >> kTileOrderBits) & mask, v >> (2 * kTileOrderBits));
}

// A Gaussian is composited only where o*exp(-sigma) >= kAlphaMin, i.e. sigma <= t = ln(o/kAlphaMin):
// an ellipse with half-extents sqrt(2 t c / det) along x and sqrt(2 t a / det) along y (conic
// [a b; b c], det = ac - b^2). Bit w of the mask is set when a pixel centre of warp w's block can
// lie in that ellipse's bounding box; a warp whose bit is clear would skip the Gaussian at every
// one of its pixels, so it does not evaluate it at all. Small Gaussians touch few of the 8 warps,
// which is where the forward and backward spend their time at millions of Gaussians. The box is
// widened (t by 1% + 0.02, radii by 0.01 px) far beyond float rounding of sigma and the box, so a
// culled pair is one the pixel test would skip; conics that are nearly degenerate (det < 1e-3 ac,
// where sigma's rounding grows) or not finite, and non-finite means, keep every warp.
// With ROWS the box is only the first test: each row of warp blocks then keeps the blocks that the
// ellipse's x-extent over that row's band of pixel centres reaches, so a long thin Gaussian lying
// across the tile at an angle keeps the blocks it crosses, not every block of its box. The extent
// over a band [v0, v1] (v = y - my) is exact: the ellipse's right edge x(v) = (-b v + sqrt(2at - det
// v^2)) / a is concave, so its maximum over the band is at the band's point nearest the ellipse's
// rightmost point v* = -b sqrt(2t / (c det)); the left edge mirrors it (-v*). Same widening.
constexpr uint32_t kAllWarps = (1u << kWarps) - 1u;

// Blocks of `size` pixels starting at `origin` (n of them): the first and last whose pixel centres
// origin + j*size + 0.5 .. origin + j*size + size - 0.5 meet [lo, hi]; false if none.
__device__ __forceinline__ bool block_span(float lo, float hi, int origin, int size, int n, int &first, int &last) {
    const float inv = 1.f / size;  // a power of two: exact
    const float f = fmaxf(-1.f, fminf(float(n), ceilf((lo - origin - (size - 0.5f)) * inv)));
    const float l = fmaxf(-1.f, fminf(float(n), floorf((hi - origin - 0.5f) * inv)));
    first = max(0, int(f));
    last = min(n - 1, int(l));
    return first <= last;
}

// Bits c0..c1 of a block row.
__device__ __forceinline__ uint32_t span_bits(int c0, int c1) { return ((2u << c1) - 1u) & ~((1u << c0) - 1u); }

// warp_mask's rows test over block rows r0..r1 (t: the widened threshold, ry: the widened y half-extent).
// Only cuda/warp_masks.cu runs it: in a render kernel its registers lengthen the compositing loops.
template <int WW>
__device__ __forceinline__ uint32_t row_spans(float mx, float my, float a, float b, float c, float det, float t, float ry,
                                           int x0, int y0, int r0, int r1) {
    constexpr int kCols = kTile / WW, WH = 32 / WW;
    const float two_at = 2.f * a * t, inv_a = 1.f / a;
    const float v_right = -b * sqrtf(2.f * t / (c * det));  // v of the ellipse's rightmost point
    uint32_t mask = 0u;
    for (int r = r0; r <= r1; ++r) {
        const float band = float(y0 + r * WH) - my;  // the row's first pixel edge, relative to the mean
        const float v0 = fmaxf(band + 0.49f, -ry), v1 = fminf(band + (WH - 0.49f), ry);
        const float vr = fminf(fmaxf(v_right, v0), v1), vl = fminf(fmaxf(-v_right, v0), v1);
        const float xr = mx + (sqrtf(fmaxf(two_at - det * vr * vr, 0.f)) - b * vr) * inv_a + 0.01f;
        const float xl = mx - (sqrtf(fmaxf(two_at - det * vl * vl, 0.f)) + b * vl) * inv_a - 0.01f;
        int k0, k1;
        if (v0 <= v1 && block_span(xl, xr, x0, WW, kCols, k0, k1)) mask |= span_bits(k0, k1) << (r * kCols);
    }
    return mask;
}

template <int WW>
__device__ __forceinline__ uint32_t warp_mask(float mx, float my, float o, float a, float b, float c,
                                              int x0, int y0, bool rows) {
    constexpr int kCols = kTile / WW, kRows = kWarps / kCols, WH = 32 / WW;
    if (o < kAlphaMin) return 0u;  // sigma >= 0 for a positive definite conic: alpha <= o
    const float det = a * c - b * b;
    if (!(a > 0.f && c > 0.f && det > 1e-3f * a * c && o <= 1e30f && fabsf(mx) <= 1e30f &&
          fabsf(my) <= 1e30f))
        return kAllWarps;
    const float t = 1.01f * logf(o / kAlphaMin) + 0.02f;
    const float rx = sqrtf(2.f * t * c / det) + 0.01f, ry = sqrtf(2.f * t * a / det) + 0.01f;
    if (!(rx < 1e30f && ry < 1e30f)) return kAllWarps;
    int c0, c1, r0, r1;
    if (!block_span(mx - rx, mx + rx, x0, WW, kCols, c0, c1) || !block_span(my - ry, my + ry, y0, WH, kRows, r0, r1))
        return 0u;
    if (rows) return row_spans<WW>(mx, my, a, b, c, det, t, ry, x0, y0, r0, r1);
    uint32_t mask = 0u;
    for (int r = r0; r <= r1; ++r) mask |= span_bits(c0, c1) << (r * kCols);
    return mask;
}

// Load list entries [first, first+count) of the tile whose top-left pixel is (x0, y0)
// (flatten_ids are indices into the [C*N] 2D arrays) into shared slots [0, count), with the mask
// of the warps (layout WW, thread_pixel) that can see each: the box test, computed here (the plain
// forward, the fused kernel). Called by the whole block (NT threads); caller syncs afterwards. cull =
// false keeps every warp for every Gaussian (A/B runs and the tests that hold culling against its
// absence: --pipeline.model.fused.warp-cull False).
// Stage Gaussian g (an index into the [C*N] 2D arrays) into shared slot i: all the compositing loops read
// but the warp mask. Returns its mean and opacity (x, y, o) for the caller's mask.
template <bool FASTEXP>
__device__ __forceinline__ float3 stage_gaussian(SmemGaussians s, int i, int32_t g, const float *__restrict__ means2d,
                                                 const float *__restrict__ conics, const float *__restrict__ colors,
                                                 const float *__restrict__ opacities, float3 &conic) {
    const float2 xy = reinterpret_cast<const float2 *>(means2d)[g];
    conic = make_float3(conics[3 * g], conics[3 * g + 1], conics[3 * g + 2]);
    const float r = colors[3 * g], gg = colors[3 * g + 1], b = colors[3 * g + 2];
    const float3 k = staged_conic<FASTEXP>(conic.x, conic.y, conic.z);
    const float o = opacities[g];
    s.g0[i] = make_float4(xy.x, xy.y, o, k.x);
    s.g1[i] = make_float4(k.y, k.z, r, gg);
    s.g2[i] = b;
    s.id[i] = g;
    return make_float3(xy.x, xy.y, o);
}

template <int WW, bool FASTEXP, int NT = kBlock>
__device__ __forceinline__ void load_gaussians(
    SmemGaussians s, const int32_t *__restrict__ flatten_ids, int64_t first, int count,
    const float *__restrict__ means2d, const float *__restrict__ conics,
    const float *__restrict__ colors, const float *__restrict__ opacities, int x0, int y0, bool cull) {
    for (int i = threadIdx.x; i < count; i += NT) {
        float3 q;
        const float3 p = stage_gaussian<FASTEXP>(s, i, flatten_ids[first + i], means2d, conics, colors, opacities, q);
        s.warps[i] = cull ? warp_mask<WW>(p.x, p.y, p.z, q.x, q.y, q.z, x0, y0, false) : kAllWarps;
    }
}

// The plain backward's load (the 8x4 layout): with `masks` (one byte per list entry, cuda/warp_masks.cu:
// the rows test) each entry's mask is read, otherwise the box is tested as load_gaussians does. Computed
// there once per pass, the rows test costs the backward's loop nothing; computed inline it raises the
// render kernels' register allocation (suite sass-loops). The plain forward keeps the box test: reading
// the masks instead, the compiler rebuilds the shared-memory base in its compositing loop (4 more
// instructions per composited Gaussian).
template <bool FASTEXP, int NT = kBlock>
__device__ __forceinline__ void load_gaussians_masked(
    SmemGaussians s, const int32_t *__restrict__ flatten_ids, int64_t first, int count,
    const float *__restrict__ means2d, const float *__restrict__ conics, const float *__restrict__ colors,
    const float *__restrict__ opacities, int x0, int y0, bool cull, const uint8_t *__restrict__ masks) {
    for (int i = threadIdx.x; i < count; i += NT) {
        float3 q;
        const float3 p = stage_gaussian<FASTEXP>(s, i, flatten_ids[first + i], means2d, conics, colors, opacities, q);
        s.warps[i] = masks != nullptr ? uint32_t(masks[first + i])
                     : cull           ? warp_mask<8>(p.x, p.y, p.z, q.x, q.y, q.z, x0, y0, false)
                                      : kAllWarps;
    }
}

// Which slots a warp walks: AllSlots tests every slot's warp mask in the loop (a skipped slot costs its
// load, test and branch: 9 instructions); WarpSlots walks a list of the warp's own slots built once per
// batch (warp_slot_list), so a slot the warp cannot see costs it nothing in the loop.
struct AllSlots {
    const uint32_t *warps;
    uint32_t bits;
    __device__ __forceinline__ bool get(int j, int &k) const {
        k = j;
        return warps[j] & bits;
    }
};
struct WarpSlots {
    const uint8_t *list;
    __device__ __forceinline__ bool get(int j, int &k) const {
        k = list[j];
        return true;
    }
};

// The shared slots in [lo, hi) whose warp mask has a bit of `bits`, in ascending order, into this warp's
// `list` (one byte per slot: hi <= 256); returns how many. Called by all 32 lanes of the warp.
__device__ __forceinline__ int warp_slot_list(const uint32_t *warps, int lo, int hi, uint32_t bits, uint8_t *list) {
    const int lane = threadIdx.x & 31;
    int n = 0;
    for (int first = lo; first < hi; first += 32) {
        const int k = first + lane;
        const bool seen = k < hi && (warps[k] & bits);
        const uint32_t ballot = __ballot_sync(0xffffffffu, seen);
        if (seen) list[n + __popc(ballot & ((1u << lane) - 1u))] = uint8_t(k);
        n += __popc(ballot);
    }
    __syncwarp();
    return n;
}

// Composite shared slots into one pixel's state, front to back: slots.get(j) for j in [0, count) (AllSlots:
// slot j, WarpSlots: the warp's j-th listed slot; list index base + slot); a pixel stops before the
// Gaussian that would take T to kTMin or below (that one is NOT composited, as in gsplat). `stop` gets
// its list index (untouched if none): the pruning score counts it (docs/pruning.md); callers that do
// not need it leave it dead. One loop with the steps written out: a step function returning skipped /
// composited / saturated cost the forward's loop 7 instructions of state passing (suite sass-loops).
template <bool FASTEXP, class Slots>
__device__ __forceinline__ void composite_slots(
    const SmemGaussians &s, const Slots &slots, int count, int base, float px, float py, float &T, float3 &acc,
    int &last, int &stop, bool &done) {
    if (done) return;
    for (int j = 0; j < count; ++j) {
        int k;
        if (!slots.get(j, k)) continue;  // skipped at every pixel of this warp
        const float4 a = s.g0[k];
        const float dx = a.x - px, dy = a.y - py;
        const float4 b = s.g1[k];
        const float e = falloff_exponent<FASTEXP>(a.w, b.x, b.y, dx, dy);
        const float alpha = fminf(kAlphaMax, a.z * falloff<FASTEXP>(e));
        if (!falloff_kept<FASTEXP>(e, alpha)) continue;
        const float nextT = T * (1.f - alpha);
        if (nextT <= kTMin) {
            done = true;
            stop = base + k;
            return;
        }
        const float w = alpha * T;
        acc.x += b.z * w;
        acc.y += b.w * w;
        acc.z += s.g2[k] * w;
        T = nextT;
        last = base + k + 1;
    }
}

// 1/x for x in [1 - kAlphaMax, 1] (the backward's 1/(1 - alpha)): the hardware approximation plus one
// Newton step, within an ulp or so of the rounded quotient in 3 instructions, where IEEE division
// takes a longer sequence and a branch to its slow path. The backward recovers T with it once per
// composited Gaussian and pixel: raster + loss at 4M Gaussians 7.24 -> 6.58 ms on an H200
// (commit 8757b9f, docs/benchmarks.md, "The backward's reciprocal and the loss kernel's region"); the GPU tests
// hold its gradients against the reference's float division.
__device__ __forceinline__ float rcp_unit(float x) {
    float r;
    asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
    return r * fmaf(-x, r, 2.f);
}

// Per-pixel state of the back-to-front walk.
struct PixelBwd {
    float px, py;
    float T;        // transmittance in front of the Gaussian being visited (recovered by division)
    float T_final;  // transmittance after the last composited Gaussian
    float3 buf;     // color composited behind the Gaussian being visited
    float3 v_rgb;   // dL/d(render color, before background)
    float v_aT;     // T_final * (dL/d(render alpha) - dot(bg, v_rgb)): T_final times the gradient wrt
                    // T_final, negated (one product per pixel instead of one per Gaussian and pixel)
    int last;       // number of list entries up to and including the last composited one
    int stop;       // list index of the Gaussian that saturated the pixel (>= last), -1: none
};

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ int warp_max_int(int v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = max(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Where a warp's back-to-front walk starts: the largest list index any of its pixels needs (last,
// and with the pruning score stop + 1). The backward skips the Gaussians behind it in the warp's
// loop bounds: its pixels would each skip them, but only after the loads, the test and the vote.
template <bool CONTRIB>
__device__ __forceinline__ int warp_walk_end(const PixelBwd &p) {
    return warp_max_int(CONTRIB ? max(p.last, p.stop + 1) : p.last);
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Max of non-negative floats through their bits: they order like their int32 patterns, so an
// integer atomicMax works in shared and global memory (the target must start at +0.f).
__device__ __forceinline__ void atomic_max_nonneg(float *addr, float v) {
    atomicMax(reinterpret_cast<int *>(addr), __float_as_int(v));
}

// ---- Per-Gaussian warp reduction, butterfly ("reduce-scatter / transpose") variant ----
//
// Every lane holds v[0..15] (component c of its pixel's gradient, zero for c >= K). Instead of
// K independent 5-shuffle warp_sums (55 shuffles for K = 11), each of the 4 steps s = 0..3 halves
// the number of values a lane holds: with offset 1 << s and b = bit s of the lane, the lane keeps
// the half whose component has bit s equal to b, sends the other half to its partner (lane ^ (1<<s)),
// and adds what it receives (the partner's copy of the half it keeps).
//
// Invariant (checked by tests/raster/test_butterfly_reduce.py, which mirrors this code line by line):
// after step s (values a[j], j < 16 >> (s+1)), a[j] holds component
//     c = j * 2^(s+1) + (lane & (2^(s+1) - 1))
// summed over the 2^(s+1) lanes that agree with this lane in every bit above s.
// After the 4 steps each lane holds ONE value, component c = lane & 15, summed over the 16 lanes
// that share bit 4; a last shuffle with offset 16 completes the warp total. Result: the warp total
// of component c sits in lanes c and c + 16 (c < 16), so lanes 0..K-1 each do one atomicAdd.
// Values whose component range starts at or above K are zero in every lane (compile-time known
// after unrolling) and are neither shuffled nor added: K = 11 costs 6+3+2+1+1 = 13 shuffles,
// K = 9 costs 5+3+2+1+1 = 12 (instead of 55 / 45).
// All indices are compile-time constants after unrolling (selects, not dynamic indexing), so the
// arrays stay in registers.
// KMAX (-1: none) is a component combined with max instead of + (the pruning score): a lane
// picks the operation from the component it keeps, so it costs a select, not a shuffle.
template <int N, int S, int K, int KMAX>
__device__ __forceinline__ void butterfly_step(const float (&in)[N], float (&out)[N / 2], int lane) {
    const bool bit = (lane >> S) & 1;
#pragma unroll
    for (int j = 0; j < N / 2; ++j) {
        if ((j << (S + 1)) >= K) {  // every component this value could hold is >= K: zero
            out[j] = 0.f;
            continue;
        }
        const float lo = in[2 * j], hi = in[2 * j + 1];  // components with bit S = 0 / = 1
        const float keep = bit ? hi : lo;
        const float send = bit ? lo : hi;
        const float recv = __shfl_xor_sync(0xffffffffu, send, 1 << S);
        const int low = KMAX - (j << (S + 1));  // KMAX's low bits if out[j] can hold it
        const bool is_max = low >= 0 && low < (2 << S) && (lane & ((2 << S) - 1)) == low;
        out[j] = is_max ? fmaxf(keep, recv) : keep + recv;
    }
}

// Warp total of component (lane & 15) of v (v[c] must be 0 in every lane for c >= K); the warp
// max for component KMAX (-1: none).
template <int K, int KMAX = -1>
__device__ __forceinline__ float warp_reduce_scatter16(const float (&v)[kGradPad], int lane) {
    static_assert(K >= 1 && K <= kGradPad, "butterfly reduction handles up to 16 components");
    static_assert(KMAX < K, "the max-reduced component must be one of the K reduced");
    float a8[8], a4[4], a2[2], a1[1];
    butterfly_step<16, 0, K, KMAX>(v, a8, lane);
    butterfly_step<8, 1, K, KMAX>(a8, a4, lane);
    butterfly_step<4, 2, K, KMAX>(a4, a2, lane);
    butterfly_step<2, 3, K, KMAX>(a2, a1, lane);
    const float recv = __shfl_xor_sync(0xffffffffu, a1[0], 16);
    return (lane & 15) == KMAX ? fmaxf(a1[0], recv) : a1[0] + recv;
}

// One pixel's step of the back-to-front walk over shared slot k (list index idx). kPixelComposited: the
// Gaussian was composited at the pixel; its gradients there are in g[0..10] (and the score in
// g[kContribComp] with CONTRIB) and the pixel's state has moved past it. kPixelStopped (CONTRIB): it
// stopped the pixel; the score only. kPixelSkipped: nothing. g[0..10] is written on every path (zero
// where the pixel adds nothing), so the warp reduction needs no select of the pixels that add.
enum PixelStep { kPixelSkipped = 0, kPixelComposited = 1, kPixelStopped = 2 };
template <bool CONTRIB, bool FASTEXP>
__device__ __forceinline__ int pixel_grads(const SmemGaussians &s, int k, int idx, PixelBwd &p, float (&g)[kGradPad]) {
#pragma unroll
    for (int c = 0; c < kGradComps; ++c) g[c] = 0.f;
    if (!(idx < p.last || (CONTRIB && idx == p.stop))) return kPixelSkipped;
    const float4 a = s.g0[k];
    const float4 b = s.g1[k];
    const float cb = s.g2[k];
    const float dx = a.x - p.px, dy = a.y - p.py;
    const float e = falloff_exponent<FASTEXP>(a.w, b.x, b.y, dx, dy);
    const float vis = falloff<FASTEXP>(e);
    const float alpha = fminf(kAlphaMax, a.z * vis);
    if (!falloff_kept<FASTEXP>(e, alpha)) return kPixelSkipped;
    if (CONTRIB && idx >= p.last) {
        g[kContribComp] = alpha * p.T_final;  // nothing behind it was composited: T in front is T_final
        return kPixelStopped;
    }
    const float ra = rcp_unit(1.f - alpha);
    p.T *= ra;
    const float fac = alpha * p.T;
    if (CONTRIB) g[kContribComp] = fac;
    g[5] = fac * p.v_rgb.x;
    g[6] = fac * p.v_rgb.y;
    g[7] = fac * p.v_rgb.z;
    float v_alpha = (b.z * p.T - p.buf.x * ra) * p.v_rgb.x +
                    (b.w * p.T - p.buf.y * ra) * p.v_rgb.y +
                    (cb * p.T - p.buf.z * ra) * p.v_rgb.z;
    v_alpha += ra * p.v_aT;
    if (a.z * vis <= kAlphaMax) {
        // dL/dsigma = -o*vis*dL/dalpha; dL/dq = o*vis*dL/dalpha*ln2 (ln2 at the write-out)
        const float v_e = FASTEXP ? a.z * vis * v_alpha : -a.z * vis * v_alpha;
        falloff_exponent_grads<FASTEXP>(a.w, b.x, b.y, dx, dy, v_e, g);
        g[8] = vis * v_alpha;
    }  // else alpha is clamped: no gradient to the opacity, the means or the conic
    g[9] = fabsf(g[0]);
    g[10] = fabsf(g[1]);
    p.buf.x += b.z * fac;
    p.buf.y += b.w * fac;
    p.buf.z += cb * fac;
    return kPixelComposited;
}

// One global write per Gaussian and component of shared slots [chunk_lo, chunk_hi) from the block's
// sums in s_acc (zeroed again here), by NT threads.
template <bool ABS, bool CONTRIB, bool FASTEXP, int NT>
__device__ __forceinline__ void write_chunk_grads(
    const SmemGaussians &s, int chunk_lo, int chunk_hi, float *s_acc, float *__restrict__ v_means2d,
    float *__restrict__ v_conics, float *__restrict__ v_colors, float *__restrict__ v_opacities,
    float *__restrict__ v_means2d_abs, float *__restrict__ contrib) {
    constexpr int kStride = CONTRIB ? kAccComps : kGradComps;
    const int n = (chunk_hi - chunk_lo) * kStride;
    for (int i = threadIdx.x; i < n; i += NT) {
        float v = s_acc[i];
        if (v != 0.f) {
            const int slot = chunk_lo + i / kStride, c = i % kStride;
            v *= falloff_grad_scale<FASTEXP>(c);
            const int64_t gid = s.id[slot];
            if (c < 2) atomicAdd(v_means2d + 2 * gid + c, v);
            else if (c < 5) atomicAdd(v_conics + 3 * gid + (c - 2), v);
            else if (c < 8) atomicAdd(v_colors + 3 * gid + (c - 5), v);
            else if (c == 8) atomicAdd(v_opacities + gid, v);
            else if (c < kGradComps) { if (ABS) atomicAdd(v_means2d_abs + 2 * gid + (c - 9), v); }
            else if (CONTRIB) atomic_max_nonneg(contrib + gid, v);
            s_acc[i] = 0.f;
        }
    }
}

// Back-to-front over the shared slots [lo, hi) (slot + base = index in the tile list), in chunks of
// CHUNK Gaussians: per-pixel gradients are summed over the warp by shuffles, over the block in
// shared memory (s_acc, CHUNK*kAccComps floats, zero on entry and on exit), and written to global
// memory once per Gaussian per tile. The warps meet at two barriers per chunk, so a larger chunk
// lets a warp with little to do (culled, or its pixels done) run ahead of a busy one for longer;
// the fused kernel keeps kChunk (its shared memory is the tile capacity), the plain backward uses
// its whole batch. All threads of the block must call this with the same lo/hi.
// BUTTERFLY selects the warp reduction: true = warp_reduce_scatter16 (13/12 shuffles per Gaussian,
// lanes 0..K-1 each add one component to s_acc), false = the original one warp_sum per component
// (55/45 shuffles, lane 0 adds all K). Both give the same sums up to fp32 reassociation.
// CONTRIB also gathers the pruning score into contrib[gid] (zero on entry): the largest alpha*T
// the Gaussian gets at a pixel of the tile, counting the Gaussian that stopped a pixel (p.stop)
// with alpha*T_final, the weight it would have had. It is component kContribComp of the same
// reduction, max-reduced (warp, then a shared and a global integer atomicMax on the bits), so the
// butterfly needs no extra shuffle with absgrad (K 11 -> 12 is still 13); the caller walks up to
// max(last, stop + 1) instead of last.
// LISTS: each warp walks its list of the chunk's slots it can see (warp_slot_list into `list`, CHUNK bytes
// of its own; at most 256 slots) instead of testing every slot's mask in the loop; the same slots in the
// same order, so the same sums.
template <int CHUNK, bool ABS, bool BUTTERFLY, bool CONTRIB, bool FASTEXP, bool LISTS = false>
__device__ __forceinline__ void backward_slots(
    const SmemGaussians &s, int lo, int hi, int base, int warp_end, PixelBwd &p, float *s_acc,
    float *__restrict__ v_means2d, float *__restrict__ v_conics, float *__restrict__ v_colors,
    float *__restrict__ v_opacities, float *__restrict__ v_means2d_abs, float *__restrict__ contrib,
    uint8_t *list = nullptr) {
    constexpr int K = CONTRIB ? kContribComp + 1 : (ABS ? kGradComps : 9);  // components actually reduced
    constexpr int KMAX = CONTRIB ? kContribComp : -1;
    constexpr int kStride = CONTRIB ? kAccComps : kGradComps;  // s_acc floats per Gaussian
    const int lane = threadIdx.x & 31;
    const uint32_t wbit = 1u << (threadIdx.x >> 5);
    for (int chunk_hi = hi; chunk_hi > lo; chunk_hi -= CHUNK) {
        const int chunk_lo = max(lo, chunk_hi - CHUNK);
        const int k_end = min(chunk_hi, warp_end - base);
        // j over the warp's listed slots, or over every slot of the chunk with its mask tested
        const int j_lo = LISTS ? 0 : chunk_lo;
        const int j_hi = LISTS ? warp_slot_list(s.warps, chunk_lo, k_end, wbit, list) : k_end;
        for (int j = j_hi - 1; j >= j_lo; --j) {
            int k;
            // warp-uniform: no lane would be valid or stopped
            if (LISTS ? !WarpSlots{list}.get(j, k) : !AllSlots{s.warps, wbit}.get(j, k)) continue;
            float g[kGradPad];
#pragma unroll
            for (int c = kGradComps; c < kGradPad; ++c) g[c] = 0.f;  // butterfly padding (and the score)
            // a lane that composited here (or, with CONTRIB, stopped its pixel here) adds to the sums;
            // the others hold zeros
            const int r = pixel_grads<CONTRIB, FASTEXP>(s, k, base + k, p, g);
            if (!__any_sync(0xffffffffu, r != kPixelSkipped)) continue;
            float *dst = s_acc + (k - chunk_lo) * kStride;
            if (BUTTERFLY) {
                if (!ABS) g[9] = g[10] = 0.f;  // components >= K must be zero in every lane
                const float total = warp_reduce_scatter16<K, KMAX>(g, lane);
                if (CONTRIB && lane == kContribComp) atomic_max_nonneg(dst + lane, total);
                else if (lane < K && (ABS || lane < 9)) atomicAdd(dst + lane, total);
            } else {
#pragma unroll
                for (int c = 0; c < K; ++c) {
                    if (!ABS && (c == 9 || c == 10)) continue;
                    g[c] = c == KMAX ? warp_max(g[c]) : warp_sum(g[c]);
                }
                if (lane == 0) {
#pragma unroll
                    for (int c = 0; c < K; ++c) {
                        if (c == KMAX) atomic_max_nonneg(dst + c, g[c]);
                        else if (ABS || c < 9) atomicAdd(dst + c, g[c]);
                    }
                }
            }
        }
        __syncthreads();
        write_chunk_grads<ABS, CONTRIB, FASTEXP, kBlock>(s, chunk_lo, chunk_hi, s_acc, v_means2d, v_conics, v_colors,
                                                         v_opacities, v_means2d_abs, contrib);
        __syncthreads();
    }
}

// backward_slots with two pixels per thread (NT = 128 threads per 16x16 tile): pixel j of a thread
// lies in the 8x4 block whose warp_mask bit is bits[j], and a warp holds two vertically adjacent
// blocks. Each Gaussian's per-pixel work is skipped per block (a warp-uniform test of its bit), but
// its warp reduction and shared add serve 64 pixels instead of 32: that per-Gaussian part is about
// half of backward_slots' loop (suite sass-loops). The butterfly reduction; no pruning score.
template <int CHUNK, bool ABS, bool FASTEXP, int NT>
__device__ __forceinline__ void backward_slots_2px(
    const SmemGaussians &s, int lo, int hi, int base, int warp_end, PixelBwd (&p)[2], const uint32_t (&bits)[2],
    float *s_acc,
    float *__restrict__ v_means2d, float *__restrict__ v_conics, float *__restrict__ v_colors,
    float *__restrict__ v_opacities, float *__restrict__ v_means2d_abs) {
    constexpr int K = ABS ? kGradComps : 9;  // components actually reduced
    const int lane = threadIdx.x & 31;
    for (int chunk_hi = hi; chunk_hi > lo; chunk_hi -= CHUNK) {
        const int chunk_lo = max(lo, chunk_hi - CHUNK);
        for (int k = min(chunk_hi, warp_end - base) - 1; k >= chunk_lo; --k) {
            const uint32_t seen = s.warps[k];
            if (!(seen & (bits[0] | bits[1]))) continue;  // warp-uniform
            float g[kGradPad];
#pragma unroll
            for (int c = 0; c < kGradPad; ++c) g[c] = 0.f;  // what a pixel that adds nothing adds
            bool valid = false;
            if (seen & bits[0]) valid = pixel_grads<false, FASTEXP>(s, k, base + k, p[0], g) == kPixelComposited;
            if (seen & bits[1]) {
                float h[kGradPad];
                if (pixel_grads<false, FASTEXP>(s, k, base + k, p[1], h) == kPixelComposited) {
                    valid = true;
#pragma unroll
                    for (int c = 0; c < kGradComps; ++c) g[c] += h[c];
                }
            }
            if (!__any_sync(0xffffffffu, valid)) continue;
            if (!ABS) g[9] = g[10] = 0.f;  // components >= K must be zero in every lane
            const float total = warp_reduce_scatter16<K>(g, lane);
            if (lane < K) atomicAdd(s_acc + (k - chunk_lo) * kGradComps + lane, total);
        }
        __syncthreads();
        write_chunk_grads<ABS, false, FASTEXP, NT>(s, chunk_lo, chunk_hi, s_acc, v_means2d, v_conics, v_colors,
                                                   v_opacities, v_means2d_abs, nullptr);
        __syncthreads();
    }
}

// Host: f(std::bool_constant<flags>...) for the runtime flags, so that each combination of
// features selects its own kernel instance (a feature that is off costs nothing in the others).
template <class F>
inline void dispatch_bools(F &&f) { f(); }
template <class F, class... Rest>
inline void dispatch_bools(F &&f, bool first, Rest... rest) {
    if (first) dispatch_bools([&](auto... v) { f(std::true_type{}, v...); }, rest...);
    else dispatch_bools([&](auto... v) { f(std::false_type{}, v...); }, rest...);
}

// Block-wide max / sum helpers (s_scratch: at least one float/int per warp; all NT threads call).
template <int NT = kBlock>
__device__ __forceinline__ int block_max_int(int v, int *s_scratch) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = max(v, __shfl_xor_sync(0xffffffffu, v, o));
    __syncthreads();
    if ((threadIdx.x & 31) == 0) s_scratch[threadIdx.x >> 5] = v;
    __syncthreads();
    int r = s_scratch[0];
#pragma unroll
    for (int w = 1; w < NT / 32; ++w) r = max(r, s_scratch[w]);
    __syncthreads();
    return r;
}

__device__ __forceinline__ float block_sum(float v, float *s_scratch) {
    v = warp_sum(v);
    __syncthreads();
    if ((threadIdx.x & 31) == 0) s_scratch[threadIdx.x >> 5] = v;
    __syncthreads();
    float r = 0.f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) r += s_scratch[w];
    __syncthreads();
    return r;
}

}  // namespace bytesplat
