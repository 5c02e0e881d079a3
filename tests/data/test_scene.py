"""The built-in synthetic scene: determinism, content, nerfstudio compatibility, cache behaviour."""

from __future__ import annotations

import filecmp
import json
import os
import threading
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from bytesplat_ns.data import scene as scene_mod
from bytesplat_ns.data.scene import (
    MARKER_NAME,
    SceneSpec,
    build_scene,
    camera_poses,
    default_cache_dir,
    ensure_scene,
    generate_scene,
    intrinsics,
    is_complete,
    read_ply,
    render_view,
    shade_rays,
)
from bytesplat_ns.errors import BytesplatError

TINY = SceneSpec(size="small", num_views=10, width=40, height=30, num_points=300)


def _files(root: Path):
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())


@pytest.fixture(scope="module")
def small_scene(tmp_path_factory) -> Path:
    """The default ('small') scene, generated once for the content tests."""
    return ensure_scene(SceneSpec(), cache_dir=tmp_path_factory.mktemp("cache"))


# ---------------------------------------------------------------------------------------------- spec


def test_spec_presets_and_overrides():
    small = SceneSpec()
    assert (small.width, small.height, small.num_views) == (128, 96, 64)
    assert len(small.eval_indices()) == 8 and len(small.eval_indices()) + 56 == small.num_views
    assert (SceneSpec("medium").width, SceneSpec("medium").num_views) == (256, 100)
    assert (SceneSpec("large").width, SceneSpec("large").height, SceneSpec("large").num_views) == (800, 600, 200)
    assert SceneSpec(width=200).height == 150  # 4:3 kept
    assert SceneSpec(width=128, height=96) == small and SceneSpec(width=128, height=96).hash == small.hash
    assert SceneSpec(seed=1).hash != small.hash and SceneSpec(num_views=65).hash != small.hash
    with pytest.raises(BytesplatError, match="huge"):
        SceneSpec(size="huge")  # type: ignore[arg-type]
    with pytest.raises(BytesplatError, match="num_views"):
        SceneSpec(num_views=0)


def test_default_cache_dir_env(monkeypatch, tmp_path):
    monkeypatch.setenv("BYTESPLAT_CACHE", str(tmp_path))
    assert default_cache_dir() == tmp_path / "scenes"
    monkeypatch.delenv("BYTESPLAT_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_cache_dir() == tmp_path / "xdg" / "bytesplat_ns" / "scenes"


# ------------------------------------------------------------------------------------- determinism


def test_generation_is_byte_identical(tmp_path):
    a = generate_scene(TINY, tmp_path / "a", progress=False)
    b = generate_scene(TINY, tmp_path / "b", progress=False)
    files = _files(a)
    assert files == _files(b)
    assert "transforms.json" in files and "sparse_pc.ply" in files
    assert sum(f.startswith("images/") for f in files) == TINY.num_views
    match, mismatch, errors = filecmp.cmpfiles(a, b, files, shallow=False)
    assert mismatch == [] and errors == [] and len(match) == len(files)
    # A different seed is a different scene.
    c = generate_scene(SceneSpec(num_views=10, width=40, height=30, num_points=300, seed=3), tmp_path / "c")
    assert not filecmp.cmp(a / "images/frame_00000.png", c / "images/frame_00000.png", shallow=False)


# -------------------------------------------------------------------------------------------- content


def test_images_are_not_trivial(small_scene):
    meta = json.loads((small_scene / "transforms.json").read_text())
    assert len(meta["frames"]) == 64
    images = [np.asarray(Image.open(small_scene / f["file_path"])) for f in meta["frames"]]
    assert all(im.shape == (96, 128, 4) and im.dtype == np.uint8 for im in images)  # small: transparent sky
    for im in images:
        rgb, alpha = im[..., :3], im[..., 3]
        assert rgb[alpha > 0].astype(np.float64).std() > 20.0
        assert len(np.unique(rgb[alpha > 0], axis=0)) > 500  # textures and shading, not flat fills
        assert (alpha == 255).mean() > 0.6  # mostly geometry
    assert sum((im[..., 3] == 0).mean() > 0.2 for im in images) >= 10  # low views see the sky (transparent)
    # Views differ from each other.
    assert np.abs(images[0].astype(int) - images[1].astype(int)).mean() > 10


def test_sky_modes():
    """transparent: alpha is each pixel's sub-ray coverage and rgb the colour of the rays that hit;
    gradient: opaque, the sky blended in. Both agree wherever every sub-ray hits geometry."""
    assert SceneSpec().sky == "transparent" and SceneSpec("large").sky == "gradient"
    assert SceneSpec(sky="gradient").hash != SceneSpec().hash
    with pytest.raises(BytesplatError):
        SceneSpec(sky="cloudy")  # type: ignore[arg-type]
    clear, sky = SceneSpec(width=64, sky="transparent"), SceneSpec(width=64, sky="gradient")
    scene = build_scene(0)
    pose = camera_poses(clear, scene)[0]
    rgb_c, depth_c, alpha_c = render_view(scene, pose, clear)
    rgb_s, depth_s, alpha_s = render_view(scene, pose, sky)
    np.testing.assert_array_equal(alpha_c, alpha_s)
    np.testing.assert_array_equal(depth_c, depth_s)
    assert set(np.unique(alpha_c)) <= {k / 4 for k in range(5)}  # 2x2 sub-rays per pixel
    assert np.isinf(depth_c[alpha_c == 0]).all() and np.isfinite(depth_c[alpha_c > 0]).all()
    full = alpha_c == 1
    np.testing.assert_allclose(rgb_c[full], rgb_s[full], atol=1e-12)
    np.testing.assert_allclose(rgb_c[alpha_c == 0], rgb_s[alpha_c == 0], atol=1e-12)  # the sky's own colour
    # Edges: the gradient pixel is the coverage-weighted blend of the hit colour and the sky's.
    edge = (alpha_c > 0) & (alpha_c < 1)
    assert edge.any()
    sky_part = (rgb_s[edge] - alpha_c[edge, None] * rgb_c[edge]) / (1 - alpha_c[edge, None])
    assert np.abs(sky_part - rgb_c[alpha_c == 0].mean(axis=0)).mean() < 0.25  # near the sky's colours


def test_geometry_occludes_and_depth_varies():
    spec = SceneSpec()
    scene = build_scene(spec.seed)
    poses = camera_poses(spec, scene)
    for i in (0, 20, 40, 63):
        rgb, depth, _ = render_view(scene, poses[i], spec, supersample=1)
        finite = np.isfinite(depth)
        assert 0.3 < finite.mean() <= 1.0  # mostly geometry, maybe some sky
        d = depth[finite]
        assert d.max() / d.min() > 1.5 and d.std() / d.mean() > 0.08  # a real depth range, not a wall
        # Occlusion boundaries: neighbouring pixels (both on geometry) whose depth jumps by >15%.
        a, b = depth[:, 1:], depth[:, :-1]
        both = np.isfinite(a) & np.isfinite(b)
        jumps = np.abs(a[both] - b[both]) / np.minimum(a[both], b[both]) > 0.15
        assert jumps.mean() > 0.003
    # An object hides the ground behind it: a ray from a camera through a sphere's centre hits the sphere
    # first, although it would reach the ground further on.
    sphere = next(o for o in scene.objects if o.kind == "sphere")
    origin = poses[0, :3, 3]
    d = (sphere.center - origin) / np.linalg.norm(sphere.center - origin)
    _, t, ids = shade_rays(scene, origin, d[None])
    assert ids[0] >= 1  # an object, not the ground
    assert t[0] < np.linalg.norm(sphere.center - origin) < -origin[2] / d[2]  # ground lies further on


def test_cameras_follow_nerfstudio_convention(small_scene):
    meta = json.loads((small_scene / "transforms.json").read_text())
    scene = build_scene(0)
    for f in meta["frames"]:
        c2w = np.asarray(f["transform_matrix"])
        R, pos = c2w[:3, :3], c2w[:3, 3]
        assert np.allclose(R.T @ R, np.eye(3), atol=1e-8) and np.isclose(np.linalg.det(R), 1.0)
        assert np.allclose(c2w[3], [0, 0, 0, 1])
        look = (scene.look_at - pos) / np.linalg.norm(scene.look_at - pos)
        assert look @ -R[:, 2] > 0.99  # camera looks along its -z at the centre
        assert R[2, 1] > 0  # image up points to world up (+z)
        assert pos[2] > 0.5


def test_seed_points_project_onto_matching_pixels(small_scene):
    """Seed points, projected with the written poses and intrinsics, land on pixels of the written
    images at the depth and colour they were sampled with (checks poses, intrinsics, y flip)."""
    meta = json.loads((small_scene / "transforms.json").read_text())
    xyz, rgb = read_ply(small_scene / meta["ply_file_path"])
    assert xyz.shape == (4000, 3) and rgb is not None and rgb.shape == (4000, 3)
    spec = SceneSpec()
    scene = build_scene(0)
    fx, fy, cx, cy = meta["fl_x"], meta["fl_y"], meta["cx"], meta["cy"]
    frame = meta["frames"][5]
    c2w = np.asarray(frame["transform_matrix"])
    image = np.asarray(Image.open(small_scene / frame["file_path"])).astype(np.float64)[..., :3]
    _, depth, _ = render_view(scene, c2w, spec, supersample=1)
    cam = (xyz - c2w[:3, 3]) @ c2w[:3, :3]  # world -> camera (OpenGL: x right, y up, -z forward)
    z = -cam[:, 2]
    u = fx * cam[:, 0] / z + cx
    v = -fy * cam[:, 1] / z + cy
    inside = (z > 0) & (u >= 0) & (u < spec.width) & (v >= 0) & (v < spec.height)
    assert inside.sum() > 1000
    ui, vi = u[inside].astype(int), v[inside].astype(int)
    rel = (depth[vi, ui] - z[inside]) / z[inside]
    visible = np.abs(rel) < 0.03
    # Points were seen from other views: many are hidden here (something in front, rel < 0), but a
    # correct camera model never sees *through* a surface point (rel > 0), up to edges and noise.
    assert visible.mean() > 0.35
    assert (rel > 0.03).mean() < 0.08
    colour_err = np.abs(image[vi, ui] - rgb[inside].astype(np.float64)).mean(axis=1)[visible]
    assert np.median(colour_err) < 25.0
    # Points lie on the surfaces (ground at z = 0, objects above), with a little noise.
    assert xyz[:, 2].min() > -0.06


# --------------------------------------------------------------------------------- nerfstudio parsing


def test_nerfstudio_parser_reads_scene(small_scene):
    from nerfstudio.data.dataparsers.nerfstudio_dataparser import NerfstudioDataParserConfig

    parser = NerfstudioDataParserConfig(data=small_scene, load_3D_points=False).setup()
    train = parser.get_dataparser_outputs("train")
    val = parser.get_dataparser_outputs("val")
    test = parser.get_dataparser_outputs("test")
    assert (len(train.image_filenames), len(val.image_filenames), len(test.image_filenames)) == (56, 8, 8)
    assert set(map(str, val.image_filenames)).isdisjoint(map(str, train.image_filenames))
    assert int(train.cameras.width[0]) == 128 and int(train.cameras.height[0]) == 96
    fx, _, _, _ = intrinsics(SceneSpec())
    assert float(train.cameras.fx[0]) == pytest.approx(fx)
    assert all(Path(p).is_file() for p in train.image_filenames)

    # nerfstudio's own point loader needs open3d, which needs the system libusb: use it where it works.
    try:
        import open3d  # noqa: F401
    except (ImportError, OSError):
        pass
    else:
        parser = NerfstudioDataParserConfig(data=small_scene, load_3D_points=True).setup()
        out = parser.get_dataparser_outputs("train")
        assert out.metadata["points3D_xyz"].shape == (4000, 3)


def test_bytesplat_parser_reads_scene_with_points(small_scene):
    from nerfstudio.data.dataparsers.nerfstudio_dataparser import NerfstudioDataParserConfig

    from bytesplat_ns.data.dataparser import BytesplatSceneDataParserConfig

    out = BytesplatSceneDataParserConfig(data=small_scene).setup().get_dataparser_outputs("train")
    pts, cols = out.metadata["points3D_xyz"], out.metadata["points3D_rgb"]
    assert pts.shape == (4000, 3) and cols.shape == (4000, 3) and str(cols.dtype) == "torch.uint8"
    # Same poses as nerfstudio's parser; points in the same (oriented, centred, scaled) frame as cameras.
    ref = NerfstudioDataParserConfig(data=small_scene, load_3D_points=False).setup().get_dataparser_outputs("train")
    assert np.allclose(out.cameras.camera_to_worlds.numpy(), ref.cameras.camera_to_worlds.numpy())
    xyz, rgb = read_ply(small_scene / "sparse_pc.ply")
    T = out.dataparser_transform.numpy()
    expect = (np.c_[xyz, np.ones(len(xyz))] @ T.T) * out.dataparser_scale
    assert np.allclose(pts.numpy(), expect, atol=1e-4)
    assert np.array_equal(cols.numpy(), rgb)


def test_builtin_scene_without_data(tmp_path):
    from bytesplat_ns.data.dataparser import BytesplatSceneDataParserConfig

    config = BytesplatSceneDataParserConfig(num_views=10, width=40, height=30, scene_cache_dir=tmp_path)
    assert config.data is None
    parser = config.setup()
    train = parser.get_dataparser_outputs("train")
    val = parser.get_dataparser_outputs("val")
    assert (len(train.image_filenames), len(val.image_filenames)) == (9, 1)
    assert config.data is not None and config.data.parent == tmp_path and is_complete(config.data)
    assert train.metadata["points3D_xyz"].shape == (SceneSpec().num_points, 3)


# -------------------------------------------------------------------------------------------- cache


@pytest.fixture
def counted_generation(monkeypatch):
    calls = []
    real = scene_mod.generate_scene

    def counting(spec, out_dir, progress=True, workers=None):
        calls.append(spec)
        return real(spec, out_dir, progress=False, workers=workers)

    monkeypatch.setattr(scene_mod, "generate_scene", counting)
    return calls


def test_cache_reuse_and_repair(tmp_path, counted_generation):
    first = ensure_scene(TINY, cache_dir=tmp_path)
    assert len(counted_generation) == 1 and is_complete(first, TINY)
    assert first == tmp_path / TINY.dirname
    before = {f: (first / f).stat().st_mtime_ns for f in _files(first)}

    assert ensure_scene(TINY, cache_dir=tmp_path) == first
    assert len(counted_generation) == 1  # reused, not regenerated
    assert {f: (first / f).stat().st_mtime_ns for f in _files(first)} == before

    reference = tmp_path / "reference"
    generate_scene(TINY, reference, progress=False)  # the real one, not counted

    # A deleted image: regenerated, identical to a fresh generation.
    (first / "images/frame_00003.png").unlink()
    assert not is_complete(first, TINY)
    assert ensure_scene(TINY, cache_dir=tmp_path) == first
    assert len(counted_generation) == 2 and is_complete(first, TINY)
    assert filecmp.cmp(first / "images/frame_00003.png", reference / "images/frame_00003.png", shallow=False)

    # A truncated file (e.g. disk full during an old run) is caught by the recorded sizes.
    ply = first / "sparse_pc.ply"
    ply.write_bytes(ply.read_bytes()[:100])
    ensure_scene(TINY, cache_dir=tmp_path)
    assert len(counted_generation) == 3 and filecmp.cmp(ply, reference / "sparse_pc.ply", shallow=False)

    # A directory without marker (interrupted copy, older version) is replaced.
    (first / MARKER_NAME).unlink()
    ensure_scene(TINY, cache_dir=tmp_path)
    assert len(counted_generation) == 4 and is_complete(first, TINY)

    # Leftover temporary directories of killed runs are cleaned up; nothing else is left beside the scene.
    (tmp_path / f".{TINY.dirname}.tmp-dead").mkdir()
    (first / MARKER_NAME).unlink()
    ensure_scene(TINY, cache_dir=tmp_path)
    leftovers = [p.name for p in tmp_path.iterdir() if p.name not in (TINY.dirname, "reference")]
    assert leftovers == [f".{TINY.dirname}.lock"]


def test_failed_generation_leaves_no_scene(tmp_path, monkeypatch):
    def broken(spec, out_dir, progress=True, workers=None):
        (Path(out_dir) / "transforms.json").write_text("{}")
        raise KeyboardInterrupt  # e.g. Ctrl-C half way

    monkeypatch.setattr(scene_mod, "generate_scene", broken)
    with pytest.raises(KeyboardInterrupt):
        ensure_scene(TINY, cache_dir=tmp_path)
    assert not (tmp_path / TINY.dirname).exists()
    assert [p.name for p in tmp_path.iterdir()] == [f".{TINY.dirname}.lock"]


def test_concurrent_callers_generate_once(tmp_path, counted_generation):
    results, errors = [], []

    def call():
        try:
            results.append(ensure_scene(TINY, cache_dir=tmp_path))
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=call) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and len(set(results)) == 1 and len(counted_generation) == 1


def test_unwritable_cache_is_a_clear_error(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(BytesplatError, match="cache directory"):
        ensure_scene(TINY, cache_dir=blocker / "scenes")


@pytest.mark.skipif(os.name != "posix", reason="POSIX paths")
def test_ensure_scene_defaults_to_env_cache(tmp_path, monkeypatch, counted_generation):
    monkeypatch.setenv("BYTESPLAT_CACHE", str(tmp_path))
    path = ensure_scene(TINY)
    assert path == tmp_path / "scenes" / TINY.dirname and is_complete(path, TINY)


@pytest.mark.parametrize("make, what", [(SceneSpec, "Built-in scene"), (lambda **kw: _city_spec(**kw), "City scene")])
def test_both_generators_check_their_views_seed_and_camera_alike(make, what):
    with pytest.raises(BytesplatError, match=f"^{what} seed must be an integer, got True"):
        make(seed=True)
    with pytest.raises(BytesplatError, match=f"^Invalid {what[0].lower() + what[1:]} spec: .*fov_deg=200"):
        make(fov_deg=200.0)
    with pytest.raises(BytesplatError, match="supersample=0"):
        make(supersample=0)
    with pytest.raises(BytesplatError, match=f"^{what} width must be a positive integer, got 0"):
        make(width=0)
    spec = make(seed=np.int64(3), eval_every=0, fov_deg=50)
    assert (type(spec.seed), spec.seed, spec.eval_indices(), type(spec.fov_deg)) == (int, 3, [], float)
    assert make(eval_every=3).eval_indices()[:3] == [1, 4, 7]


def _city_spec(**kw):
    from bytesplat_ns.data.city import CitySpec

    return CitySpec(preset="tiny", **kw)
