"""bytesplat's dataparser: the built-in synthetic scene, or a validated nerfstudio-format directory.

``BytesplatSceneDataParserConfig`` is nerfstudio's ``NerfstudioDataParserConfig`` with

- ``data: Optional[Path] = None``. Without data, the built-in scene (see :mod:`bytesplat_ns.data.scene`)
  of ``scene_size`` / ``scene_seed`` (and optional ``num_views`` / ``width`` / ``height`` overrides) is
  generated on first use into the cache and parsed from there. With data, the user's directory (or
  transforms.json path) is parsed.
- ``load_3D_points = True`` (as splatfacto uses): the seed point cloud named by ``ply_file_path``.

Before nerfstudio's parser sees the data, it is validated, and every problem raises a
:class:`~bytesplat_ns.errors.BytesplatError` naming it: missing path, no transforms.json, invalid JSON
(line and column), missing fields (naming the field and the frame index), a transform_matrix that is
not 4x4 finite numbers, intrinsics missing globally and per frame, an unknown camera_model, split lists
naming unknown files, a missing or unreadable/corrupt image (every image is decoded with PIL, in
threads, once per parser), an image whose size does not match the intrinsics, and missing mask/depth
files.

Point cloud policy: if transforms.json names a ``ply_file_path`` and ``load_3D_points`` is on, the file
must exist and hold points, else it is an error (silently falling back to random initialisation would
hide a broken dataset behind worse quality). If transforms.json names no point cloud, nerfstudio's own
warning is printed and splatfacto-style models fall back to random initialisation. PLY files are read
with plyfile (same result as nerfstudio's open3d loader; open3d needs the system libusb and is slow
to import); other point cloud formats go through nerfstudio's open3d loader.
"""

from __future__ import annotations

import contextlib
import copy
import json
import math
import os
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Iterator, List, Literal, Optional, Tuple, Type

import numpy as np
import torch
from PIL import Image, UnidentifiedImageError

from nerfstudio.cameras.cameras import CAMERA_MODEL_TO_TYPE
from nerfstudio.data.dataparsers import nerfstudio_dataparser
from nerfstudio.data.dataparsers.base_dataparser import DataparserOutputs
from nerfstudio.data.dataparsers.nerfstudio_dataparser import Nerfstudio, NerfstudioDataParserConfig
from nerfstudio.plugins.registry_dataparser import DataParserSpecification
from nerfstudio.utils.rich_utils import CONSOLE

from bytesplat_ns.data.scene import SceneSpec, ensure_scene, read_ply
from bytesplat_ns.errors import BytesplatError

_INTRINSICS = ("fl_x", "fl_y", "cx", "cy", "w", "h")
_IMAGE_MODES = ("RGB", "RGBA", "L")  # what nerfstudio's InputDataset turns into 3 or 4 channels


# tyro takes dataparser options only after the dataparser's name, at the end of the command line.
POINT_CLOUD_HINT = (
    "fix or remove ply_file_path, or start from random points: end the ns-train command with "
    "'bytesplat-scene --load-3D-points False'"
)


@dataclass
class BytesplatSceneDataParserConfig(NerfstudioDataParserConfig):
    """nerfstudio-format data with validation, or (without data) bytesplat's built-in synthetic scene."""

    _target: Type = field(default_factory=lambda: BytesplatSceneDataParser)
    data: Optional[Path] = None  # type: ignore[assignment]
    """Directory or transforms.json of a nerfstudio-format dataset. None: the built-in synthetic scene."""
    scene_size: Literal[
        "small", "medium", "large", "city-tiny", "city-small", "city-medium", "city-large", "city-4k"
    ] = "small"
    """Built-in scene preset (when data is None): small 128x96 x64 views, medium 256x192 x100,
    large 800x600 x200; city-*: the city-scale scene of bytesplat_ns.data.city (see docs/large_scenes.md)."""
    scene_seed: int = 0
    """Built-in scene layout seed (when data is None)."""
    num_views: Optional[int] = None
    """Built-in scene: number of views (train + eval; every 8th is held out). None: the preset's."""
    width: Optional[int] = None
    """Built-in scene: image width. None: the preset's (height follows at 4:3 if not given)."""
    height: Optional[int] = None
    """Built-in scene: image height. None: the preset's."""
    scene_sky: Optional[Literal["transparent", "gradient"]] = None
    """Built-in scene (not city): transparent (RGBA images, no sky to learn) or a gradient sky. None: the
    preset's (small: transparent; medium, large: gradient)."""
    scene_cache_dir: Optional[Path] = None
    """Where built-in scenes are cached. None: $BYTESPLAT_CACHE/scenes or ~/.cache/bytesplat_ns/scenes."""
    scene_workers: Optional[int] = None
    """Built-in scene: processes that render it on first use. None: 1 for small scenes, up to 16 for large ones."""
    check_images: bool = True
    """Decode every image once before training to report missing or corrupt files by name."""
    skip_missing_images: bool = False
    """Drop frames whose image file is missing (one warning names them) instead of stopping with an
    error; e.g. instant-ngp's published transforms list frames that ship without an image."""
    load_3D_points: bool = True
    """Load the seed point cloud named by ply_file_path (splatfacto-style initialisation)."""

    def scene_spec(self) -> SceneSpec:
        return SceneSpec(
            size=self.scene_size,
            seed=self.scene_seed,
            num_views=self.num_views,
            width=self.width,
            height=self.height,
            sky=self.scene_sky,
        )


class BytesplatSceneDataParser(Nerfstudio):
    """nerfstudio's ``Nerfstudio`` dataparser behind a validation pass and the built-in scene."""

    config: BytesplatSceneDataParserConfig

    def __init__(self, config: BytesplatSceneDataParserConfig, **kwargs: Any):
        super().__init__(config=config, **kwargs)
        self._validated_path: Optional[Path] = None
        self._meta: Optional[Dict[str, Any]] = None
        self._inference = False

    # -- data location ------------------------------------------------------------------------------

    def resolve_data(self) -> Path:
        """The data path, generating the built-in scene first when ``config.data`` is None.

        The generated scene's path is written back to ``config.data`` so that everything downstream
        (``datamanager.get_datapath()``, the viewer) sees a real directory.
        """
        if self.config.data is None and self.config.scene_size.startswith("city-"):
            from bytesplat_ns.data.city import ensure_city_for_dataparser

            self.config.data = ensure_city_for_dataparser(self.config)
        elif self.config.data is None:
            self.config.data = ensure_scene(self.config.scene_spec(), cache_dir=self.config.scene_cache_dir,
                                            workers=self.config.scene_workers)
        elif not isinstance(self.config.data, Path):
            self.config.data = Path(self.config.data)
        return self.config.data

    # -- nerfstudio entry point ---------------------------------------------------------------------

    def _generate_dataparser_outputs(self, split: str = "train", **kwargs: Any) -> DataparserOutputs:
        data = self.resolve_data()
        if self._validated_path != data:
            # nerfstudio's datamanager fixes the downscale factor before parsing only in inference mode
            # (ns-viewer, ns-export), which reads neither images nor the seed point cloud.
            self._inference = self.downscale_factor is not None
            self._meta = validate_nerfstudio_data(
                data, parser=self, check_images=self.config.check_images, inference=self._inference,
                skip_missing_images=self.config.skip_missing_images,
            )
            self._validated_path = data
        assert self._meta is not None
        _check_split(self._meta, split, data)
        if (
            self.config.load_3D_points
            and "ply_file_path" not in self._meta
            and (data / "colmap/sparse/0").exists()
            and not getattr(self, "prompted_user", False)
            and not (sys.stdin is not None and sys.stdin.isatty())
        ):
            # nerfstudio would ask on stdin whether to convert the COLMAP points: never block a
            # non-interactive run on that question.
            CONSOLE.print(
                f"[bold yellow]Warning: {data} has COLMAP points but transforms.json names no ply_file_path; "
                "not converting them without a terminal to ask on. Using random initialisation."
            )
            self.prompted_user, self.create_pc = True, False
        try:
            with _parse_meta(self._meta):
                outputs = super()._generate_dataparser_outputs(split)
        except BytesplatError:
            raise
        except (AssertionError, KeyError, ValueError, TypeError, IndexError, RuntimeError, OSError) as e:
            # Validation should have caught it; still give one line instead of nerfstudio's traceback.
            raise BytesplatError(
                f"nerfstudio could not parse {data} ({split} split): {type(e).__name__}: {e}"
            ) from e
        if (
            self.config.load_3D_points
            and not self._inference
            and "ply_file_path" in self._meta
            and "points3D_xyz" not in outputs.metadata
        ):
            ply = _data_dir(data) / str(self._meta["ply_file_path"])
            raise BytesplatError(f"Point cloud {ply} (ply_file_path in transforms.json) contains no points")
        return outputs

    def _load_3D_points(self, ply_file_path: Path, transform_matrix: torch.Tensor, scale_factor: float):
        ply_file_path = Path(ply_file_path)
        if self._inference and not ply_file_path.is_file():
            return None  # the model's Gaussians come from the checkpoint
        if ply_file_path.suffix.lower() != ".ply":
            try:
                return super()._load_3D_points(ply_file_path, transform_matrix, scale_factor)
            except (ImportError, OSError) as e:
                raise BytesplatError(
                    f"Cannot read point cloud {ply_file_path}: open3d is unavailable ({e})",
                    hint="install open3d and its system library libusb-1.0 (Debian: libusb-1.0-0), "
                    "or convert the point cloud to .ply",
                ) from e
        try:
            xyz, rgb = read_ply(ply_file_path)
        except Exception as e:  # plyfile raises assorted errors on malformed files
            raise BytesplatError(
                f"Point cloud {ply_file_path} (ply_file_path in transforms.json) is unreadable: {e}",
                hint=POINT_CLOUD_HINT,
            ) from e
        if len(xyz) == 0:
            return None
        if not np.isfinite(xyz).all():
            raise BytesplatError(f"Point cloud {ply_file_path} has non-finite (NaN/inf) coordinates")
        if rgb is None:
            rgb = np.full((len(xyz), 3), 128, dtype=np.uint8)
        pts = torch.from_numpy(xyz.astype(np.float32))
        homog = torch.cat([pts, torch.ones_like(pts[:, :1])], dim=-1)
        pts = (homog @ transform_matrix.T.to(pts.dtype)) * scale_factor
        return {"points3D_xyz": pts, "points3D_rgb": torch.from_numpy(np.ascontiguousarray(rgb))}


@contextlib.contextmanager
def _parse_meta(meta: Dict[str, Any]) -> Iterator[None]:
    """Make nerfstudio's parser read the validated transforms (frames without an image removed when
    skipping them) instead of reading transforms.json again."""
    real_load = nerfstudio_dataparser.load_from_json
    nerfstudio_dataparser.load_from_json = lambda _path: copy.deepcopy(meta)
    try:
        yield
    finally:
        nerfstudio_dataparser.load_from_json = real_load


# ----------------------------------------------------------------------------------------------------
# Validation
# ----------------------------------------------------------------------------------------------------


def _data_dir(data: Path) -> Path:
    return data.parent if data.suffix == ".json" else data


def _frame_name(frames: List[Any], i: int) -> str:
    fp = frames[i].get("file_path") if isinstance(frames[i], dict) else None
    return f"frame {i} ({fp})" if isinstance(fp, str) else f"frame {i}"


def missing_data_error(data: Path) -> BytesplatError:
    """The error for a --data path that does not exist."""
    return BytesplatError(f"Data path {data} does not exist",
                          hint="check --data, or leave it out to train on the built-in synthetic scene")


def transforms_path(data: Path) -> Path:
    """The transforms.json that ``data`` (a dataset folder or the .json itself) names, or the clear error of why
    there is none."""
    if not data.exists():
        raise missing_data_error(data)
    if data.is_file():
        if data.suffix != ".json":
            raise BytesplatError(
                f"Data path {data} is a file but not a .json file",
                hint="pass the dataset directory (holding transforms.json) or the transforms .json file itself",
            )
        return data
    path = data / "transforms.json"
    if not path.is_file():
        hint = "convert captures with ns-process-data, or pick the dataparser of your format"
        if (data / "transforms_train.json").exists():
            hint = "this looks like a Blender dataset: use the blender-data dataparser"
        elif (data / "sparse").exists() or (data / "colmap").exists():
            hint = "this looks like COLMAP output: use the colmap dataparser, or run ns-process-data"
        raise BytesplatError(f"No transforms.json in data directory {data}", hint=hint)
    return path


def check_data_inputs(datamanager) -> None:
    """What the configured dataparser will read, checked before anything is written or loaded (the trainer config
    runs this before ns-train writes the run's config.yml): the --data path, and for nerfstudio-data and
    bytesplat-scene its transforms.json, for colmap its sparse model and images folder. nerfstudio's own parsers
    stop at these with a traceback, after the run directory exists."""
    from nerfstudio.data.dataparsers.colmap_dataparser import ColmapDataParserConfig

    dataparser = getattr(datamanager, "dataparser", None)
    data = getattr(datamanager, "data", None) or getattr(dataparser, "data", None)
    if data is None:
        return
    data = Path(data)
    if not data.exists():
        raise missing_data_error(data)
    if isinstance(dataparser, NerfstudioDataParserConfig):
        transforms_path(data)
    elif isinstance(dataparser, ColmapDataParserConfig):
        if data.is_file():
            raise BytesplatError(f"Data path {data} is a file; the colmap dataparser takes the dataset folder",
                                 hint="pass the folder holding colmap/sparse/0 and images/, or use nerfstudio-data "
                                      "for a transforms.json" if data.suffix == ".json" else
                                      "pass the folder holding colmap/sparse/0 and images/")
        model = data / dataparser.colmap_path
        if not model.exists():
            hint = "run COLMAP (or ns-process-data) first, or give the model's folder relative to --data with --colmap-path after colmap"
            if (data / "transforms.json").exists():
                hint = "this folder holds transforms.json: use the nerfstudio-data dataparser"
            raise BytesplatError(f"No COLMAP model at {model}", hint=hint)
        images = data / dataparser.images_path
        if not images.is_dir():
            raise BytesplatError(f"No images folder at {images}",
                                 hint="give the images' folder relative to --data with --images-path after colmap")


def _load_transforms(data: Path) -> Tuple[Path, Dict[str, Any]]:
    """Check the path and parse transforms.json; returns (json path, meta)."""
    path = transforms_path(data)
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise BytesplatError(f"{path} is not UTF-8 text (byte {e.start})") from e
    except OSError as e:
        raise BytesplatError(f"Cannot read {path}: {e.strerror or e}") from e
    try:
        meta = json.loads(text)
    except json.JSONDecodeError as e:
        raise BytesplatError(f"{path} is not valid JSON: {e.msg} at line {e.lineno} column {e.colno}") from e
    if not isinstance(meta, dict):
        raise BytesplatError(f"{path} must hold a JSON object at the top level, got {type(meta).__name__}")
    return path, meta


def _number(value: Any, what: str, positive: bool = False) -> float:
    try:
        x = float(value)
    except (TypeError, ValueError):
        raise BytesplatError(f"{what} must be a number, got {value!r}") from None
    if not math.isfinite(x) or (positive and x <= 0):
        raise BytesplatError(f"{what} must be a {'positive ' if positive else ''}finite number, got {value!r}")
    return x


def _check_structure(path: Path, meta: Dict[str, Any]) -> List[Dict[str, Any]]:
    name = str(path)
    if "frames" not in meta:
        raise BytesplatError(f"{path} has no 'frames' field (the list of images and their camera poses)")
    frames = meta["frames"]
    if not isinstance(frames, list) or len(frames) == 0:
        raise BytesplatError(f"{path}: 'frames' must be a non-empty list, got {json.dumps(frames)[:60]}")
    if "camera_model" in meta and meta["camera_model"] not in CAMERA_MODEL_TO_TYPE:
        raise BytesplatError(
            f"{path}: unknown camera_model {meta['camera_model']!r}",
            hint=f"one of {', '.join(CAMERA_MODEL_TO_TYPE)}",
        )
    for key in _INTRINSICS:
        if key in meta:
            _number(meta[key], f"{name}: '{key}'", positive=key not in ("cx", "cy"))
    for i, frame in enumerate(frames):
        if not isinstance(frame, dict):
            raise BytesplatError(f"{name}: frame {i} must be a JSON object, got {type(frame).__name__}")
        where = _frame_name(frames, i)
        if "file_path" not in frame:
            raise BytesplatError(f"{name}: frame {i} has no 'file_path' field")
        if not isinstance(frame["file_path"], str) or not frame["file_path"]:
            raise BytesplatError(f"{name}: frame {i} 'file_path' must be a non-empty string")
        if "transform_matrix" not in frame:
            raise BytesplatError(f"{name}: {where} has no 'transform_matrix' field")
        try:
            mat = np.asarray(frame["transform_matrix"], dtype=np.float64)
        except (TypeError, ValueError):
            mat = None
        if mat is None or mat.shape != (4, 4):
            shape = "x".join(map(str, mat.shape)) if mat is not None else "non-numeric values"
            raise BytesplatError(f"{name}: {where} transform_matrix must be 4x4 numbers, got {shape}")
        if not np.isfinite(mat).all():
            raise BytesplatError(f"{name}: {where} transform_matrix has non-finite values (NaN/inf)")
        for key in _INTRINSICS:
            if key in meta:
                continue
            if key not in frame:
                raise BytesplatError(
                    f"{name}: intrinsic '{key}' is missing: not at the top level and not in {where}"
                )
            _number(frame[key], f"{name}: {where} '{key}'", positive=key not in ("cx", "cy"))
        for key in ("mask_path", "depth_file_path"):
            if key in frame and (not isinstance(frame[key], str) or not frame[key]):
                raise BytesplatError(f"{name}: {where} '{key}' must be a non-empty string")
    for key in ("mask_path", "depth_file_path"):
        have = [i for i, f in enumerate(frames) if key in f]
        if have and len(have) != len(frames):
            missing = next(i for i in range(len(frames)) if key not in frames[i])
            raise BytesplatError(
                f"{name}: '{key}' is given for {len(have)} of {len(frames)} frames; "
                f"{_frame_name(frames, missing)} has none (give it for every frame or none)"
            )
    # Split lists: every entry must name a frame.
    frame_paths = {os.path.normpath(f["file_path"]) for f in frames}
    for split in ("train", "val", "test"):
        key = f"{split}_filenames"
        if key not in meta:
            continue
        if not isinstance(meta[key], list) or not all(isinstance(x, str) for x in meta[key]):
            raise BytesplatError(f"{name}: '{key}' must be a list of file paths")
        unknown = [x for x in meta[key] if os.path.normpath(x) not in frame_paths]
        if unknown:
            raise BytesplatError(
                f"{name}: '{key}' names {len(unknown)} file(s) that are not frames, e.g. {unknown[0]!r}"
            )
    if "ply_file_path" in meta and (not isinstance(meta["ply_file_path"], str) or not meta["ply_file_path"]):
        raise BytesplatError(f"{name}: 'ply_file_path' must be a non-empty string")
    return frames


def _check_split(meta: Dict[str, Any], split: str, data: Path) -> None:
    has_lists = any(f"{s}_filenames" in meta for s in ("train", "val", "test"))
    if has_lists and f"{split}_filenames" not in meta:
        raise BytesplatError(
            f"transforms.json in {_data_dir(data)} lists files for some splits but has no '{split}_filenames'",
            hint="give train_filenames, val_filenames and test_filenames, or none of them",
        )


def _image_problem(path: Path, expect_wh: Optional[Tuple[int, int]]) -> Optional[str]:
    """None if ``path`` decodes as an image nerfstudio can use (of size expect_wh if given)."""
    try:
        with Image.open(path) as im:
            im.load()
            mode, size = im.mode, im.size
    except FileNotFoundError:
        return "is missing"
    except UnidentifiedImageError:
        return "is unreadable or corrupt (not a recognised image format)"
    except Exception as e:  # PIL raises OSError, SyntaxError, ValueError, DecompressionBombError, ...
        detail = str(e).replace(f"'{path}'", "").replace(str(path), "").strip(" :") or type(e).__name__
        return f"is unreadable or corrupt ({detail})"
    if mode not in _IMAGE_MODES:
        return f"has unsupported image mode {mode}; convert it to RGB, RGBA or greyscale (L)"
    if expect_wh is not None and tuple(size) != expect_wh:
        return f"is {size[0]}x{size[1]} but transforms.json says w={expect_wh[0]} h={expect_wh[1]}"
    return None


def _without_frames(meta: Dict[str, Any], drop: List[int]) -> Dict[str, Any]:
    """``meta`` without the frames at ``drop``, and without their files in the split lists."""
    dropped = {os.path.normpath(meta["frames"][i]["file_path"]) for i in drop}
    kept = dict(meta, frames=[f for i, f in enumerate(meta["frames"]) if i not in set(drop)])
    for split in ("train", "val", "test"):
        key = f"{split}_filenames"
        if key in kept:
            kept[key] = [x for x in kept[key] if os.path.normpath(x) not in dropped]
    return kept


def _warn_skipped(name: str, skipped: List[str], total: int) -> None:
    shown = ", ".join(skipped[:20]) + (f", ... ({len(skipped) - 20} more)" if len(skipped) > 20 else "")
    CONSOLE.print(
        f"[bold yellow]Warning: skipping {len(skipped)} of {total} frames in {name} whose image file is missing "
        f"(skip_missing_images): {shown}"
    )


def validate_nerfstudio_data(
    data: Path, parser: Optional[Nerfstudio] = None, check_images: bool = True, inference: bool = False,
    skip_missing_images: bool = False,
) -> Dict[str, Any]:
    """Validate a nerfstudio-format dataset; return its parsed transforms.json.

    ``parser`` (a nerfstudio ``Nerfstudio`` parser) resolves image paths exactly as it will load them
    (downscaled ``images_N`` folders included). Without it, the paths in transforms.json are checked.
    With ``inference`` (nerfstudio's inference mode: ns-viewer/ns-export read no images and take the
    Gaussians from the checkpoint) only transforms.json is checked, not the image or point cloud files.
    With ``skip_missing_images``, frames whose image file is missing are removed from the returned
    transforms (and from its split lists) with one warning naming them, instead of being an error.
    Raises :class:`BytesplatError` on the first problem found.
    """
    data = Path(data)
    path, meta = _load_transforms(data)
    frames = _check_structure(path, meta)
    data_dir = _data_dir(data)
    name = str(path)

    if inference:
        return meta
    total, skipped = len(frames), []

    def skip(missing: List[int]) -> None:
        nonlocal meta, frames
        if len(missing) == len(frames):
            raise BytesplatError(f"{name}: none of its {total} frames has its image file (skip_missing_images)")
        skipped.extend(str(frames[i]["file_path"]) for i in missing)
        meta = _without_frames(meta, missing)
        frames = meta["frames"]

    auto_downscale = parser is not None and parser.downscale_factor is None and parser.config.downscale_factor is None
    if skip_missing_images and auto_downscale:
        # the downscale factor is chosen from the first frame's full-resolution image: it must exist
        originals = [i for i, f in enumerate(frames) if not (data_dir / f["file_path"]).is_file()]
        if originals:
            skip(originals)
    # nerfstudio opens the first frame's full-resolution image to choose a downscale factor.
    first = data_dir / frames[0]["file_path"]
    if auto_downscale:
        problem = _image_problem(first, None)
        if problem:
            raise BytesplatError(f"Image file {first} {problem} (frame 0 in {name})")

    def resolve(rel: str, prefix: str = "images_") -> Path:
        if parser is None:
            return data_dir / rel
        return Path(parser._get_fname(Path(rel), data_dir, downsample_folder_prefix=prefix))

    images = [resolve(f["file_path"]) for f in frames]
    factor = getattr(parser, "downscale_factor", None) or 1
    hint_images = None
    if factor > 1:
        hint_images = (
            f"images are read from images_{factor}/ (downscale factor {factor}); "
            "set --downscale-factor 1 to use the originals"
        )

    missing = [i for i, p in enumerate(images) if not p.is_file()]
    if missing and skip_missing_images:
        skip(missing)
        images = [p for i, p in enumerate(images) if i not in set(missing)]
        missing = []
    if skipped:
        _warn_skipped(name, skipped, total)
    if missing:
        i = missing[0]
        more = f" (and {len(missing) - 1} more missing)" if len(missing) > 1 else ""
        raise BytesplatError(
            f"Image file {images[i]} is missing (frame {i} in {name}){more}",
            hint_images or "fix the path, or pass --skip-missing-images True to the bytesplat-scene dataparser to "
            "train without the frames that have no image",
        )
    for key, prefix, what in (("mask_path", "masks_", "Mask"), ("depth_file_path", "depths_", "Depth")):
        for i, f in enumerate(frames):
            if key in f:
                p = resolve(f[key], prefix)
                if not p.is_file():
                    raise BytesplatError(f"{what} file {p} is missing (frame {i} in {name})")

    if "ply_file_path" in meta and getattr(parser.config if parser is not None else None, "load_3D_points", True):
        ply = data_dir / meta["ply_file_path"]
        if not ply.is_file():
            raise BytesplatError(
                f"Point cloud {ply} (ply_file_path in {name}) is missing",
                hint=POINT_CLOUD_HINT,
            )

    if check_images:
        expects: List[Optional[Tuple[int, int]]] = []
        for f in frames:
            if factor == 1:
                w = int(_number(meta.get("w", f.get("w")), "w"))
                h = int(_number(meta.get("h", f.get("h")), "h"))
                expects.append((w, h))
            else:
                expects.append(None)  # downscaled copies round their sizes in tool-specific ways
        workers = max(1, min(16, os.cpu_count() or 1, len(images)))
        with ThreadPoolExecutor(workers) as ex:
            problems = list(ex.map(_image_problem, images, expects))
        bad = [i for i, p in enumerate(problems) if p]
        if bad:
            i = bad[0]
            more = f" (and {len(bad) - 1} more bad images)" if len(bad) > 1 else ""
            raise BytesplatError(
                f"Image file {images[i]} {problems[i]} (frame {i} in {name}){more}", hint_images
            )
    return meta


bytesplat_scene_dataparser = DataParserSpecification(
    config=BytesplatSceneDataParserConfig(),
    description="bytesplat: built-in synthetic scene when --data is omitted, else nerfstudio-format data "
    "validated with clear errors",
)
