"""Camera checks nerfstudio does not make, on any dataparser's outputs (ours, nerfstudio-data, colmap).

Run by the datamanager right after the dataparser, before any image is loaded; vectorised over the
cameras. Implausible intrinsics, non-finite poses and cameras that all sit at one point are errors
(training would run to nothing); duplicate poses are a warning (a capture may repeat a view).
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import List, Sequence

import torch

from bytesplat_ns.errors import BytesplatError

# Focal length as a multiple of the image's larger side: 0.05 is a ~170 degree field of view, 100 a
# ~0.6 degree one. Outside that the intrinsics are in the wrong unit or were never set.
MIN_FOCAL_RATIO = 0.05
MAX_FOCAL_RATIO = 100.0
# The principal point may sit off-centre (crops), but not more than half an image outside it.
PRINCIPAL_POINT_MARGIN = 0.5


def _frame(names: Sequence, i: int) -> str:
    return f"frame {i} ({names[i]})" if i < len(names) else f"frame {i}"


def _first(mask: torch.Tensor) -> int:
    return int(torch.nonzero(mask)[0, 0])


def frames_without_pose(data) -> List[str]:
    """The ``file_path`` of every frame of ``data``'s transforms.json (``data``: the scene directory or
    the file) that has no ``transform_matrix``; nerfstudio's parser fails on them with a bare KeyError."""
    path = Path(data) if data is not None else None
    if path is not None and path.is_dir():
        path = path / "transforms.json"
    if path is None or not path.is_file():
        return []
    try:
        frames = json.loads(path.read_text()).get("frames", [])
    except (OSError, ValueError, AttributeError):
        return []
    return [str(f.get("file_path", f"frame {i}")) for i, f in enumerate(frames)
            if isinstance(f, dict) and "transform_matrix" not in f]


def check_cameras(cameras, image_names: Sequence, split: str = "train") -> None:
    """Raise :class:`BytesplatError` naming the first bad frame; warn about duplicate poses."""
    n = int(cameras.camera_to_worlds.shape[0])
    if n == 0:
        return
    c2w = cameras.camera_to_worlds.reshape(n, 3, 4).double()
    size = torch.maximum(cameras.width.reshape(n), cameras.height.reshape(n)).double()
    fx, fy = cameras.fx.reshape(n).double(), cameras.fy.reshape(n).double()
    cx, cy = cameras.cx.reshape(n).double(), cameras.cy.reshape(n).double()
    w, h = cameras.width.reshape(n).double(), cameras.height.reshape(n).double()
    what = f"in the {split} split"

    finite = torch.isfinite(c2w).flatten(1).all(dim=1)
    if n > 1 and not bool(finite.any()):
        raise BytesplatError(
            f"All {n} camera poses {what} are non-finite after nerfstudio's normalisation: the cameras are probably "
            "all at one point.", hint="check the transform_matrix of every frame (their translations must differ)",
        )
    if not bool(finite.all()):
        raise BytesplatError(f"The camera pose of {_frame(image_names, _first(~finite))} {what} is non-finite (NaN/inf).")

    for name, focal in (("fx", fx), ("fy", fy)):
        ratio = focal / size
        bad = ~torch.isfinite(ratio) | (ratio < MIN_FOCAL_RATIO) | (ratio > MAX_FOCAL_RATIO)
        if bool(bad.any()):
            i = _first(bad)
            raise BytesplatError(
                f"Implausible focal length {name}={float(focal[i]):g} px for a {int(w[i])}x{int(h[i])} image "
                f"({_frame(image_names, i)} {what}): expected {MIN_FOCAL_RATIO:g} to {MAX_FOCAL_RATIO:g} times the "
                "larger image side.",
                hint="fl_x/fl_y are in pixels of the full-resolution image",
            )
    for name, centre, extent in (("cx", cx, w), ("cy", cy, h)):
        bad = ~torch.isfinite(centre) | (centre < -PRINCIPAL_POINT_MARGIN * extent) | (centre > (1 + PRINCIPAL_POINT_MARGIN) * extent)
        if bool(bad.any()):
            i = _first(bad)
            raise BytesplatError(
                f"Principal point {name}={float(centre[i]):g} px is far outside the {int(w[i])}x{int(h[i])} image "
                f"({_frame(image_names, i)} {what}).",
                hint="cx/cy are in pixels of the full-resolution image (usually near its centre)",
            )

    positions = c2w[:, :, 3]
    spread = (positions - positions.mean(dim=0)).norm(dim=1).max()
    if n > 1 and float(spread) <= 1e-9 * max(1.0, float(positions.norm(dim=1).max())):
        raise BytesplatError(
            f"All {n} cameras {what} are at one point {positions[0].tolist()}: nothing to triangulate from.",
            hint="check the translations in the frames' transform_matrix",
        )

    duplicates = _duplicate_pairs(c2w)
    if duplicates:
        i, j = duplicates[0]
        more = f" (and {len(duplicates) - 1} more pairs)" if len(duplicates) > 1 else ""
        warnings.warn(
            f"bytesplat: {_frame(image_names, j)} has the same camera pose as {_frame(image_names, i)} {what}{more}.",
            stacklevel=2,
        )


def _duplicate_pairs(c2w: torch.Tensor) -> List[tuple]:
    """(first, later) index pairs of identical poses (up to float32 rounding), via one sort."""
    keys = torch.round(c2w.flatten(1) * 1e6)
    unique, inverse = torch.unique(keys, dim=0, return_inverse=True)
    if len(unique) == len(keys):
        return []
    first_of = {}
    pairs = []
    for index, key in enumerate(inverse.tolist()):
        if key in first_of:
            pairs.append((first_of[key], index))
        else:
            first_of[key] = index
    return pairs
