// Python bindings of bytesplat's CUDA kernels (built by bytesplat_ns/raster/_build.py).
#include <torch/extension.h>

#include <vector>

namespace bytesplat {
std::vector<at::Tensor> render_fwd(const at::Tensor &means2d, const at::Tensor &conics,
                                   const at::Tensor &colors, const at::Tensor &opacities,
                                   const c10::optional<at::Tensor> &backgrounds,
                                   const at::Tensor &offsets, const at::Tensor &flatten_ids,
                                   int64_t C, int64_t W, int64_t H, bool with_stop, bool warp_cull,
                                   bool fast_exp, const c10::optional<at::Tensor> &tile_order);
std::vector<at::Tensor> render_bwd(const at::Tensor &means2d, const at::Tensor &conics,
                                   const at::Tensor &colors, const at::Tensor &opacities,
                                   const c10::optional<at::Tensor> &backgrounds,
                                   const at::Tensor &offsets, const at::Tensor &flatten_ids,
                                   int64_t C, int64_t W, int64_t H, const at::Tensor &T_final,
                                   const at::Tensor &last, const at::Tensor &v_render,
                                   const c10::optional<at::Tensor> &v_alpha, bool absgrad,
                                   bool butterfly, bool contribution,
                                   const c10::optional<at::Tensor> &stop, bool warp_cull,
                                   const c10::optional<at::Tensor> &warp_masks,
                                   bool fast_exp, int64_t pixels_per_thread,
                                   const c10::optional<at::Tensor> &tile_order,
                                   const c10::optional<at::Tensor> &v_scale);
int64_t fused_capacity(int64_t blocks_per_sm);
std::vector<int64_t> fused_smem_layout();
std::vector<at::Tensor> fused_loss(const at::Tensor &means2d, const at::Tensor &conics,
                                   const at::Tensor &colors, const at::Tensor &opacities,
                                   const at::Tensor &backgrounds, const at::Tensor &gt,
                                   const at::Tensor &offsets, const at::Tensor &flatten_ids,
                                   int64_t C, int64_t W, int64_t H, double ssim_lambda,
                                   const at::Tensor &window, int64_t cap_override,
                                   int64_t blocks_per_sm, bool absgrad, bool force_two_phase,
                                   bool clamp_inclusive, bool butterfly, bool contribution,
                                   bool warp_cull, bool fast_exp);
std::vector<at::Tensor> loss_grad(const at::Tensor &render, const at::Tensor &gt, double ssim_lambda,
                                  const at::Tensor &window, bool clamp_inclusive);
std::vector<at::Tensor> bin_tiles(const at::Tensor &means2d, const at::Tensor &radii,
                                  const at::Tensor &depths, int64_t width, int64_t height,
                                  int64_t tile_size, int64_t known_total);
at::Tensor tile_intersections(const at::Tensor &means2d, const at::Tensor &radii, int64_t width,
                              int64_t height, int64_t tile_size);
at::Tensor warp_masks(const at::Tensor &means2d, const at::Tensor &conics, const at::Tensor &opacities,
                      const at::Tensor &offsets, const at::Tensor &flatten_ids, int64_t C, int64_t W, int64_t H,
                      bool rows);
std::vector<at::Tensor> trim_tile_lists(const at::Tensor &means2d, const at::Tensor &conics,
                                        const at::Tensor &opacities, const at::Tensor &offsets,
                                        const at::Tensor &flatten_ids, int64_t C, int64_t W, int64_t H);
at::Tensor opacity_aware_radii(const at::Tensor &radii, const at::Tensor &conics,
                               const at::Tensor &opacities);
at::Tensor sh_views_fwd(const at::Tensor &means, const at::Tensor &dc, const at::Tensor &rest,
                        const at::Tensor &viewmats, const at::Tensor &radii, int64_t degree);
at::Tensor sh_views_bwd(const at::Tensor &means, const at::Tensor &dc, const at::Tensor &rest,
                        const at::Tensor &viewmats, const at::Tensor &radii, int64_t degree,
                        const at::Tensor &v_colors, at::Tensor v_dc, at::Tensor v_rest);
// Adam step (cuda/adam.cu)
void adam_step(at::Tensor param, const at::Tensor &grad, at::Tensor exp_avg, at::Tensor exp_avg_sq,
               const at::Tensor &step, double lr, double beta1, double beta2, double eps,
               const c10::optional<at::Tensor> &visible, const c10::optional<at::Tensor> &valid);
}  // namespace bytesplat

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
    m.doc() = "bytesplat fused Gaussian rasterization kernels";
    m.def("render_fwd", &bytesplat::render_fwd, "tile rasterizer forward");
    m.def("render_bwd", &bytesplat::render_bwd, "tile rasterizer backward");
    m.def("fused_capacity", &bytesplat::fused_capacity,
          "Gaussians per tile kept on chip by the fused kernel");
    m.def("fused_smem_layout", &bytesplat::fused_smem_layout,
          "the fused kernel's shared memory: [bytes per Gaussian, fixed bytes per block, granularity]");
    m.def("fused_loss", &bytesplat::fused_loss,
          "one-launch render + splatfacto loss gradient + backward");
    m.def("loss_grad", &bytesplat::loss_grad,
          "splatfacto loss gradient dL/d render + per-tile loss partials (split schedule)");
    m.def("bin_tiles", &bytesplat::bin_tiles,
          "per-tile Gaussian lists sorted by depth (offsets, flatten_ids, total: the number of tile "
          "intersections [1] int64 on the device); known_total >= 0: that number when the caller knows it, "
          "or room for at least that many (no device read; a larger true total drops the pairs past it)",
          py::arg("means2d"), py::arg("radii"), py::arg("depths"), py::arg("width"),
          py::arg("height"), py::arg("tile_size"), py::arg("known_total") = -1);
    m.def("tile_intersections", &bytesplat::tile_intersections,
          "tiles reached per camera [C] int64 (what bin_tiles' total is, per camera)");
    m.def("warp_masks", &bytesplat::warp_masks,
          "the plain render kernels' per-warp culling masks [entries] uint8, one per tile-list entry: bit w set "
          "when warp w's 8x4 pixel block of the entry's tile can composite its Gaussian (the box of its alpha >= "
          "1/255 ellipse; with rows, then each row of blocks against the ellipse's extent)");
    m.def("trim_tile_lists", &bytesplat::trim_tile_lists,
          "the tile lists without the entries whose rows warp mask is empty (no 8x4 block of the tile can "
          "composite the Gaussian): (offsets, flatten_ids, masks), as long as the input lists, the lists in the "
          "first offsets[-1] entries, in the same order");
    m.def("opacity_aware_radii", &bytesplat::opacity_aware_radii,
          "per-axis tile radii [C,N,2] int32 of the opacity-aware reach from the projection's radii [C,N], "
          "conics [C,N,3] and opacities [C,N] (bytesplat_ns/raster/tile_reach.py, the same result)");
    m.def("sh_views_fwd", &bytesplat::sh_views_fwd,
          "SH colors of N Gaussians from C cameras [C,N,3] (+0.5, clamped at 0; 0 where culled) from "
          "the DC coefficients [N,3] and the rest [N,K-1,3] (row-strided views allowed)");
    m.def("sh_views_bwd", &bytesplat::sh_views_bwd,
          "gradients of sh_views_fwd summed over the cameras: writes the coefficients' into v_dc / "
          "v_rest (shaped as dc / rest, row-strided views allowed), returns the means' [N,3]");
    // Adam step (cuda/adam.cu)
    m.def("adam_step", &bytesplat::adam_step,
          "one torch.optim.Adam step (amsgrad/weight_decay/maximize off) of one contiguous float32 "
          "tensor in place: param, exp_avg, exp_avg_sq; step: its float32 count, already incremented; "
          "visible (optional, [rows] bool): only those rows are updated; valid (optional, one bool on the "
          "device): false leaves everything as it is",
          py::arg("param"), py::arg("grad"), py::arg("exp_avg"), py::arg("exp_avg_sq"), py::arg("step"),
          py::arg("lr"), py::arg("beta1"), py::arg("beta2"), py::arg("eps"), py::arg("visible") = py::none(),
          py::arg("valid") = py::none());
}
