"""The coarse start's floor (``min_train_resolution``): splatfacto's ``num_downscales 2`` trains on a
quarter of the image size for its first ``resolution_schedule`` steps, meant for photos; on the
built-in 128x96 scene that is 32x24, where densification runs away. bytesplat starts no lower than
100 px on the longer side and leaves larger images to splatfacto's schedule."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from tests.helpers.model_steps import make_model, seed_cloud


def _attributes(width: int, height: int):
    """What nerfstudio's trainer hands get_training_callbacks, as far as the floor reads it."""
    cameras = SimpleNamespace(width=torch.tensor([[width]]), height=torch.tensor([[height]]))
    dataset = SimpleNamespace(cameras=cameras)
    return SimpleNamespace(pipeline=SimpleNamespace(datamanager=SimpleNamespace(train_dataset=dataset)), optimizers=None)


def test_small_images_train_at_full_resolution_from_the_start(capsys):
    model = make_model("reference", seed_cloud(), num_downscales=2)
    model.train()
    assert model._get_downscale_factor() == 4  # before training starts: splatfacto's
    callbacks = model.get_training_callbacks(_attributes(128, 96))
    assert len(callbacks) == 2  # splatfacto's own callbacks are still there
    assert model._get_downscale_factor() == 1
    said = " ".join(capsys.readouterr().out.split())  # rich wraps the line (and adds the caller's file)
    assert "128 px on their longer side; starting at 1/1 of that instead of" in said and "splatfacto's 1/4" in said
    model.eval()
    assert model._get_downscale_factor() == 1


def test_larger_images_keep_what_the_floor_allows():
    model = make_model("reference", seed_cloud(), num_downscales=2)
    model.train()
    assert model.limit_downscales(256) == 1 and model._get_downscale_factor() == 2  # 128 px
    assert model.limit_downscales(800) == 2 and model._get_downscale_factor() == 4  # 200 px: splatfacto's
    model.step = model.config.resolution_schedule  # the schedule still moves on: 1/4 -> 1/2
    assert model._get_downscale_factor() == 2


def test_zero_keeps_splatfactos_schedule():
    model = make_model("reference", seed_cloud(), num_downscales=2, min_train_resolution=0)
    model.train()
    assert model.limit_downscales(128) == 2 and model._get_downscale_factor() == 4
