"""The backward kernels' two warp reductions (cuda/common.cuh) behave alike on the GPU.

tests/raster/test_butterfly_reduce.py emulates the butterfly reduce-scatter on the CPU (lane mapping,
padding, shuffle counts, the max-combined pruning-score lane). Here the kernels themselves run it:
with the pruning score gathered (K = 12 components, component 11 combined with max: the
``CONTRIB`` path), with and without absgrad (K = 11 / 9), for the fused kernel (one launch, tiles
streaming through a small capacity) and for render_bwd (split). The score is a max, so both
reductions must give it bit for bit; the summed gradients agree up to fp32 summation order.
"""

from __future__ import annotations

import pytest
import torch

from tests.helpers.contribution_scenes import stop_scene_2d

pytestmark = pytest.mark.gpu

REDUCE_AB_TOL = 5e-5  # another fp32 order of the same sums; a lane/component mix-up shows as O(1e-2..1)


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.detach().double(), b.detach().double()
    return (a - b).abs().max().item() / max(b.abs().max().item(), 1e-12)


@pytest.mark.parametrize("schedule,capacity", [("one_launch", 64), ("split", None)])
@pytest.mark.parametrize("absgrad", [True, False])
def test_butterfly_and_shuffle_give_the_same_score_and_gradients(schedule, capacity, absgrad):
    from bytesplat_ns.raster.fused import _FusedLoss, bin_tiles

    sc = stop_scene_2d(C=2, crowd=400, device="cuda")  # crowded tiles: several 32-Gaussian chunks each
    W, H = sc["width"], sc["height"]
    offsets, fids = bin_tiles(sc["means2d"], sc["radii"], sc["depths"], W, H)
    assert int((offsets[1:] - offsets[:-1]).max()) > 4 * 32
    g = torch.Generator(device="cuda").manual_seed(3)
    gt = torch.rand(2, H, W, 3, device="cuda", generator=g)
    bg = torch.rand(2, 3, device="cuda", generator=g)
    runs = {}
    for butterfly in (True, False):
        ins = [sc[k].clone().requires_grad_(True) for k in ("means2d", "conics", "colors", "opacities")]
        loss, _, _, _, score = _FusedLoss.apply(*ins, bg, gt, offsets, fids, W, H, 0.2, absgrad, capacity, 2,
                                                schedule, butterfly, True, True)
        loss.backward()
        info = _FusedLoss.last_kernel_info
        assert info["bwd_reduce"] == ("butterfly" if butterfly else "shuffle") and info["contribution"]
        absg = ins[0].absgrad if absgrad else None
        runs[butterfly] = (loss.detach(), score, [x.grad for x in ins], absg)
    (lb, sb, gb, ab), (ls, ss, gs, as_) = runs[True], runs[False]
    assert abs(lb.item() - ls.item()) <= 1e-6 * abs(ls.item())  # the loss does not depend on the reduction
    assert float(sb.max()) > 0 and torch.equal(sb, ss)  # a max is exact in any order
    for name, a, b in zip(("means2d", "conics", "colors", "opacities"), gb, gs):
        assert b.abs().max() > 0 and _rel(a, b) <= REDUCE_AB_TOL, name
    if absgrad:
        assert as_.abs().max() > 0 and _rel(ab, as_) <= REDUCE_AB_TOL
