"""City-scale synthetic scene: spec, culling exactness, determinism, resumable generation, nerfstudio format."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
import pytest
from PIL import Image

from bytesplat_ns.data import city as C
from bytesplat_ns.data.city import (
    CITY_MARKER_NAME,
    JOURNAL_NAME,
    CitySpec,
    build_city,
    city_camera_poses,
    ensure_city,
    generate_city,
    is_city_complete,
    render_city_view,
    shade_city_rays,
)
from bytesplat_ns.data.scene import read_ply
from bytesplat_ns.errors import BytesplatError

TINY = CitySpec(preset="tiny")


def _files(root: Path):
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file() and p.name != JOURNAL_NAME)


def _same_tree(a: Path, b: Path) -> bool:
    fa, fb = _files(a), _files(b)
    return fa == fb and all((a / f).read_bytes() == (b / f).read_bytes() for f in fa)


@pytest.fixture(scope="module")
def tiny_city(tmp_path_factory) -> Path:
    return generate_city(TINY, tmp_path_factory.mktemp("city") / "ref", progress=False, workers=1)


def test_spec_presets_and_validation():
    assert (TINY.width, TINY.height, TINY.num_views, TINY.blocks) == (64, 36, 12, 2)
    big = CitySpec(preset="4k")
    assert (big.width, big.height) == (3840, 2160) and big.num_views == 5000
    assert CitySpec(preset="large").num_views == 4000
    assert CitySpec(preset="tiny", width=160).height == 90  # 16:9 kept
    assert CitySpec(preset="tiny", width=64, height=36) == TINY and CitySpec(preset="tiny", width=64).hash == TINY.hash
    assert CitySpec(preset="tiny", seed=1).hash != TINY.hash
    assert TINY.eval_indices() == [4]
    with pytest.raises(BytesplatError, match="preset"):
        CitySpec(preset="mega")  # type: ignore[arg-type]
    with pytest.raises(BytesplatError, match="aerial_views"):
        CitySpec(preset="tiny", aerial_views=-1)
    with pytest.raises(BytesplatError, match="8192"):
        CitySpec(preset="tiny", width=10000)


def test_layout_and_cameras():
    spec = CitySpec(preset="small")
    scene = build_city(spec)
    kinds = {type(o).__name__ for o in scene.objects}
    assert {"_Building", "_Object"} <= kinds and any(o.kind == "sphere" for o in scene.objects)
    heights = [2 * o.half[2] for o in scene.objects if isinstance(o, C._Building)]
    assert len(heights) >= spec.blocks**2 // 2 and max(heights) > 2.5 * min(heights)  # varied heights
    poses = city_camera_poses(spec, scene)
    assert poses.shape == (spec.num_views, 4, 4)
    R = poses[:, :3, :3]
    assert np.allclose(np.einsum("nij,nik->njk", R, R), np.eye(3), atol=1e-9)
    fwd = -poses[:, :3, 2]
    pitch = np.degrees(np.arcsin(fwd[:, 2]))
    aerial, street = pitch[: spec.aerial_views], pitch[spec.aerial_views :]
    assert (aerial <= -45 + 1e-6).all() and (aerial >= -70 - 1e-6).all()
    assert (street >= -1e-6).all() and (street <= 15 + 1e-6).all()
    assert np.allclose(poses[spec.aerial_views :, 2, 3], C.EYE_HEIGHT)
    assert (poses[: spec.aerial_views, 2, 3] > 3.0).all()
    # street cameras stand in streets, outside every block (hence outside buildings)
    H = scene.half_extent
    lx = np.mod(poses[spec.aerial_views :, 0, 3] + H, C.PITCH) - C.PITCH / 2
    ly = np.mod(poses[spec.aerial_views :, 1, 3] + H, C.PITCH) - C.PITCH / 2
    half_block = (C.PITCH - C.STREET) / 2
    assert ((np.abs(lx) > half_block) | (np.abs(ly) > half_block)).all()


def test_culling_is_exact(monkeypatch):
    """Tile culling (view cone, shadow corridor) changes no pixel compared with testing every object."""
    spec = CitySpec(preset="small", width=96)
    scene = build_city(spec)
    poses = city_camera_poses(spec, scene)
    views = [0, 1, spec.aerial_views, spec.aerial_views + 2]
    culled = [render_city_view(scene, poses[i], spec) for i in views]
    everything = lambda scene, *a: np.arange(len(scene.objects))  # noqa: E731
    monkeypatch.setattr(C, "_cone_candidates", everything)
    monkeypatch.setattr(C, "_shadow_candidates", everything)
    for i, img in zip(views, culled):
        np.testing.assert_array_equal(img, render_city_view(scene, poses[i], spec))
    assert all(img.std() > 0.05 for img in culled)  # textured content, not a flat colour


def test_shade_contract():
    scene = build_city(TINY)
    d = np.array([[0.0, 0.0, -1.0], [0.0, 0.0, 1.0]])
    rgb, t, ids = shade_city_rays(scene, np.array([20.0, 0.0, 5.0]), d)
    assert ids.tolist() == [0, -1] and np.isclose(t[0], 5.0) and np.isinf(t[1])
    assert rgb.shape == (2, 3) and (rgb >= 0).all() and (rgb <= 1).all()


def test_generation_format_and_determinism(tiny_city, tmp_path):
    root = tiny_city
    assert is_city_complete(root, TINY) and not is_city_complete(root, CitySpec(preset="tiny", seed=3))
    meta = json.loads((root / "transforms.json").read_text())
    assert meta["w"] == 64 and meta["h"] == 36 and len(meta["frames"]) == TINY.num_views
    assert len(meta["train_filenames"]) + len(meta["val_filenames"]) == TINY.num_views
    assert meta["val_filenames"] == meta["test_filenames"] == ["images/frame_00004.png"]
    xyz, rgb = read_ply(root / "sparse_pc.ply")
    assert xyz.shape == (TINY.num_points, 3) and rgb is not None and np.isfinite(xyz).all()
    for f in meta["frames"]:
        im = Image.open(root / f["file_path"])
        assert im.size == (64, 36) and im.mode == "RGB"
    again = generate_city(TINY, tmp_path / "again", progress=False, workers=1)
    assert _same_tree(root, again)


def test_parallel_workers_identical(tiny_city, tmp_path):
    par = generate_city(TINY, tmp_path / "par", progress=False, workers=2)
    assert _same_tree(tiny_city, par)


def test_resume_after_interruption(tiny_city, tmp_path, monkeypatch):
    out = tmp_path / "resume"
    real = C._render_city_and_save
    calls = []

    def crashing(spec, i, path):
        if len(calls) == 5:
            raise KeyboardInterrupt("simulated crash")
        calls.append(i)
        return real(spec, i, path)

    monkeypatch.setattr(C, "_render_city_and_save", crashing)
    with pytest.raises(KeyboardInterrupt):
        generate_city(TINY, out, progress=True, workers=1)
    assert not is_city_complete(out) and len(calls) == 5
    (out / "images/frame_00002.png").write_bytes(b"truncated")  # damaged after being journalled
    (out / "images/frame_00007.png").write_bytes(b"stale, never journalled")

    calls.clear()
    monkeypatch.setattr(C, "_render_city_and_save", lambda spec, i, path: (calls.append(i), real(spec, i, path))[1])
    generate_city(TINY, out, progress=True, workers=1)
    assert sorted(calls) == [2] + list(range(5, TINY.num_views))  # only missing or damaged views
    assert is_city_complete(out, TINY) and _same_tree(tiny_city, out)

    calls.clear()
    (out / CITY_MARKER_NAME).unlink()
    generate_city(TINY, out, progress=False, workers=1)  # nothing left to render
    assert calls == [] and is_city_complete(out, TINY)
    with pytest.raises(BytesplatError, match="different city"):
        generate_city(CitySpec(preset="tiny", seed=5), out, progress=False)


def test_ensure_city_cache_and_nerfstudio_parse(tmp_path):
    from bytesplat_ns.data.dataparser import BytesplatSceneDataParserConfig

    path = ensure_city(TINY, cache_dir=tmp_path, workers=1)
    assert path == tmp_path / TINY.dirname and is_city_complete(path, TINY)
    assert ensure_city(TINY, cache_dir=tmp_path) == path  # cached: no work
    parser = BytesplatSceneDataParserConfig(data=path).setup()
    train = parser.get_dataparser_outputs("train")
    val = parser.get_dataparser_outputs("val")
    assert len(train.image_filenames) == 11 and len(val.image_filenames) == 1
    assert train.metadata["points3D_xyz"].shape == (TINY.num_points, 3)


def test_cli(tmp_path, capsys):
    assert C.main(["--preset", "tiny", "--out", str(tmp_path / "cli"), "--workers", "1", "--num-points", "100"]) == 0
    assert is_city_complete(tmp_path / "cli")
    assert C.main(["--preset", "tiny", "--width", "99999", "--out", str(tmp_path / "x")]) == 2


# ------------------------------------------------------------------ lazy image loading (large scenes)


def test_lazy_datamanager_matches_full_and_bounds_memory(tiny_city):
    from nerfstudio.data.datamanagers.full_images_datamanager import FullImageDatamanagerConfig

    from bytesplat_ns.data.dataparser import BytesplatSceneDataParserConfig
    from bytesplat_ns.data.lazy_images import LazyImageDatamanagerConfig, LazyImages

    # "gpu" with device cpu: nerfstudio's "cpu" mode pins memory, which needs a CUDA driver
    full = FullImageDatamanagerConfig(
        dataparser=BytesplatSceneDataParserConfig(data=tiny_city), cache_images="gpu", cache_images_type="uint8"
    ).setup(device="cpu")
    lazy = LazyImageDatamanagerConfig(
        dataparser=BytesplatSceneDataParserConfig(data=tiny_city), lazy_cache_size=3, prefetch=2
    ).setup(device="cpu")
    assert isinstance(lazy.cached_train, LazyImages) and lazy.cached_train.loads == 0  # nothing decoded at setup
    n = len(lazy.train_dataset)
    for step in range(2 * n):
        cam, data = lazy.next_train(step)
        idx = cam.metadata["cam_idx"]
        assert data["image"].dtype == torch.uint8 and data["image"].shape == (36, 64, 3)
        assert torch.equal(data["image"], full.cached_train[idx]["image"])
        assert torch.allclose(cam.camera_to_worlds, full.train_cameras[idx : idx + 1].camera_to_worlds)
        assert len(lazy.cached_train._cache) <= 3
    for fut in list(lazy._pending.values()):
        fut.result()
    assert lazy.cached_train.loads >= n  # re-decoded after eviction instead of held
    views = lazy.fixed_indices_eval_dataloader
    assert len(views) == len(full.fixed_indices_eval_dataloader) == 1
    cam, data = views[0]
    assert torch.equal(data["image"], full.fixed_indices_eval_dataloader[0][1]["image"])
    assert lazy.get_train_rays_per_batch() == 64 * 36
    cam, data = lazy.next_eval(0)
    assert data["image"].shape == (36, 64, 3)


def test_lazy_datamanager_refuses_distortion(tiny_city, tmp_path):
    import shutil

    from bytesplat_ns.data.dataparser import BytesplatSceneDataParserConfig
    from bytesplat_ns.data.lazy_images import LazyImageDatamanagerConfig

    data = tmp_path / "distorted"
    shutil.copytree(tiny_city, data)
    meta = json.loads((data / "transforms.json").read_text())
    meta["k1"] = 0.1
    (data / "transforms.json").write_text(json.dumps(meta))
    with pytest.raises(BytesplatError, match="distortion"):
        LazyImageDatamanagerConfig(dataparser=BytesplatSceneDataParserConfig(data=data)).setup(device="cpu")


def test_dataparser_city_scene_size(tmp_path):
    from bytesplat_ns.data.dataparser import BytesplatSceneDataParserConfig

    cfg = BytesplatSceneDataParserConfig(scene_size="city-tiny", scene_cache_dir=tmp_path, num_views=8, width=48)
    outputs = cfg.setup().get_dataparser_outputs("train")
    expected = CitySpec(preset="tiny", aerial_views=6, street_views=2, width=48)
    assert cfg.data == tmp_path / expected.dirname and is_city_complete(cfg.data, expected)
    assert len(outputs.image_filenames) == 7 and int(outputs.cameras.width[0]) == 48


def test_lazy_datamanager_trains_with_bytesplat(tmp_path):
    """A few ns-train iterations (with eval of all images) of the `bytesplat-large` method entry (the
    lazy datamanager) on the tiny city: only a bounded number of decoded images is ever held. Its
    sharded twin `bytesplat-distributed-large` carries the same datamanager."""
    import copy

    from nerfstudio.configs.method_configs import all_methods

    from bytesplat_ns.data.lazy_images import LazyImageDatamanagerConfig
    from bytesplat_ns.distributed.pipeline import ShardedPipelineConfig

    sharded = all_methods["bytesplat-distributed-large"]
    assert isinstance(sharded.pipeline, ShardedPipelineConfig)
    assert isinstance(sharded.pipeline.datamanager, LazyImageDatamanagerConfig)
    cfg = copy.deepcopy(all_methods["bytesplat-large"])  # registered through the entry point
    assert cfg.method_name == "bytesplat-large" and isinstance(cfg.pipeline.datamanager, LazyImageDatamanagerConfig)
    cfg.pipeline.datamanager.lazy_cache_size = 4
    cfg.pipeline.datamanager.dataparser.scene_size = "city-tiny"
    cfg.pipeline.datamanager.dataparser.scene_cache_dir = tmp_path / "cache"
    cfg.max_num_iterations, cfg.steps_per_eval_image, cfg.steps_per_eval_all_images, cfg.steps_per_save = 6, 3, 5, 100
    cfg.vis, cfg.output_dir = "tensorboard", tmp_path / "out"
    cfg.machine.device_type = "cpu"
    cfg.set_timestamp()
    trainer = cfg.setup(local_rank=0, world_size=1)
    trainer.setup()
    trainer.train()
    dm = trainer.pipeline.datamanager
    assert len(dm.cached_train._cache) <= 4 and dm.cached_train.loads >= 4
    assert (cfg.get_checkpoint_dir()).is_dir()


def test_parallel_failure_propagates_and_resumes(tmp_path):
    """A view that cannot be written ends a parallel generation with its error (queued views are
    cancelled); after the cause is fixed, a rerun completes the scene."""
    spec = CitySpec(preset="tiny", aerial_views=20, street_views=4, width=32)
    out = tmp_path / "p"
    (out / "images" / "frame_00001.png").mkdir(parents=True)  # the worker's rename onto it fails
    with pytest.raises(OSError):
        generate_city(spec, out, progress=False, workers=2)
    assert not is_city_complete(out)
    (out / "images" / "frame_00001.png").rmdir()
    generate_city(spec, out, progress=False, workers=1)
    assert is_city_complete(out, spec)
