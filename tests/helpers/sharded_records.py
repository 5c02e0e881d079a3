"""2D records as the sharded step's renderer receives them (tests of its compositing, on the GPU and
with the fused kernels' torch stand-in on the CPU): random Gaussians over a small image, some
culled (radius 0), equal depths whose ties global ids break, ids out of order."""

from __future__ import annotations

import torch


def random_records(n: int, seed: int, width: int = 70, height: int = 50, device: str = "cuda"):
    """([means2d, conics, colors, opacities, depths, radii, gids] of n records on ``device``, width, height)."""
    g = torch.Generator().manual_seed(seed)
    means2d = torch.rand(n, 2, generator=g) * torch.tensor([width, height])
    a = torch.rand(n, generator=g) * 0.3 + 0.05
    c = (torch.rand(n, generator=g) - 0.5) * 0.05
    b = torch.rand(n, generator=g) * 0.3 + 0.05
    conics = torch.stack([a, c, b], -1)
    colors = torch.rand(n, 3, generator=g)
    opacities = torch.rand(n, generator=g) * 0.9 + 0.05
    depths = torch.rand(n, generator=g) * 5 + 1
    depths[: n // 4] = depths[n // 4 : 2 * (n // 4)]  # equal depths: ties broken by global id
    radii = torch.full((n,), 12, dtype=torch.int32)
    radii[::7] = 0  # culled
    gids = torch.randperm(n, generator=g).to(torch.int32)
    return [t.to(device) for t in (means2d, conics, colors, opacities, depths, radii, gids)], width, height


def views_scored_in_one_call_vs_each_alone(device: str) -> None:
    """composite_views_fused_loss (a rank's views padded, binned and scored together) against each
    view alone through the reference compositor + background + splatfacto_loss (pytorch_msssim):
    the summed loss, each view's rgb, record gradients and absgrad, with views of very different
    record counts (one empty) arriving out of gid order."""
    from bytesplat_ns.distributed.step import (
        composite_records, composite_views_fused_loss, rgb_with_background, splatfacto_loss,
    )

    W, H = 70, 50
    views = []
    for k, n in enumerate((5000, 1, 300, 0)):
        recs, _, _ = random_records(max(n, 1), seed=10 + k, width=W, height=H, device=device)
        views.append([t[:n] for t in recs])
    g = torch.Generator().manual_seed(4)
    gts = torch.rand(len(views), H, W, 3, generator=g).to(device)
    bgs = torch.rand(len(views), 3, generator=g).to(device)
    out = {}
    for kind in ("each view alone", "one call"):
        leaves, fields, sinks = [], [], []
        for recs in views:
            means2d, conics, colors, opacities, depths, radii, gids = [t.clone() for t in recs]
            leaves.append([t.requires_grad_(True) for t in (means2d, conics, colors, opacities)])
            fields.append((means2d, conics, colors, opacities, depths, radii, gids))
            sinks.append([])
        if kind == "one call":
            loss, rgb = composite_views_fused_loss(fields, W, H, gts, bgs, absgrad_sinks=sinks)
        else:
            loss, rgbs = 0.0, []
            for j, f in enumerate(fields):
                render, alpha = composite_records(*f, W, H, absgrad_sink=sinks[j], compositor="reference")
                rgbs.append(rgb_with_background(render, alpha, bgs[j]))
                loss = loss + splatfacto_loss(rgbs[-1], gts[j])
            rgb = torch.stack(rgbs)
        (0.25 * loss).backward()
        grads = [[t.grad if t.grad is not None else torch.zeros_like(t) for t in lv] for lv in leaves]
        out[kind] = (loss.item(), rgb.detach(), grads, [s[0] if s else None for s in sinks])
    (l_r, rgb_r, g_r, a_r), (l_f, rgb_f, g_f, a_f) = out["each view alone"], out["one call"]
    assert abs(l_r - l_f) <= 1e-5 * abs(l_r)
    assert (rgb_r - rgb_f).abs().max().item() <= 1e-5
    for j in range(len(views)):
        for a, b in zip(g_r[j], g_f[j]):
            assert a.shape == b.shape and (a - b).norm().item() <= 1e-4 * max(a.norm().item(), 1e-12), j
        if a_r[j] is not None and a_r[j].numel():
            assert a_f[j].shape == a_r[j].shape
            assert (a_r[j] - a_f[j]).norm().item() <= 1e-4 * max(a_r[j].norm().item(), 1e-12), j
