"""Inputs of the SH color kernels with the coefficients split into DC and rest (tests/raster/test_sh_split*.py)."""

from __future__ import annotations

import torch

from tests.helpers.distributed_worker import look_at


def split_sh_inputs(N, C, K, seed, culled=0.2, device="cpu"):
    """means [N,3], dc [N,3], rest [N,K-1,3], viewmats [C,4,4] (cameras around z = -4), radii [C,N]
    int32 with about ``culled`` of them 0. A tenth of the Gaussians have a DC term that clamps their
    color at 0; the last one sits at camera 0's center (a zero direction)."""
    g = torch.Generator().manual_seed(seed)
    means = torch.randn(N, 3, generator=g)
    dc = torch.randn(N, 3, generator=g) * 0.4
    rest = torch.randn(N, K - 1, 3, generator=g) * 0.4
    dc[: N // 10] = -3.0
    eyes = torch.randn(C, 3, generator=g) * 2.0 + torch.tensor([0.0, 0.0, -4.0])
    viewmats = torch.stack([look_at(tuple(e.tolist())) for e in eyes])
    radii = torch.randint(1, 9, (C, N), generator=g, dtype=torch.int32)
    radii[torch.rand(C, N, generator=g) < culled] = 0
    means[N - 1] = -(viewmats[0, :3, :3].T @ viewmats[0, :3, 3])
    return tuple(t.to(device) for t in (means, dc, rest, viewmats, radii))
