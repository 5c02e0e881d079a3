"""Checks shared by the pruning tests (hardware-aware pruning and the Gaussian budget)."""

from __future__ import annotations

import math

import torch


def explicit_scores(means2d, conics, opacities, radii, depths, W, H, tile=16, count_stop=True, reduce="max"):
    """Per pixel, walk the Gaussians whose tile box holds the pixel's tile in depth order (float64),
    with gsplat's rules; score = max (``reduce="sum"``: sum) over pixels of alpha*T (the stopping
    Gaussian included unless ``count_stop=False``). Returns scores [C,N] and whether some pixel stopped."""
    C, N = radii.shape
    ys, xs = torch.meshgrid(torch.arange(H), torch.arange(W), indexing="ij")
    px, py = xs.flatten().double() + 0.5, ys.flatten().double() + 0.5
    ptx, pty = xs.flatten() // tile, ys.flatten() // tile
    out = torch.zeros(C, N, dtype=torch.float64)
    stopped_any = False
    for c in range(C):
        T = torch.ones(W * H, dtype=torch.float64)
        alive = torch.ones(W * H, dtype=torch.bool)
        for g in torch.sort(depths[c].double(), stable=True).indices.tolist():
            r = float(radii[c, g])
            if r <= 0:
                continue
            mx, my = means2d[c, g].double().tolist()
            x0, x1 = math.floor((mx - r) / tile), math.ceil((mx + r) / tile)
            y0, y1 = math.floor((my - r) / tile), math.ceil((my + r) / tile)
            reach = (ptx >= x0) & (ptx < x1) & (pty >= y0) & (pty < y1)
            a, b, cc = conics[c, g].double().tolist()
            dx, dy = mx - px, my - py
            sigma = 0.5 * (a * dx * dx + cc * dy * dy) + b * dx * dy
            alpha = torch.clamp(float(opacities[c, g]) * torch.exp(-sigma), max=0.999)
            use = reach & alive & (sigma >= 0) & (alpha >= 1.0 / 255.0)
            nextT = T * (1 - alpha)
            stop = use & (nextT <= 1e-4)
            w = torch.where(use & (count_stop | ~stop), alpha * T, torch.zeros_like(T))
            out[c, g] = w.max() if reduce == "max" else w.sum()
            stopped_any |= bool(stop.any())
            alive &= ~stop
            T = torch.where(use & ~stop, nextT, T)
    return out, stopped_any


def check_state_consistent(params, optimizers, state):
    """Parameters, their Adam moments and every per-Gaussian strategy tensor have the same rows."""
    n = params["means"].shape[0]
    for k, p in params.items():
        assert p.shape[0] == n, k
        opt = optimizers[k]
        assert opt.param_groups[0]["params"][0] is p
        st = opt.state[p]
        for key in ("exp_avg", "exp_avg_sq"):
            if st or k != "features_rest":  # features_rest (SH degree 0) never gets a gradient
                assert st[key].shape == p.shape, (k, key)
    for k, v in state.items():
        if isinstance(v, torch.Tensor):
            assert v.shape[0] == n, k
