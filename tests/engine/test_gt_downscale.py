"""The training image shrunk for splatfacto's coarse start (--pipeline.model.gt-downscale): one average pool
gives splatfacto's box-filter convolution's pixels, on CPU and (where there is one) on the GPU, and the model
takes the way its config names."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from nerfstudio.models.splatfacto import resize_image

from bytesplat_ns.model import ByteSplatModel, ByteSplatModelConfig, box_downscale

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("d", [2, 4, 8])
@pytest.mark.parametrize("dtype", [torch.float32, torch.uint8])
def test_the_pool_gives_the_convolutions_pixels(device, d, dtype):
    g = torch.Generator().manual_seed(d)
    image = torch.rand(67, 45, 4, generator=g)  # sides that d does not divide: the remainder is dropped
    if dtype == torch.uint8:
        image = (image * 255).to(torch.uint8)
    image = image.to(device)
    pooled, convolved = box_downscale(image, d), resize_image(image, d)
    assert pooled.shape == convolved.shape == (67 // d, 45 // d, 4)
    assert pooled.dtype == convolved.dtype == torch.float32
    torch.testing.assert_close(pooled, convolved, rtol=1e-6, atol=1e-6 * (255 if dtype == torch.uint8 else 1))


def _model(gt_downscale: str, factor: int):
    return SimpleNamespace(config=SimpleNamespace(gt_downscale=gt_downscale), _get_downscale_factor=lambda: factor)


def test_the_model_shrinks_by_the_config_s_way(monkeypatch):
    import bytesplat_ns.model as model_module

    calls = []
    monkeypatch.setattr(model_module, "resize_image", lambda image, d: calls.append(("conv", d)) or image[::d, ::d])
    monkeypatch.setattr(model_module, "box_downscale", lambda image, d: calls.append(("pool", d)) or image[::d, ::d])
    image = torch.rand(8, 8, 3)
    assert ByteSplatModel._downscale_if_required(_model("pool", 4), image).shape == (2, 2, 3)
    assert ByteSplatModel._downscale_if_required(_model("conv", 2), image).shape == (4, 4, 3)
    assert ByteSplatModel._downscale_if_required(_model("pool", 1), image) is image  # full resolution: as it is
    assert calls == [("pool", 4), ("conv", 2)]
    assert ByteSplatModelConfig().gt_downscale == "pool"  # the default: no cuDNN load or autotuning (suite gt-downscale)
