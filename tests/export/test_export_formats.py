"""bytesplat-export's writers, frames and SH rotation on synthetic Gaussians (no trained run needed).

Each format is read back by a reader that is not its writer: plyfile and gsply for the 3DGS PLY, decoders
of the published layouts (tests/helpers/export_splats.py) for compressed PLY, SPZ and .splat, gsply's SOG reader
for SOG; every field must equal the input within that format's quantisation, SH in its right order.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from bytesplat_ns.errors import BytesplatError
from bytesplat_ns.export import antimatter_splat, gsply_formats, ply, sog
from bytesplat_ns.export.frames import Similarity, Z_UP_TO_Y_UP, quat_multiply, transform_splats
from bytesplat_ns.export.sh_rotation import band_rotations, rotate_sh
from bytesplat_ns.export.splats import SH_C0
from bytesplat_ns.raster.reference import rasterize_reference
from bytesplat_ns.raster.sh import eval_sh
from tests.helpers.export_splats import (
    quat_distance, read_compressed_ply, read_splat, read_spz, sigmoid, synthetic_splats,
)

INRIA_FIELDS = (
    ["x", "y", "z", "nx", "ny", "nz", "f_dc_0", "f_dc_1", "f_dc_2"]
    + [f"f_rest_{i}" for i in range(45)]
    + ["opacity", "scale_0", "scale_1", "scale_2", "rot_0", "rot_1", "rot_2", "rot_3"]
)


def random_rotation(seed: int) -> np.ndarray:
    q, r = np.linalg.qr(np.random.default_rng(seed).normal(size=(3, 3)))
    q = q * np.sign(np.diag(r))
    return q if np.linalg.det(q) > 0 else -q


def quat_to_matrix(q: np.ndarray) -> np.ndarray:
    w, x, y, z = (q / np.linalg.norm(q, axis=-1, keepdims=True)).T
    return np.stack([
        1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y),
        2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x),
        2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y),
    ], axis=-1).reshape(-1, 3, 3)


def test_synthetic_sh_is_distinct_per_coefficient_and_channel():
    s = synthetic_splats()
    means = s.sh_rest.mean(axis=0).reshape(-1)
    assert np.abs(means).min() > 0.04 and np.diff(np.sort(means)).min() > 0.005


# --- 3DGS PLY -----------------------------------------------------------------------------------------------

def test_ply_has_the_inria_layout_and_reads_back_bit_exact(tmp_path):
    from plyfile import PlyData
    import gsply

    s = synthetic_splats()
    path = tmp_path / "s.ply"
    ply.write_ply(path, s, vertical_axis="z")
    vertex = PlyData.read(str(path))["vertex"].data
    assert list(vertex.dtype.names) == INRIA_FIELDS
    assert all(vertex.dtype[name] == np.dtype("<f4") for name in INRIA_FIELDS)
    np.testing.assert_array_equal(np.stack([vertex[a] for a in "xyz"], 1), s.means)
    np.testing.assert_array_equal(np.stack([vertex[f"scale_{i}"] for i in range(3)], 1), s.log_scales)
    np.testing.assert_array_equal(np.stack([vertex[f"rot_{i}"] for i in range(4)], 1), s.quats)
    np.testing.assert_array_equal(vertex["opacity"], s.logit_opacities)
    np.testing.assert_array_equal(np.stack([vertex[f"f_dc_{i}"] for i in range(3)], 1), s.sh0)
    for k in range(15):
        for c in range(3):  # channel-major: all 15 red coefficients, then green, then blue
            np.testing.assert_array_equal(vertex[f"f_rest_{c * 15 + k}"], s.sh_rest[:, k, c])
    back = gsply.plyread(str(path))
    np.testing.assert_array_equal(back.shN, s.sh_rest)
    np.testing.assert_array_equal(back.quats, s.quats)


def test_lower_sh_degree_keeps_the_first_bands(tmp_path):
    from plyfile import PlyData

    s = synthetic_splats().with_sh_degree(1)
    ply.write_ply(tmp_path / "s.ply", s, vertical_axis="z")
    vertex = PlyData.read(str(tmp_path / "s.ply"))["vertex"].data
    rest = [n for n in vertex.dtype.names if n.startswith("f_rest_")]
    assert rest == [f"f_rest_{i}" for i in range(9)]
    np.testing.assert_array_equal(vertex["f_rest_4"], synthetic_splats().sh_rest[:, 1, 1])
    with pytest.raises(BytesplatError, match="SH degree 2 asked for, but the model has degree 1"):
        s.with_sh_degree(2)


# --- compressed PLY (gsply's writer) ------------------------------------------------------------------------

def test_compressed_ply_reads_back_within_its_quantisation(tmp_path):
    import gsply

    s = synthetic_splats()
    path = tmp_path / "s.compressed.ply"
    gsply_formats.write_compressed_ply(path, s)
    back = read_compressed_ply(path)
    span = s.means.max(0) - s.means.min(0)
    assert (np.abs(back["means"] - s.means) <= span / 2047 + 1e-6).all()  # 11/10/11 bits inside a chunk
    assert np.abs(back["log_scales"] - s.log_scales).max() < 3.5 / 1023
    assert np.abs(back["colors"] - 0.5 - SH_C0 * s.sh0).max() < 1.0 / 255  # compressed PLY stores colours
    assert np.abs(back["opacities"] - s.opacities()).max() <= 0.5 / 255 + 1e-6
    assert quat_distance(back["quats"], s.quats).max() < 2.0 / 1023
    assert np.abs(back["sh_rest"] - s.sh_rest).max() <= 4.0 / 256 + 1e-6  # 8 bits over [-4, 4]
    assert np.abs(gsply.plyread(str(path)).shN - s.sh_rest).max() <= 4.0 / 256 + 1e-6


# --- SPZ (gsply's writer) -----------------------------------------------------------------------------------

def test_spz_reads_back_within_its_quantisation(tmp_path):
    s = synthetic_splats()
    path = tmp_path / "s.spz"
    gsply_formats.write_spz(path, s)
    back = read_spz(path)
    assert np.abs(back["means"] - s.means).max() <= 0.5 / 4096 + 1e-6  # 12 fractional bits
    assert np.abs(back["log_scales"] - s.log_scales).max() <= 0.5 / 16 + 1e-6
    assert np.abs(back["sh0"] - s.sh0).max() <= 0.5 / 255 / 0.15 + 1e-6
    assert np.abs(back["opacities"] - s.opacities()).max() <= 0.5 / 255 + 1e-6
    assert quat_distance(back["quats"], s.quats).max() < 2.0 / 511
    assert np.abs(back["sh_rest"] - s.sh_rest).max() <= 0.5 / 128 + 1e-6


# --- antimatter15 .splat (ours) -----------------------------------------------------------------------------

def test_splat_reads_back_within_its_quantisation(tmp_path):
    s = synthetic_splats()
    path = tmp_path / "s.splat"
    antimatter_splat.write_splat(path, s)
    back = read_splat(path)
    assert len(back["means"]) == len(s)
    # rows are sorted by importance: match them by position, which the format stores exactly
    order = [int(np.flatnonzero((s.means == row).all(axis=1))[0]) for row in back["means"]]
    assert sorted(order) == list(range(len(s)))
    importance = np.exp(s.log_scales.astype(np.float64).sum(1)) * sigmoid(s.logit_opacities)
    assert (np.diff(importance[order]) <= 0).all()
    np.testing.assert_allclose(back["scales"], np.exp(s.log_scales[order]), rtol=1e-6)
    assert np.abs(back["rgba"][:, :3] - s.colors()[order]).max() <= 0.5 / 255 + 1e-6
    assert np.abs(back["rgba"][:, 3] - s.opacities()[order]).max() <= 0.5 / 255 + 1e-6
    assert quat_distance(back["quats"], s.quats[order]).max() < 1.5 / 128


# --- SOG (ours) ---------------------------------------------------------------------------------------------

def nearest_entry_error(values: np.ndarray, codebook) -> np.ndarray:
    book = np.asarray(codebook, dtype=np.float64)
    return np.abs(values.reshape(-1, 1).astype(np.float64) - book[None]).min(axis=1).reshape(values.shape)


@pytest.mark.parametrize("degree", [3, 1, 0])
def test_sog_reads_back_within_its_quantisation(tmp_path, degree):
    pytest.importorskip("imagecodecs", reason="gsply's SOG reader decodes WebP with imagecodecs")
    import json
    import zipfile

    from gsply.sog_reader import sogread

    s = synthetic_splats().with_sh_degree(degree)
    path = tmp_path / "s.sog"
    sog.write_sog(path, s)
    meta = json.loads(zipfile.ZipFile(path).read("meta.json"))
    back = sogread(str(path))
    assert len(back) == len(s) == meta["count"]
    logged = np.sign(s.means) * np.log1p(np.abs(s.means))
    step = (logged.max(0) - logged.min(0)) / 65535
    assert (np.abs(back.means - s.means) <= (0.51 * step + 1e-7) * np.exp(np.abs(logged))).all()
    assert quat_distance(back.quats, s.quats).max() < 2.0 * math.sqrt(2) / 255
    assert np.abs(sigmoid(back.opacities) - s.opacities()).max() <= 0.5 / 255 + 1e-6
    # a codebook format: each value decodes to the codebook entry nearest to it
    np.testing.assert_allclose(np.abs(back.scales - s.log_scales),
                               nearest_entry_error(s.log_scales, meta["scales"]["codebook"]), atol=1e-6)
    np.testing.assert_allclose(np.abs(back.sh0 - s.sh0), nearest_entry_error(s.sh0, meta["sh0"]["codebook"]),
                               atol=1e-6)
    assert back.shN.shape == s.sh_rest.shape
    if degree:
        assert meta["shN"]["bands"] == degree
        np.testing.assert_allclose(np.abs(back.shN - s.sh_rest),
                                   nearest_entry_error(s.sh_rest, meta["shN"]["codebook"]), atol=1e-6)


def test_sog_palette_is_a_kmeans_beyond_64k_gaussians(monkeypatch):
    monkeypatch.setattr(sog, "MAX_PALETTE", 16)
    s = synthetic_splats(n=200, sh_degree=1)
    palette, labels = sog._palette(s.sh_rest.reshape(len(s), -1))
    assert palette.shape == (16, 9) and labels.min() >= 0 and labels.max() < 16
    residual = np.linalg.norm(s.sh_rest.reshape(len(s), -1) - palette[labels], axis=1).mean()
    spread = np.linalg.norm(s.sh_rest.reshape(len(s), -1) - s.sh_rest.reshape(len(s), -1).mean(0), axis=1).mean()
    assert residual < 0.9 * spread


# --- SH rotation and frame changes --------------------------------------------------------------------------

def test_sh_band_rotations_are_orthogonal_and_compose():
    r1, r2 = random_rotation(1), random_rotation(2)
    for m1, m2, m12 in zip(band_rotations(r1, 3), band_rotations(r2, 3), band_rotations(r2 @ r1, 3)):
        np.testing.assert_allclose(m1 @ m1.T, np.eye(len(m1)), atol=1e-10)
        np.testing.assert_allclose(m2 @ m1, m12, atol=1e-10)  # rotating by r1 then r2 = rotating by r2 r1


def test_rotated_splat_has_the_original_colour_in_the_rotated_direction():
    s = synthetic_splats(n=20)
    rotation = random_rotation(3)
    rotated = rotate_sh(s.sh_rest, rotation)
    dirs = np.random.default_rng(4).normal(size=(20, 3))

    def colour(sh_rest, d):
        coeffs = torch.from_numpy(np.concatenate([s.sh0[:, None], sh_rest], axis=1).astype(np.float64))
        return eval_sh(3, torch.from_numpy(d), coeffs).numpy()

    np.testing.assert_allclose(colour(rotated, dirs @ rotation.T), colour(s.sh_rest, dirs), atol=1e-6)  # float32 SH
    # and it is a real change: in the unrotated direction the colour differs
    assert np.abs(colour(rotated, dirs) - colour(s.sh_rest, dirs)).max() > 0.05


def test_transform_moves_means_rotates_quats_and_scales_log_scales():
    s = synthetic_splats(n=50)
    rotation, scale, offset = random_rotation(5), 2.5, np.array([0.3, -1.0, 4.0])
    out = transform_splats(s, Similarity(rotation, scale, offset))
    np.testing.assert_allclose(out.means, scale * s.means @ rotation.T + offset, atol=1e-5)
    np.testing.assert_allclose(out.log_scales, s.log_scales + math.log(scale), atol=1e-6)
    np.testing.assert_allclose(quat_to_matrix(out.quats), rotation @ quat_to_matrix(s.quats), atol=1e-6)
    np.testing.assert_array_equal(out.logit_opacities, s.logit_opacities)


def test_y_up_turns_z_up_into_y_up():
    np.testing.assert_allclose(Z_UP_TO_Y_UP @ [0, 0, 1], [0, 1, 0])
    assert np.linalg.det(Z_UP_TO_Y_UP) == pytest.approx(1.0)
    np.testing.assert_allclose(quat_multiply(np.array([1.0, 0, 0, 0]), np.eye(4)), np.eye(4))


def render(splats, viewmat: np.ndarray, size=64) -> np.ndarray:
    t = lambda a: torch.from_numpy(np.ascontiguousarray(a)).float()  # noqa: E731
    coeffs = np.concatenate([splats.sh0[:, None], splats.sh_rest], axis=1)
    K = torch.tensor([[[60.0, 0, size / 2], [0, 60.0, size / 2], [0, 0, 1]]])
    img, _, _ = rasterize_reference(
        t(splats.means), t(splats.quats), t(np.exp(splats.log_scales)), t(sigmoid(splats.logit_opacities)),
        t(coeffs), t(viewmat)[None], K, size, size, sh_degree=splats.sh_degree,
    )
    return img[0].numpy()


def test_a_frame_change_renders_the_same_image_from_the_moved_camera():
    """The whole splat (means, quats, scales, SH) moves with the frame: the scene in the new frame, seen from
    the camera moved with it, is the same image (a similarity changes nothing a perspective camera sees)."""
    s = synthetic_splats(n=120)
    s = type(s)(s.means * 0.7, s.log_scales + 1.0, s.quats, s.logit_opacities, s.sh0, s.sh_rest * 3)
    view = np.eye(4)
    view[:3, 3] = [0.0, 0.0, 4.0]  # world -> camera (OpenCV), looking at the splats from 4 units away
    rotation, scale, offset = random_rotation(6), 2.5, np.array([1.0, -2.0, 0.5])
    moved = transform_splats(s, Similarity(rotation, scale, offset))
    moved_view = np.eye(4)
    moved_view[:3, :3] = view[:3, :3] @ rotation.T
    moved_view[:3, 3] = scale * view[:3, 3] - view[:3, :3] @ rotation.T @ offset
    before, after = render(s, view), render(moved, moved_view)
    assert before.std() > 0.05  # a non-trivial image
    np.testing.assert_allclose(after, before, atol=2e-3)
    # without the SH rotation the colours would be wrong
    unrotated = type(moved)(moved.means, moved.log_scales, moved.quats, moved.logit_opacities, moved.sh0, s.sh_rest)
    assert np.abs(render(unrotated, moved_view) - before).max() > 0.05


def test_a_degree_0_models_rgb_logits_become_the_sh_dc_that_gives_its_colour():
    from types import SimpleNamespace

    from bytesplat_ns.export.splats import splats_from_model

    n = 10
    logits = torch.linspace(-3, 3, n * 3).reshape(n, 3)
    params = {"means": torch.zeros(n, 3), "scales": torch.zeros(n, 3), "quats": torch.tensor([[-2.0, 0, 0, 0]] * n),
              "opacities": torch.zeros(n, 1), "features_dc": logits, "features_rest": torch.zeros(n, 15, 3)}
    model = SimpleNamespace(gauss_params=params, config=SimpleNamespace(sh_degree=0))
    s = splats_from_model(model)
    assert s.sh_degree == 0
    np.testing.assert_allclose(s.colors(), torch.sigmoid(logits).numpy(), atol=1e-6)
    np.testing.assert_allclose(s.quats, [[1, 0, 0, 0]] * n)  # unit length, w >= 0 (the same rotation)
