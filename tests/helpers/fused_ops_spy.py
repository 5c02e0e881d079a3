"""The kernels' PyTorch stand-in (``raster._torch_impl.TorchOps``) recording what each launch was
asked: the tests of the fused front end check that every switch reaches the kernels it belongs to."""

from __future__ import annotations

from bytesplat_ns.raster._torch_impl import TorchOps


class RecordingOps(TorchOps):
    """``TorchOps`` that counts its launches and records each launch's switches."""

    def __init__(self):
        self.calls = {"render_fwd": 0, "render_bwd": 0, "fused_loss": 0, "loss_grad": 0}
        self.butterfly = []  # (entry point, butterfly flag) per backward launch
        self.contribution = []  # (entry point, contribution flag) per backward launch
        self.warp_cull = []  # (entry point, what it was given for the per-warp cull) per launch
        self.masks_rows = []  # the rows flag of each warp_masks launch (the plain backward's masks)
        self.fast_exp = []  # (entry point, fast_exp flag) per launch
        self.bwd_pixels = []  # render_bwd's pixels per thread, per launch
        self.tile_order = []  # (entry point, tile order or None) per plain launch
        self.v_scale = []  # render_bwd's scale of dL/d render (the loss's incoming gradient) or None, per launch

    def render_fwd(self, m, c, col, o, bg, offsets, fids, C, W, H, with_stop, warp_cull, fast_exp, tile_order):
        self.calls["render_fwd"] += 1
        self.tile_order.append(("render_fwd", tile_order))
        self.warp_cull.append(("render_fwd", warp_cull))
        self.fast_exp.append(("render_fwd", fast_exp))
        return super().render_fwd(m, c, col, o, bg, offsets, fids, C, W, H, with_stop, warp_cull, fast_exp, tile_order)

    def render_bwd(self, m, c, col, o, bg, offsets, fids, C, W, H, T, last, v_rgb, v_alpha, absgrad,
                   butterfly, contribution, stop, warp_cull, warp_masks, fast_exp, pixels_per_thread, tile_order,
                   v_scale):
        self.calls["render_bwd"] += 1
        self.v_scale.append(v_scale)
        self.tile_order.append(("render_bwd", tile_order))
        self.bwd_pixels.append(pixels_per_thread)
        self.warp_cull.append(("render_bwd", "masks" if warp_masks is not None else warp_cull))
        self.fast_exp.append(("render_bwd", fast_exp))
        self.butterfly.append(("render_bwd", butterfly))
        self.contribution.append(("render_bwd", contribution))
        return super().render_bwd(m, c, col, o, bg, offsets, fids, C, W, H, T, last, v_rgb, v_alpha, absgrad,
                                  butterfly, contribution, stop, warp_cull, warp_masks, fast_exp, pixels_per_thread,
                                  tile_order, v_scale)

    def warp_masks(self, m, c, o, offsets, fids, C, W, H, rows):
        self.masks_rows.append(rows)
        return super().warp_masks(m, c, o, offsets, fids, C, W, H, rows)

    def loss_grad(self, render, gt, ssim_lambda, window, clamp_inclusive):
        self.calls["loss_grad"] += 1
        return super().loss_grad(render, gt, ssim_lambda, window, clamp_inclusive)

    def fused_loss(self, m, c, col, o, bg, gt, offsets, fids, C, W, H, ssim_lambda, window, cap,
                   blocks_per_sm, absgrad, force_two_phase, clamp_inclusive, butterfly, contribution, warp_cull,
                   fast_exp):
        self.calls["fused_loss"] += 1
        self.warp_cull.append(("fused_loss", warp_cull))
        self.fast_exp.append(("fused_loss", fast_exp))
        self.butterfly.append(("fused_loss", butterfly))
        self.contribution.append(("fused_loss", contribution))
        return super().fused_loss(m, c, col, o, bg, gt, offsets, fids, C, W, H, ssim_lambda, window, cap,
                                  blocks_per_sm, absgrad, force_two_phase, clamp_inclusive, butterfly, contribution,
                                  warp_cull, fast_exp)
