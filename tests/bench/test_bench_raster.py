"""bench.raster: which timed arm stands for training's pass."""

from __future__ import annotations

import inspect

import pytest
import torch

from bytesplat_ns.bench import raster
from bytesplat_ns.raster.options import DEFAULT_OPTIONS, FusedOptions


def test_training_arm_follows_the_falloff_and_is_timed():
    assert raster.training_arm(FusedOptions(fast_exp=False)) == "raster_loss_fused_split_trimmed"
    assert raster.training_arm(FusedOptions(fast_exp=True)) == "raster_loss_fused_split_trimmed_fast_exp"
    # the projection, the binning and the reach's implementation act before the timed 2D pass
    assert raster.training_arm(FusedOptions(projection="torch", binning="torch", tile_reach="torch")) \
        == raster.training_arm()
    assert f'"{raster.training_arm(DEFAULT_OPTIONS)}"' in inspect.getsource(raster.bench_one)


@pytest.mark.parametrize("changed", [dict(schedule="two_launch"), dict(trim_tile_lists=False), dict(warp_cull_rows=True),
                                     dict(bwd_pixels_per_thread=2), dict(tile_order="longest_first"),
                                     dict(bwd_reduce="shuffle"), dict(opacity_aware_tiles=False), dict(warp_cull=False)])
def test_options_without_an_arm_are_refused(changed):
    with pytest.raises(ValueError, match="no raster \\+ loss arm"):
        raster.training_arm(FusedOptions(**changed))


def test_a_pass_takes_the_inputs_staged_for_it_once_then_fresh_ones():
    """``time_ms(prepare=stage_leaves)`` clones a pass's inputs before its timing starts; the pass then takes those
    (not clones made inside the timing), and a pass with nothing staged clones its own."""
    from bytesplat_ns.bench.raster import StageInputs
    from bytesplat_ns.bench.synthetic import synthetic_scene

    inp = StageInputs(0, 0, 0, 0, projection="torch", scene=synthetic_scene(300, 64, 48, 0, device="cpu"))
    inp.stage_leaves()
    staged = inp._staged_leaves
    first, second = inp.leaves(), inp.leaves()
    assert all(a is b for a, b in zip(first, staged))
    assert not any(a is b for a, b in zip(second, staged))
    for leaf, source in zip(second, (inp.m2, inp.con, inp.col, inp.op)):
        assert leaf.requires_grad and leaf.is_leaf and torch.equal(leaf, source) and leaf.data_ptr() != source.data_ptr()
