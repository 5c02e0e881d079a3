"""Frames listed without an image (instant-ngp's published transforms): an error by default, skipped
with one warning under ``skip_missing_images`` (issue 21, item 4)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from bytesplat_ns.data.dataparser import BytesplatSceneDataParserConfig
from bytesplat_ns.errors import BytesplatError

W, H, NUM_FRAMES = 16, 12, 8


def write_scene(root: Path, missing=(2, 5), split_lists: bool = False) -> Path:
    """Eight frames on a circle, looking at the origin; the images of ``missing`` are not written."""
    (root / "images").mkdir(parents=True)
    frames = []
    for i in range(NUM_FRAMES):
        angle = 2 * np.pi * i / NUM_FRAMES
        eye = np.array([3 * np.cos(angle), 3 * np.sin(angle), 1.0])
        forward = -eye / np.linalg.norm(eye)
        right = np.cross(forward, [0.0, 0.0, 1.0])
        right /= np.linalg.norm(right)
        up = np.cross(right, forward)
        pose = np.eye(4)
        pose[:3, :3] = np.stack([right, up, -forward], axis=1)  # OpenGL camera axes, as nerfstudio expects
        pose[:3, 3] = eye
        name = f"images/frame_{i:05d}.png"
        frames.append({"file_path": name, "transform_matrix": pose.tolist()})
        if i not in missing:
            Image.fromarray(np.full((H, W, 3), 20 * i, dtype=np.uint8)).save(root / name)
    meta = {"fl_x": 14.0, "fl_y": 14.0, "cx": W / 2, "cy": H / 2, "w": W, "h": H, "frames": frames}
    if split_lists:
        names = [f["file_path"] for f in frames]
        meta["train_filenames"] = [n for i, n in enumerate(names) if i % 4 != 1]
        meta["val_filenames"] = meta["test_filenames"] = [n for i, n in enumerate(names) if i % 4 == 1]
    (root / "transforms.json").write_text(json.dumps(meta))
    return root


def parse(root: Path, split: str, **options):
    config = BytesplatSceneDataParserConfig(data=root, load_3D_points=False, **options)
    return config.setup().get_dataparser_outputs(split=split)


def names(outputs) -> list:
    return sorted(Path(p).name for p in outputs.image_filenames)


def test_missing_image_is_an_error_by_default(tmp_path):
    root = write_scene(tmp_path / "scene")
    with pytest.raises(BytesplatError, match=r"frame_00002.png is missing .*\(and 1 more missing\)") as error:
        parse(root, "train")
    assert "--skip-missing-images True" in (error.value.hint or "")


def test_skipped_frames_are_named_once_and_absent(tmp_path, capsys):
    root = write_scene(tmp_path / "scene")
    parser = BytesplatSceneDataParserConfig(data=root, load_3D_points=False, skip_missing_images=True).setup()
    train, val = parser.get_dataparser_outputs("train"), parser.get_dataparser_outputs("val")
    out = capsys.readouterr().out.replace("\n", "")
    assert out.count("skipping 2 of 8 frames") == 1  # one warning for both splits
    assert "images/frame_00002.png, images/frame_00005.png" in out
    present = {f"frame_{i:05d}.png" for i in range(NUM_FRAMES) if i not in (2, 5)}
    assert set(names(train)) | set(names(val)) == present and not set(names(train)) & set(names(val))
    assert len(train.cameras) == len(train.image_filenames)


def test_split_lists_lose_the_skipped_files(tmp_path):
    root = write_scene(tmp_path / "scene", missing=(0, 5), split_lists=True)  # 5 is a val frame, 0 the first
    assert names(parse(root, "val", skip_missing_images=True)) == ["frame_00001.png"]
    assert names(parse(root, "train", skip_missing_images=True)) == [
        "frame_00002.png", "frame_00003.png", "frame_00004.png", "frame_00006.png", "frame_00007.png"]


def test_no_image_at_all_is_still_an_error(tmp_path):
    root = write_scene(tmp_path / "scene", missing=range(NUM_FRAMES))
    with pytest.raises(BytesplatError, match="none of its 8 frames has its image file"):
        parse(root, "train", skip_missing_images=True)
