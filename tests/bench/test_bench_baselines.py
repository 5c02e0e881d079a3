"""The raster benchmark's baselines (``bench.baselines``) on CPU: they compute splatfacto's loss with
either SSIM, hand the gradient to the render, and time other gsplat versions in a child process."""

from __future__ import annotations

import sys
import types

import pytest
import torch

from bytesplat_ns.bench import baselines
from bytesplat_ns.raster.loss import splatfacto_loss_torch


def images(seed=0, size=(1, 24, 32, 3)):
    g = torch.Generator().manual_seed(seed)
    return torch.rand(size, generator=g), torch.rand(size, generator=g)


def test_the_pytorch_msssim_baseline_is_splatfactos_loss():
    from pytorch_msssim import ssim

    render, gt = images()
    ours = baselines.baseline_loss(render, gt, baselines.ssim_function("pytorch_msssim"))
    rgb = render.clamp(0, 1)
    sim = ssim(gt.permute(0, 3, 1, 2), rgb.permute(0, 3, 1, 2), data_range=1.0, size_average=True, win_size=11, win_sigma=1.5)
    expected = 0.8 * (gt - rgb).abs().mean() + 0.2 * (1 - sim)  # nerfstudio's splatfacto, written out
    assert float(ours) == pytest.approx(float(expected), rel=1e-6)
    assert float(ours) == pytest.approx(float(splatfacto_loss_torch(render, None, gt, None)), rel=1e-6)


def test_fussim_gets_the_render_first_with_pytorch_msssim_settings(monkeypatch):
    from pytorch_msssim import ssim as reference

    calls = []

    def fake_ssim(x, y, **kwargs):  # fussim's gradient flows to its first argument only
        calls.append((x, y, kwargs))
        return reference(x, y, **kwargs)

    monkeypatch.setitem(sys.modules, "fussim", types.SimpleNamespace(ssim=fake_ssim))
    render, gt = images(1)
    render.requires_grad_(True)
    loss = baselines.baseline_loss(render, gt, baselines.ssim_function("fussim"))
    loss.backward()
    (x, y, kwargs), = calls
    assert torch.equal(y, gt.permute(0, 3, 1, 2)) and x.requires_grad
    assert kwargs == {"data_range": 1.0, "size_average": True, "win_size": 11, "win_sigma": 1.5}
    assert float(loss) == pytest.approx(float(splatfacto_loss_torch(render.detach(), None, gt, None)), rel=1e-6)
    assert render.grad is not None and render.grad.abs().sum() > 0


def test_unknown_ssim_is_refused():
    with pytest.raises(ValueError, match="unknown SSIM"):
        baselines.ssim_function("ms-ssim")


def test_gsplat_15_bins_with_per_axis_radii():
    assert not baselines._per_axis_radii("1.4.0")
    assert baselines._per_axis_radii("1.5.3") and baselines._per_axis_radii("2.0.0")


def test_another_gsplat_runs_in_a_child_with_its_site_first(tmp_path):
    spec = baselines.child_command(str(tmp_path), 1000, 64, 48, 3, 1, 2, ["fussim"], True, "torch", tmp_path / "o.json")
    assert spec["env"]["PYTHONPATH"].split(":")[0] == str(tmp_path)
    assert spec["command"][1:3] == ["-m", "bytesplat_ns.bench.baseline_child"]
    assert "--raster-only" in spec["command"] and spec["command"][spec["command"].index("--ssim") + 1] == "fussim"


def test_a_failing_child_is_one_row_saying_why(tmp_path):
    site = tmp_path / "site"
    (site / "gsplat").mkdir(parents=True)
    (site / "gsplat" / "__init__.py").write_text("raise ImportError('this gsplat is broken')\n")
    (row,) = baselines.measure_in_child(str(site), 1000, 64, 48, 3, 1, 2, ["pytorch_msssim"], True, "torch")
    assert row["site"] == str(site) and row["error"].startswith("child exited with")
