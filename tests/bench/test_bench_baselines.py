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
    assert not baselines.per_axis_radii("1.4.0")
    assert baselines.per_axis_radii("1.5.3") and baselines.per_axis_radii("2.0.0")


def test_gsplat_15_gets_the_same_lists_as_ours_square_or_opacity_aware(monkeypatch):
    """gsplat's binning is given our radii: the square ones per axis, or the opacity-aware reach
    (``raster.tile_reach``), so that both rasterizers draw the same lists."""
    from gsplat.cuda import _wrapper

    from bytesplat_ns.raster.tile_reach import opacity_aware_radii

    seen = []
    monkeypatch.setattr(_wrapper, "isect_tiles", lambda m2, radii, depths, *a: seen.append(radii) or (None, "ids", "fids"))
    monkeypatch.setattr(_wrapper, "isect_offset_encode", lambda ids, *a: "offsets")

    class Inputs:  # the fields of bench.raster.StageInputs gsplat_bins reads
        W, H, m2, depths = 64, 48, torch.zeros(1, 3, 2), torch.ones(1, 3)
        radii = torch.tensor([[9, 9, 0]], dtype=torch.int32)
        con = torch.tensor([[[1 / 9.0, 0.0, 1.0], [1.0, 0.0, 1.0], [1.0, 0.0, 1.0]]])
        op = torch.tensor([[0.9, 0.02, 0.5]])

    assert baselines.gsplat_bins(Inputs, "1.5.3") == ("offsets", "fids")
    assert torch.equal(seen[-1], torch.stack([Inputs.radii, Inputs.radii], -1))
    baselines.gsplat_bins(Inputs, "1.5.3", opacity_aware=True)
    assert torch.equal(seen[-1], opacity_aware_radii(Inputs.radii, Inputs.con, Inputs.op))
    assert seen[-1][0, 0, 0] > seen[-1][0, 0, 1] and seen[-1][0, 2].tolist() == [0, 0]
    baselines.gsplat_bins(Inputs, "1.4.0")
    assert torch.equal(seen[-1], Inputs.radii)  # 1.4 bins with one radius per Gaussian


def test_another_gsplat_runs_in_a_child_with_its_site_first(tmp_path):
    spec = baselines.child_command(str(tmp_path), 1000, 64, 48, 3, 1, 2, ["fussim"], True, "torch", tmp_path / "o.json")
    assert spec["env"]["PYTHONPATH"].split(":")[0] == str(tmp_path)
    assert spec["command"][1:3] == ["-m", "bytesplat_ns.bench.baseline_child"]
    assert "--raster-only" in spec["command"] and spec["command"][spec["command"].index("--ssim") + 1] == "fussim"
    # the child times its passes as the parent times ours: launches queued as far ahead
    assert spec["command"][spec["command"].index("--queue-ms") + 1] == "5.0"
    spec = baselines.child_command(str(tmp_path), 1000, 64, 48, 3, 1, 2, ["fussim"], True, "torch", tmp_path / "o.json",
                                   queue_ms=0.0)
    assert spec["command"][spec["command"].index("--queue-ms") + 1] == "0.0"


def test_a_trained_scene_goes_to_the_child_as_a_file(tmp_path, monkeypatch):
    """The child times the parent's scene (a trained run's, say), not a random one of the same size."""
    from bytesplat_ns.bench import baseline_child
    from bytesplat_ns.bench.synthetic import synthetic_scene

    spec = baselines.child_command(str(tmp_path), 1000, 64, 48, 3, 1, 2, ["fussim"], False, "torch", tmp_path / "o.json",
                                   scene_file=tmp_path / "scene.pt")
    assert "--num-gaussians" not in spec["command"]
    assert spec["command"][spec["command"].index("--scene-file") + 1] == str(tmp_path / "scene.pt")
    scene = synthetic_scene(200, 40, 32, 3, seed=4, device="cpu")
    received = {}

    class Inputs:  # bench.raster.StageInputs as the child builds it
        def __init__(self, n, width, height, sh_degree, projection, scene=None):
            received.update(n=n, scene=scene)

    from bytesplat_ns.bench import raster, scene_file

    monkeypatch.setattr(raster, "StageInputs", Inputs)
    monkeypatch.setattr(baseline_child, "measure", lambda inputs, *a: [{"ok": True}])
    load_on_the_host = scene_file.load_scene
    monkeypatch.setattr(scene_file, "load_scene", lambda path, device="cuda": load_on_the_host(path, device="cpu"))
    scene_file.save_scene(scene, tmp_path / "scene.pt")
    assert baseline_child.main(["--scene-file", str(tmp_path / "scene.pt"), "--out", str(tmp_path / "o.json")]) == 0
    assert received["n"] == 0 and torch.equal(received["scene"]["means"], scene["means"])
    with pytest.raises(SystemExit):  # a scene is required: random (--num-gaussians) or a file
        baseline_child.main(["--out", str(tmp_path / "o.json")])


def test_a_failing_child_is_one_row_saying_why(tmp_path):
    site = tmp_path / "site"
    (site / "gsplat").mkdir(parents=True)
    (site / "gsplat" / "__init__.py").write_text("raise ImportError('this gsplat is broken')\n")
    (row,) = baselines.measure_in_child(str(site), 1000, 64, 48, 3, 1, 2, ["pytorch_msssim"], True, "torch")
    assert row["site"] == str(site) and row["error"].startswith("child exited with")


def _build_fussim_script():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "scripts" / "build_fussim.py"
    spec = importlib.util.spec_from_file_location("build_fussim", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_fussim_build_names_what_it_lacks_before_compiling(tmp_path, capsys):
    build_fussim = _build_fussim_script()
    assert build_fussim.main([]) == 2 and "SRC_DIR SITE_DIR" in capsys.readouterr().err
    src, site = tmp_path / "csrc", tmp_path / "site"
    src.mkdir()
    (src / "ext.cpp").write_text("// only one of the three sources\n")
    with pytest.raises(SystemExit, match="lacks ssim.cu, ssim_fp16.cu"):
        build_fussim.build(src, site)
    for name in ("ssim.cu", "ssim_fp16.cu"):
        (src / name).write_text("\n")
    with pytest.raises(SystemExit, match="no fussim package in"):
        build_fussim.build(src, site)


@pytest.mark.parametrize("command", ["raster", "step"])
def test_a_gsplat_site_without_gsplat_stops_before_anything_is_timed(tmp_path, command):
    """A --gsplat-site folder with no gsplat in it (a dataset's folder given as a suite's --data, say) is one
    clear error before any timing: its child would import this process's gsplat and record it under the
    site's name."""
    from bytesplat_ns.bench import cli
    from bytesplat_ns.errors import BytesplatError

    (tmp_path / "images").mkdir()
    with pytest.raises(BytesplatError, match="no gsplat installed there"):
        cli.main([command, "--gsplat-site", str(tmp_path), "--out", str(tmp_path / "out.json")])
    assert not (tmp_path / "out.json").exists()
    site = tmp_path / "site"
    (site / "gsplat-1.5.3.dist-info").mkdir(parents=True)
    assert baselines.site_gsplat_version(str(site)) == "1.5.3"
