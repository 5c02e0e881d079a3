"""bench.raster: which timed arm stands for training's pass."""

from __future__ import annotations

import inspect

import pytest

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
