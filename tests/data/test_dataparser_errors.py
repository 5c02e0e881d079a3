"""Bad input to the dataparser ends in one BytesplatError naming the problem, before nerfstudio crashes."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Callable

import pytest
from PIL import Image

from bytesplat_ns.data.dataparser import BytesplatSceneDataParserConfig, bytesplat_scene_dataparser
from bytesplat_ns.data.scene import SceneSpec, generate_scene
from bytesplat_ns.errors import BytesplatError

SPEC = SceneSpec(num_views=10, width=32, height=24, num_points=200)  # 9 train + 1 eval views


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> Path:
    return generate_scene(SPEC, tmp_path_factory.mktemp("pristine") / "scene", progress=False)


@pytest.fixture
def dataset(pristine, tmp_path) -> Path:
    """A fresh, valid copy of a small nerfstudio-format dataset for each test to break."""
    return Path(shutil.copytree(pristine, tmp_path / "scene"))


def parse(data, split="train", **kwargs):
    return BytesplatSceneDataParserConfig(data=data, **kwargs).setup().get_dataparser_outputs(split)


def edit(dataset: Path, change: Callable[[dict], None]) -> None:
    path = dataset / "transforms.json"
    meta = json.loads(path.read_text())
    change(meta)
    path.write_text(json.dumps(meta))


def expect_error(data, *fragments: str, **kwargs) -> BytesplatError:
    with pytest.raises(BytesplatError) as info:
        parse(data, **kwargs)
    err = info.value
    assert "\n" not in err.message, "the message is one line"
    for fragment in fragments:
        assert fragment in err.message, f"{fragment!r} not in {err.message!r}"
    return err


# ------------------------------------------------------------------------------------------- valid


def test_valid_dataset_parses(dataset):
    train = parse(dataset)
    assert len(train.image_filenames) == 9 and train.metadata["points3D_xyz"].shape == (200, 3)
    assert len(parse(dataset, "val").image_filenames) == 1
    # transforms.json given as a file works the same.
    assert len(parse(dataset / "transforms.json").image_filenames) == 9


def test_registered_specification():
    assert isinstance(bytesplat_scene_dataparser.config, BytesplatSceneDataParserConfig)
    assert bytesplat_scene_dataparser.config.data is None and bytesplat_scene_dataparser.config.load_3D_points
    from nerfstudio.plugins.registry_dataparser import discover_dataparsers

    configs, descriptions = discover_dataparsers()
    assert isinstance(configs["bytesplat-scene"], BytesplatSceneDataParserConfig)
    assert descriptions["bytesplat-scene"]


def test_error_str_has_hint():
    err = BytesplatError("Thing is broken\n  badly", hint="fix it")
    assert err.message == "Thing is broken badly" and str(err) == "Thing is broken badly\n  hint: fix it"
    assert str(BytesplatError("plain")) == "plain"


# ---------------------------------------------------------------------------------------- location


def test_missing_path(tmp_path):
    err = expect_error(tmp_path / "nope", "does not exist", "nope")
    assert "built-in" in (err.hint or "")


def test_no_transforms_json(tmp_path):
    (tmp_path / "images").mkdir()
    expect_error(tmp_path, "No transforms.json", str(tmp_path))


def test_colmap_directory_gets_a_hint(tmp_path):
    (tmp_path / "sparse" / "0").mkdir(parents=True)
    err = expect_error(tmp_path, "No transforms.json")
    assert "colmap" in (err.hint or "")


def test_the_trainer_checks_each_dataparsers_inputs_before_anything_is_written(dataset, tmp_path):
    """``check_data_inputs`` (what the trainer config runs before ns-train writes config.yml): the --data path for
    any dataparser, transforms.json for nerfstudio-data and bytesplat-scene, the sparse model and images folder for
    colmap (nerfstudio's parsers stop at these with a traceback); valid inputs and no --data pass."""
    from nerfstudio.data.datamanagers.full_images_datamanager import FullImageDatamanagerConfig
    from nerfstudio.data.dataparsers.colmap_dataparser import ColmapDataParserConfig
    from nerfstudio.data.dataparsers.nerfstudio_dataparser import NerfstudioDataParserConfig

    from bytesplat_ns.data.dataparser import check_data_inputs

    def check(dataparser, data):
        check_data_inputs(FullImageDatamanagerConfig(dataparser=dataparser, data=data))

    empty = tmp_path / "empty"
    empty.mkdir()
    for dataparser in (NerfstudioDataParserConfig(), BytesplatSceneDataParserConfig(), ColmapDataParserConfig()):
        with pytest.raises(BytesplatError, match="does not exist"):
            check(dataparser, tmp_path / "nowhere")
    for dataparser in (NerfstudioDataParserConfig(), BytesplatSceneDataParserConfig()):
        with pytest.raises(BytesplatError, match="No transforms.json"):
            check(dataparser, empty)
        check(dataparser, dataset)
        check(dataparser, dataset / "transforms.json")
    check(BytesplatSceneDataParserConfig(), None)  # the built-in scene
    with pytest.raises(BytesplatError, match="No COLMAP model") as err:
        check(ColmapDataParserConfig(), dataset)
    assert "nerfstudio-data" in err.value.hint
    with pytest.raises(BytesplatError, match="takes the dataset folder") as err:
        check(ColmapDataParserConfig(), dataset / "transforms.json")
    assert "nerfstudio-data" in err.value.hint
    (empty / "colmap" / "sparse" / "0").mkdir(parents=True)
    with pytest.raises(BytesplatError, match="No images folder"):
        check(ColmapDataParserConfig(), empty)
    (empty / "images").mkdir()
    check(ColmapDataParserConfig(), empty)
    (empty / "model").mkdir()
    check(ColmapDataParserConfig(colmap_path=Path("model")), empty)
    check(ColmapDataParserConfig(data=empty), None)  # the dataparser's own --data


def test_data_file_that_is_not_json(dataset):
    expect_error(dataset / "sparse_pc.ply", "not a .json file")


# ----------------------------------------------------------------------------------- transforms.json


def test_invalid_json_names_line_and_column(dataset):
    (dataset / "transforms.json").write_text('{\n  "frames": [\n    {"file_path": "a.png",, }\n  ]\n}\n')
    expect_error(dataset, "not valid JSON", "line 3 column", "transforms.json")


def test_json_not_an_object(dataset):
    (dataset / "transforms.json").write_text("[1, 2]")
    expect_error(dataset, "JSON object", "list")


def test_missing_frames(dataset):
    edit(dataset, lambda m: m.pop("frames"))
    expect_error(dataset, "'frames'")


def test_empty_frames(dataset):
    edit(dataset, lambda m: m.update(frames=[]))
    expect_error(dataset, "'frames'", "non-empty")


def test_frame_missing_file_path(dataset):
    edit(dataset, lambda m: m["frames"][1].pop("file_path"))
    expect_error(dataset, "frame 1", "'file_path'")


def test_frame_missing_transform_matrix(dataset):
    edit(dataset, lambda m: m["frames"][2].pop("transform_matrix"))
    expect_error(dataset, "frame 2", "frame_00002.png", "'transform_matrix'")


def test_transform_matrix_not_4x4(dataset):
    edit(dataset, lambda m: m["frames"][3].update(transform_matrix=m["frames"][3]["transform_matrix"][:3]))
    expect_error(dataset, "frame 3", "4x4", "3x4")


def test_transform_matrix_not_numbers(dataset):
    edit(dataset, lambda m: m["frames"][0].update(transform_matrix=[["a", 0, 0, 0]] * 4))
    expect_error(dataset, "frame 0", "4x4")


def test_transform_matrix_nan(dataset):
    edit(dataset, lambda m: m["frames"][4]["transform_matrix"][0].__setitem__(3, float("nan")))
    expect_error(dataset, "frame 4", "non-finite")


def test_missing_intrinsics(dataset):
    edit(dataset, lambda m: m.pop("fl_x"))
    expect_error(dataset, "'fl_x'", "frame 0")


def test_per_frame_intrinsics_missing_in_one_frame(dataset):
    def per_frame(m):
        for f in m["frames"]:
            f["fl_y"] = m["fl_y"]
        m.pop("fl_y")
        m["frames"][6].pop("fl_y")

    edit(dataset, per_frame)
    expect_error(dataset, "'fl_y'", "frame 6")


def test_bad_intrinsic_value(dataset):
    edit(dataset, lambda m: m.update(w="wide"))
    expect_error(dataset, "'w'", "number")


def test_unknown_camera_model(dataset):
    edit(dataset, lambda m: m.update(camera_model="FISHEYE_XYZ"))
    expect_error(dataset, "camera_model", "FISHEYE_XYZ")


def test_split_list_with_unknown_file(dataset):
    edit(dataset, lambda m: m["val_filenames"].append("images/ghost.png"))
    expect_error(dataset, "'val_filenames'", "ghost.png")


def test_split_lists_incomplete(dataset):
    edit(dataset, lambda m: (m.pop("val_filenames"), m.pop("test_filenames")))
    assert len(parse(dataset).image_filenames) == 9  # train still fine
    expect_error(dataset, "'val_filenames'", split="val")


# --------------------------------------------------------------------------------------------- files


def test_missing_image_file(dataset):
    (dataset / "images" / "frame_00007.png").unlink()
    expect_error(dataset, "frame_00007.png", "missing", "frame 7")


def test_missing_first_image_file(dataset):
    # nerfstudio opens the first image itself to choose a downscale factor; still our message.
    (dataset / "images" / "frame_00000.png").unlink()
    expect_error(dataset, "frame_00000.png", "missing")


def test_corrupt_image_file(dataset):
    (dataset / "images" / "frame_00005.png").write_bytes(b"\x89PNG\r\n\x1a\n this is not a png")
    expect_error(dataset, "frame_00005.png", "corrupt", "frame 5")


def test_truncated_image_file(dataset):
    path = dataset / "images" / "frame_00008.png"
    path.write_bytes(path.read_bytes()[:200])  # the header is fine, the pixels are cut off
    expect_error(dataset, "frame_00008.png", "corrupt")


def test_image_size_mismatch(dataset):
    Image.new("RGB", (20, 10), (200, 10, 10)).save(dataset / "images" / "frame_00004.png")
    expect_error(dataset, "frame_00004.png", "20x10", "w=32 h=24")


def test_unsupported_image_mode(dataset):
    Image.new("LA", (32, 24)).save(dataset / "images" / "frame_00002.png")  # grey + alpha: 2 channels
    expect_error(dataset, "frame_00002.png", "mode LA")


def test_missing_point_cloud(dataset):
    (dataset / "sparse_pc.ply").unlink()
    err = expect_error(dataset, "sparse_pc.ply", "missing")
    assert "load-3D-points" in (err.hint or "")
    # With seed points off it is not needed.
    assert len(parse(dataset, load_3D_points=False).image_filenames) == 9


def test_corrupt_point_cloud(dataset):
    (dataset / "sparse_pc.ply").write_bytes(b"ply\nformat binary_little_endian 1.0\nelement vertex 5\nend")
    expect_error(dataset, "sparse_pc.ply", "unreadable")


def test_no_point_cloud_declared_falls_back(dataset):
    edit(dataset, lambda m: m.pop("ply_file_path"))
    out = parse(dataset)
    assert "points3D_xyz" not in out.metadata  # splatfacto-style models then initialise randomly


def test_missing_mask_file(dataset):
    def masks(m):
        for f in m["frames"]:
            f["mask_path"] = f["file_path"].replace("images/", "masks/")

    edit(dataset, masks)
    shutil.copytree(dataset / "images", dataset / "masks")
    (dataset / "masks" / "frame_00001.png").unlink()
    expect_error(dataset, "Mask file", "frame_00001.png")


def test_inference_mode_needs_no_images(dataset):
    """ns-viewer / ns-export parse in inference mode (downscale fixed to 1) and read no image files."""
    shutil.rmtree(dataset / "images")
    (dataset / "sparse_pc.ply").unlink()
    parser = BytesplatSceneDataParserConfig(data=dataset).setup()
    parser.downscale_factor = 1  # what nerfstudio's datamanager does for test_mode="inference"
    assert len(parser.get_dataparser_outputs("train").image_filenames) == 9
    # but transforms.json itself is still checked
    edit(dataset, lambda m: m["frames"][0].pop("transform_matrix"))
    parser = BytesplatSceneDataParserConfig(data=dataset).setup()
    parser.downscale_factor = 1
    with pytest.raises(BytesplatError, match="transform_matrix"):
        parser.get_dataparser_outputs("train")


def test_check_images_off_skips_decoding(dataset):
    (dataset / "images" / "frame_00005.png").write_bytes(b"garbage")
    assert len(parse(dataset, check_images=False).image_filenames) == 9  # existence is still checked
    (dataset / "images" / "frame_00005.png").unlink()
    expect_error(dataset, "frame_00005.png", "missing", check_images=False)


def test_colmap_points_prompt_never_blocks(dataset, monkeypatch):
    """nerfstudio asks on stdin whether to convert COLMAP points when no ply_file_path is given; a
    non-interactive run must not wait for an answer."""
    import io

    edit(dataset, lambda m: m.pop("ply_file_path"))
    (dataset / "colmap" / "sparse" / "0").mkdir(parents=True)
    monkeypatch.setattr("sys.stdin", io.StringIO(""))  # not a TTY; nerfstudio's prompt would hit EOF
    out = parse(dataset)
    assert len(out.image_filenames) == 9 and "points3D_xyz" not in out.metadata
