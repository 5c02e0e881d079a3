"""``bytesplat-bench spoilers`` (and ``wallclock --spoilers``) on CPU: a floater planted in front of
an eval camera is found, described and followed back through the run's checkpoints."""

from __future__ import annotations

import json
import math
import shutil

import pytest
import torch

from bytesplat_ns.bench import spoilers, wallclock
from bytesplat_ns.data.scene import SceneSpec, ensure_scene
from bytesplat_ns.gaussian_budget import view_blending_weights

SH_C0 = 0.28209479177387814


def test_pixel_weights_weigh_each_pixels_compositing_weights():
    # a 2x4 image of two Gaussians whose compositing weights are known: image = sum_g w_g c_g
    weights = torch.zeros(2, 4, 2)  # [H, W, Gaussian]
    weights[0, :, 0] = torch.tensor([1.0, 0.5, 0.0, 0.0])
    weights[0, :, 1] = torch.tensor([0.0, 0.0, 0.25, 1.0])

    def render(colors):
        return torch.einsum("hwg,gc->hwc", weights, colors)[None]

    plain = view_blending_weights(render, 2, torch.device("cpu"))
    assert plain.tolist() == pytest.approx([1.5, 1.25])
    error = torch.tensor([[1.0, 0.0, 0.0, 2.0], [5.0, 5.0, 5.0, 5.0]])
    weighted = view_blending_weights(render, 2, torch.device("cpu"), pixel_weights=error)
    assert weighted.tolist() == pytest.approx([1.0, 2.0])


def test_a_planted_floater_is_found_described_and_followed(tmp_path):
    # a capture with lens distortion, as phone captures have: nerfstudio scores eval renders against the
    # undistorted (and cropped) photo, which the tool must take too
    data = tmp_path / "distorted"
    shutil.copytree(ensure_scene(SceneSpec(size="small", num_views=10, width=32), cache_dir=tmp_path / "scenes"), data)
    meta = json.loads((data / "transforms.json").read_text())
    meta["k1"] = 0.08
    (data / "transforms.json").write_text(json.dumps(meta))
    out = tmp_path / "wallclock.json"
    result = wallclock.main([
        "--methods", "bytesplat --steps-per-save 2", "--iterations", "6", "--seeds", "0",
        "--dataparser", f"bytesplat-scene --data {data}",
        "--spoilers", "--work-dir", str(tmp_path / "runs"), "--out", str(out)])
    run = result["runs"][0]
    assert "--save-only-latest-checkpoint False" in run["ns_train_command"]
    worst = min(run["eval_images"], key=lambda image: image["psnr"])
    report = run["spoilers"]
    assert "error" not in report, report.get("error")
    assert report["image"] == worst["file"] and report["psnr"] == pytest.approx(worst["psnr"], abs=1e-3)
    shares = [entry["error_share"] for entry in report["spoilers"]]
    assert shares == sorted(shares, reverse=True) and 0 < sum(shares) <= 1
    assert [report["removed"][k]["error_share"] for k in ("1", "10", "100", "1000")] == sorted(
        report["removed"][k]["error_share"] for k in ("1", "10", "100", "1000"))
    assert [point["step"] for point in report["trajectory"]] == [2, 4]  # the checkpoints before the latest (5)
    assert all(point["tracked"] and point["num_gaussians"] == report["num_gaussians"] for point in report["trajectory"])

    # the same run with one Gaussian moved right in front of the worst view's camera: a magenta floater
    from nerfstudio.utils.eval_utils import eval_setup

    config_path = next((tmp_path / "runs").glob("bytesplat-seed0/bytesplat/*/seed0/config.yml"))
    config, pipeline, checkpoint, step = eval_setup(config_path, test_mode="test")
    dataset = pipeline.datamanager.eval_dataset
    index = [p.name for p in dataset.image_filenames].index(worst["file"])
    c2w = dataset.cameras.camera_to_worlds[index]
    planted = 123
    params = pipeline.model.gauss_params
    with torch.no_grad():
        params["means"][planted] = c2w[:3, 3] - 0.2 * c2w[:3, 2]  # nerfstudio cameras look down their -z
        params["scales"][planted] = math.log(0.1)
        params["opacities"][planted] = 4.0
        params["features_dc"][planted] = (torch.tensor([1.0, 0.0, 1.0]) - 0.5) / SH_C0
        params["features_rest"][planted] = 0.0
    earlier = [p for p in spoilers.checkpoint_paths(config) if str(p) != str(checkpoint)]
    found = spoilers.analyse(pipeline, worst["file"], step, top=1, checkpoints=earlier, log=lambda line: None)
    json.dumps(found)  # plain JSON
    top = found["spoilers"][0]
    assert top["index"] == planted and top["error_share"] > 0.5
    assert found["psnr"] < worst["psnr"] - 3  # it spoils the view...
    assert found["removed"]["1"]["psnr"] > found["psnr"] + 3  # ...and removing it alone mends most of it
    assert top["eval_camera_distance"] == pytest.approx(0.2, rel=1e-4) and top["eval_camera_depth"] == pytest.approx(0.2, rel=1e-4)
    assert top["opacity"] == pytest.approx(torch.sigmoid(torch.tensor(4.0)).item(), rel=1e-5)
    assert top["scale_max"] == pytest.approx(0.1, rel=1e-5) and top["sh_rest_norm"] == 0.0
    # before it was planted it sat elsewhere and spoiled nothing: followed back through steps 2 and 4
    assert [point["step"] for point in found["trajectory"]] == [2, 4]
    for point in found["trajectory"]:
        assert point["psnr"] > found["psnr"] + 3 and point["error_share"] < 0.2
        assert point["median"]["displacement_to_final"] > 0.05


def test_an_image_outside_the_eval_split_is_a_clear_error():
    class Dataset:
        image_filenames = ["a/0001.jpg", "a/0002.jpg"]

    class Pipeline:
        class datamanager:
            eval_dataset = Dataset()

        model = None

    from bytesplat_ns.errors import BytesplatError

    with pytest.raises(BytesplatError, match="0003.jpg: not an eval image of this run.*0001.jpg, 0002.jpg"):
        spoilers.ViewProbe(Pipeline(), "0003.jpg")
