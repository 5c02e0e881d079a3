"""The benchmarks on a trained scene, on the CPU: a tiny ``bytesplat-bench train`` run (4 iterations
of the built-in small scene) leaves a run directory; ``bench.trained`` loads its Gaussians, cameras
and images; one loaded view rendered with the reference rasterizer must equal the trained model's
own render of that camera (the frame and conventions are right); bad run directories give one
clear error; the raster bench builds its inputs from the trained scene (its timings need CUDA) and
the distributed bench runs its 1-process CPU path with ``--trained``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from bytesplat_ns.errors import BytesplatError

ROOT = Path(__file__).resolve().parents[2]
ITERATIONS = 4


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    from bytesplat_ns.bench.train import main

    tmp = tmp_path_factory.mktemp("bench_trained")
    report = main(["--scene", "small", "--iterations", str(ITERATIONS), "--num-downscales", "0",
                   "--work-dir", str(tmp / "w"), "--methods", "bytesplat:reference@hw_prune=off",
                   "--out", str(tmp / "train.json")])
    (run,) = report["runs"]
    return tmp, run


@pytest.fixture(scope="module")
def loaded(trained):
    from bytesplat_ns.bench.trained import load_run

    return load_run(trained[1]["run_dir"])


def test_train_records_the_run_dir_with_its_final_checkpoint(trained):
    tmp, run = trained
    run_dir = Path(run["run_dir"])
    assert run_dir.is_absolute() and run_dir.parent.parent.parent == tmp / "w"
    assert (run_dir / "config.yml").is_file() and (run_dir / "dataparser_transforms.json").is_file()
    assert Path(run["checkpoint"]) == run_dir / "nerfstudio_models" / f"step-{ITERATIONS - 1:09d}.ckpt"
    assert Path(run["checkpoint"]).is_file()
    assert json.loads((tmp / "train.json").read_text())["runs"][0]["run_dir"] == run["run_dir"]


def test_loads_the_trained_gaussians(trained, loaded):
    _, run = trained
    state = torch.load(run["checkpoint"], map_location="cpu", weights_only=False)["pipeline"]
    assert loaded.num_gaussians == run["num_gaussians"] == state["_model.gauss_params.means"].shape[0] > 0
    for name, value in loaded.params.items():
        assert torch.equal(value, state[f"_model.gauss_params.{name}"].float()), name
    assert (loaded.step, loaded.method, loaded.sh_degree) == (ITERATIONS - 1, "bytesplat", 3)
    assert loaded.num_views == 56  # the small scene: 64 views, every 8th held out
    assert loaded.describe()["run_dir"] == run["run_dir"]


def test_a_loaded_view_renders_like_the_trained_model(trained, loaded):
    """The loaded scene through the reference rasterizer == the model's own eval render of that
    train camera (nerfstudio's eval_setup), and the ground truth == the datamanager's image."""
    from nerfstudio.utils.eval_utils import eval_setup

    from bytesplat_ns.bench.trained import raster_scene
    from bytesplat_ns.raster import rasterize

    _, pipeline, _, _ = eval_setup(Path(trained[1]["run_dir"]) / "config.yml")

    def ours(view):
        s = raster_scene(loaded, view, device="cpu")
        render, alpha, _ = rasterize(s["means"], s["quats"], s["scales"], s["opacities"], s["colors"], s["viewmats"],
                                     s["Ks"], s["width"], s["height"], sh_degree=s["sh_degree"])
        return s, torch.clamp(render + (1 - alpha) * s["backgrounds"][:, None, None], 0, 1)[0]

    for view in (5, 40):
        camera = pipeline.datamanager.train_dataset.cameras[view: view + 1]
        with torch.no_grad():
            expected = pipeline.model.get_outputs(camera)["rgb"]
        s, rgb = ours(view)
        assert (s["width"], s["height"]) == (128, 96) and s["colors"].shape[1:] == (16, 3)
        assert rgb.shape == expected.shape and expected.std() > 0.02
        torch.testing.assert_close(rgb, expected, atol=1e-5, rtol=0)
        # the model's own ground truth: the uint8 cache, RGBA composited over the eval background
        model = pipeline.model
        gt = model.composite_with_background(model.get_gt_img(pipeline.datamanager.cached_train[view]["image"]),
                                             s["backgrounds"][0])
        assert pipeline.datamanager.cached_train[view]["image"].shape[-1] == 4  # the small scene is RGBA
        torch.testing.assert_close(s["gt"][0], gt[..., :3], atol=1e-6, rtol=0)
    assert (ours(6)[1] - expected).abs().mean() > 1e-2  # another camera does not pass for view 40


def test_scale_and_views(loaded):
    from bytesplat_ns.bench.distributed import make_scene
    from bytesplat_ns.bench.trained import raster_scene, spread_views, views_scene

    one, two = raster_scene(loaded, 3, device="cpu"), raster_scene(loaded, 3, 2.0, device="cpu")
    assert (two["width"], two["height"]) == (256, 192) and two["gt"].shape == (1, 192, 256, 3)
    torch.testing.assert_close(two["Ks"][0, :2], one["Ks"][0, :2] * 2)
    assert torch.equal(two["viewmats"], one["viewmats"])
    assert raster_scene(loaded, 3, sh_degree=1, device="cpu")["colors"].shape[1] == 4
    picks = spread_views(loaded, 4)
    assert picks == [0, 14, 28, 42]
    v = views_scene(loaded, picks, 0.5)
    ref = make_scene(10, 8, 6, 4)
    assert set(v) == set(ref) and set(v["params"]) == set(ref["params"])
    for k in ("viewmats", "Ks", "images", "backgrounds"):
        assert v[k].shape[0] == 4, k
    assert (v["width"], v["height"], v["sh_degree"]) == (64, 48, 3) and v["images"].shape == (4, 48, 64, 3)
    assert torch.equal(v["viewmats"][2], raster_scene(loaded, 28, device="cpu")["viewmats"][0])


def test_bad_run_directories_and_views(tmp_path, trained, loaded):
    from bytesplat_ns.bench.trained import load_run, raster_scene, spread_views

    with pytest.raises(BytesplatError, match="does not exist"):
        load_run(tmp_path / "nowhere")
    with pytest.raises(BytesplatError, match="no config.yml"):
        load_run(tmp_path)
    run_dir = Path(trained[1]["run_dir"])
    partial = tmp_path / "partial"
    partial.mkdir()
    for name in ("config.yml", "dataparser_transforms.json"):
        (partial / name).write_text((run_dir / name).read_text())
    with pytest.raises(BytesplatError, match="holds no trained model"):
        load_run(partial)
    (partial / "nerfstudio_models").mkdir()
    torch.save({"step": 1, "pipeline": {"_model.field.weights": torch.zeros(2)}},
               partial / "nerfstudio_models" / "step-000000001.ckpt")
    with pytest.raises(BytesplatError, match="holds no Gaussians"):
        load_run(partial / "config.yml")  # the config file names its run too
    with pytest.raises(BytesplatError, match="out of range"):
        raster_scene(loaded, 56, device="cpu")
    with pytest.raises(BytesplatError, match="SH degree 3"):
        raster_scene(loaded, 0, sh_degree=4, device="cpu")
    with pytest.raises(BytesplatError, match="57 views"):
        spread_views(loaded, 57)


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "bytesplat_ns.bench.cli", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)


def test_clis_report_a_bad_run_dir_in_one_line(tmp_path):
    from bytesplat_ns.bench.distributed import main

    result = _cli("raster", "--trained", str(tmp_path / "nowhere"))
    assert result.returncode != 0
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    message = result.stderr.split("bytesplat: error:", 1)[1]
    assert "nowhere does not exist" in message and "run_dir" in message
    # distributed checks the same way before any rank starts (the same BytesplatError: one line)
    with pytest.raises(BytesplatError, match="nowhere does not exist"):
        main(["--trained", str(tmp_path / "nowhere"), "--spawn", "2"])


def test_cli_options_conflict():
    from bytesplat_ns.bench import cli
    from bytesplat_ns.bench.distributed import parse_args

    with pytest.raises(SystemExit):
        cli.main(["raster", "--trained", "x", "--num-gaussians", "5"])
    with pytest.raises(SystemExit):
        cli.main(["raster", "--trained-scale", "2"])
    with pytest.raises(SystemExit):
        parse_args(["--trained", "x", "--width", "64"])
    with pytest.raises(SystemExit):
        parse_args(["--trained", "x", "--views", "3", "--trained-views", "0", "1"])
    a = parse_args(["--trained", "x", "--trained-views", "0", "5"])
    assert (a.views, a.sh_degree) == (2, None)
    a = parse_args([])  # unchanged defaults without --trained
    assert (a.num_gaussians, a.views, a.width, a.height, a.sh_degree) == ([1_000_000], 8, 1920, 1080, 3)


def test_raster_bench_on_the_trained_scene(monkeypatch, tmp_path, trained):
    """The raster bench times CUDA kernels; here its trained-scene path runs up to the timings:
    the JSON header and row name the trained scene, and the stage inputs (projection + binning, the
    torch versions) are built from it."""
    from bytesplat_ns.bench import raster
    from bytesplat_ns.bench import trained as trained_mod
    from bytesplat_ns.bench.cli import main as cli_main

    seen = {}

    def bench_one(n, width, height, sh_degree, warmup, repeats, skip_gsplat=False, projection="gsplat",
                  raster_only=False, scene=None, scene_label="synthetic", baseline_ssim=(), gsplat_sites=(),
                  queue_ms=None):
        inp = raster.StageInputs(n, width, height, sh_degree, "torch", scene=scene)
        seen.update(baseline_ssim=list(baseline_ssim), gsplat_sites=list(gsplat_sites), queue_ms=queue_ms)
        seen.update(n=n, W=inp.W, H=inp.H, sh=inp.sh_degree, visible=int((inp.radii > 0).sum()),
                    lists=int(inp.offsets[-1]), tiles=inp.offsets.numel() - 1)
        # the warp blocks each cull test keeps per opacity-aware entry (the kernel's twin stands in)
        seen.update(box=inp.warp_blocks_per_entry(False), rows=inp.warp_blocks_per_entry(True))
        return {"scene": scene_label, "num_gaussians": int(scene["means"].shape[0])}

    real_scene = trained_mod.raster_scene
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "stand-in")
    monkeypatch.setattr(trained_mod, "raster_scene", lambda *a, **k: real_scene(*a, **dict(k, device="cpu")))
    monkeypatch.setattr(raster, "bench_one", bench_one)
    from bytesplat_ns.raster import _wrapper
    from bytesplat_ns.raster._torch_impl import TorchOps

    monkeypatch.setattr(_wrapper, "_ops", lambda: TorchOps())
    run_dir, n = trained[1]["run_dir"], trained[1]["num_gaussians"]
    out = tmp_path / "raster.json"
    assert cli_main(["raster", "--trained", run_dir, "--trained-view", "7", "--trained-scale", "0.5",
                     "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["scene"] == f"trained:{run_dir}"
    assert (report["width"], report["height"], report["sh_degree"]) == (64, 48, 3)
    assert report["trained"]["view"] == 7 and report["trained"]["scale"] == 0.5
    assert report["trained"]["num_gaussians"] == n and report["trained"]["image"].endswith(".png")
    assert report["runs"] == [{"scene": f"trained:{run_dir}", "num_gaussians": n}]
    assert (seen["n"], seen["W"], seen["H"], seen["sh"], seen["tiles"]) == (n, 64, 48, 3, 4 * 3)
    assert seen["visible"] > 0 and seen["lists"] >= seen["visible"]
    assert 0 < seen["rows"] <= seen["box"] <= 8
    # the defaults
    assert seen["baseline_ssim"] == ["pytorch_msssim", "fussim"] and seen["gsplat_sites"] == [] and seen["queue_ms"] == 5.0


def test_distributed_bench_one_process_on_the_trained_scene(tmp_path, trained):
    import os

    import torch.distributed as dist

    from bytesplat_ns.bench.distributed import main

    # The 1-process path sets torchrun's variables for its own one-rank group; left behind, they
    # would make later in-process launches (e.g. --spawn) believe they run under torchrun.
    keys = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
    saved = {k: os.environ.pop(k) for k in keys if k in os.environ}
    run_dir, n = trained[1]["run_dir"], trained[1]["num_gaussians"]
    out = tmp_path / "d.json"
    try:
        main(["--device", "cpu", "--trained", run_dir, "--trained-views", "3", "30", "--trained-scale", "0.5",
              "--warmup", "0", "--repeats", "1", "--out", str(out)])
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
        for k in keys:
            os.environ.pop(k, None)
        os.environ.update(saved)
    report = json.loads(out.read_text())
    scene = report["scene"]
    assert scene["source"] == f"trained:{run_dir}" and scene["num_gaussians"] == [n]
    assert (scene["width"], scene["height"], scene["views_per_step"], scene["sh_degree"]) == (64, 48, 2, 3)
    assert scene["trained"]["views"] == [3, 30] and scene["trained"]["checkpoint"] == trained[1]["checkpoint"]
    rows = [(r["scene"], r["num_gaussians"], r["impl"], r["ranks"], r["status"]) for r in report["results"]]
    assert rows == [(f"trained:{run_dir}", n, "bytesplat", 1, "ok"), (f"trained:{run_dir}", n, "gsplat", 1, "skipped")]
    assert report["results"][0]["loss_last"] > 0 and report["complete"] is True
