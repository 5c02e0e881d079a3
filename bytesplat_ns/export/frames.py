"""The coordinate frame an export is written in.

- ``nerfstudio``: the frame the model was trained in (nerfstudio's dataparser auto-orients the cameras
  z-up, centres and rescales them); what ``ns-export gaussian-splat`` writes.
- ``data``: the capture's own coordinates, those of the dataset's camera poses (and, for COLMAP data,
  the original reconstruction): the run's ``dataparser_transforms.json`` (p_ns = s (R p + t)) undone.
- ``y-up``: the nerfstudio frame turned so that its up axis (+z) becomes +y, for viewers that assume
  y-up; scale and centre stay nerfstudio's.

A frame change is a similarity p -> scale * rotation @ p + offset. Applied to splats it moves the means,
rotates the quaternions and the SH coefficients, and adds log(scale) to the log-scales.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np

from bytesplat_ns.errors import BytesplatError
from bytesplat_ns.export.sh_rotation import rotate_sh
from bytesplat_ns.export.splats import Splats, normalized_quats

Frame = Literal["nerfstudio", "data", "y-up"]
FRAMES = ("nerfstudio", "data", "y-up")

# +z (nerfstudio's up) -> +y: a -90 degree turn about x, (x, y, z) -> (x, z, -y)
Z_UP_TO_Y_UP = np.array([[1.0, 0.0, 0.0], [0.0, 0.0, 1.0], [0.0, -1.0, 0.0]])


@dataclass(frozen=True)
class Similarity:
    """p -> scale * rotation @ p + offset (rotation proper: det +1)."""

    rotation: np.ndarray
    scale: float
    offset: np.ndarray

    def apply_points(self, points: np.ndarray) -> np.ndarray:
        return self.scale * points @ self.rotation.T + self.offset


IDENTITY = Similarity(np.eye(3), 1.0, np.zeros(3))


def rotation_to_quat(rotation: np.ndarray) -> np.ndarray:
    """Unit wxyz quaternion of a proper rotation matrix (Shepperd's method: stable for every angle)."""
    m = rotation
    trace = np.trace(m)
    if trace > 0:
        s = 2.0 * np.sqrt(1.0 + trace)
        q = [0.25 * s, (m[2, 1] - m[1, 2]) / s, (m[0, 2] - m[2, 0]) / s, (m[1, 0] - m[0, 1]) / s]
    elif m[0, 0] > m[1, 1] and m[0, 0] > m[2, 2]:
        s = 2.0 * np.sqrt(1.0 + m[0, 0] - m[1, 1] - m[2, 2])
        q = [(m[2, 1] - m[1, 2]) / s, 0.25 * s, (m[0, 1] + m[1, 0]) / s, (m[0, 2] + m[2, 0]) / s]
    elif m[1, 1] > m[2, 2]:
        s = 2.0 * np.sqrt(1.0 + m[1, 1] - m[0, 0] - m[2, 2])
        q = [(m[0, 2] - m[2, 0]) / s, (m[0, 1] + m[1, 0]) / s, 0.25 * s, (m[1, 2] + m[2, 1]) / s]
    else:
        s = 2.0 * np.sqrt(1.0 + m[2, 2] - m[0, 0] - m[1, 1])
        q = [(m[1, 0] - m[0, 1]) / s, (m[0, 2] + m[2, 0]) / s, (m[1, 2] + m[2, 1]) / s, 0.25 * s]
    q = np.asarray(q)
    return q / np.linalg.norm(q)


def quat_multiply(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Hamilton product a * b of wxyz quaternions (a [4] or [N,4], b [N,4])."""
    aw, ax, ay, az = np.moveaxis(np.broadcast_to(a, b.shape), -1, 0)
    bw, bx, by, bz = np.moveaxis(b, -1, 0)
    return np.stack([
        aw * bw - ax * bx - ay * by - az * bz,
        aw * bx + ax * bw + ay * bz - az * by,
        aw * by - ax * bz + ay * bw + az * bx,
        aw * bz + ax * by - ay * bx + az * bw,
    ], axis=-1)


def transform_splats(splats: Splats, sim: Similarity) -> Splats:
    rotation = np.asarray(sim.rotation, dtype=np.float64)
    if abs(np.linalg.det(rotation) - 1.0) > 1e-4 or not np.allclose(rotation @ rotation.T, np.eye(3), atol=1e-4):
        raise BytesplatError("the frame transform is not a proper rotation (det +1), cannot move splats with it")
    if not sim.scale > 0:
        raise BytesplatError(f"the frame transform's scale is {sim.scale}, must be > 0")
    quats = quat_multiply(rotation_to_quat(rotation), splats.quats.astype(np.float64))
    return Splats(
        means=sim.apply_points(splats.means.astype(np.float64)).astype(np.float32),
        log_scales=(splats.log_scales + np.log(sim.scale)).astype(np.float32),
        quats=normalized_quats(quats),
        logit_opacities=splats.logit_opacities.copy(),
        sh0=splats.sh0.copy(),
        sh_rest=rotate_sh(splats.sh_rest, rotation).astype(np.float32),
    )


def read_dataparser_transform(run_dir: Path) -> Similarity:
    """The nerfstudio -> data similarity: the inverse of ``dataparser_transforms.json``'s p_ns = s (R p + t)."""
    path = Path(run_dir) / "dataparser_transforms.json"
    if not path.is_file():
        raise BytesplatError(
            f"no dataparser_transforms.json in {run_dir}: cannot undo the dataparser's transform",
            hint="ns-train writes it next to config.yml; use --frame nerfstudio for runs without one",
        )
    try:
        meta = json.loads(path.read_text())
        transform = np.asarray(meta["transform"], dtype=np.float64)
        scale = float(meta["scale"])
    except (ValueError, KeyError, TypeError) as e:
        raise BytesplatError(f"{path} is not a nerfstudio dataparser transform ({e})") from None
    if transform.shape != (3, 4):
        raise BytesplatError(f"{path}: 'transform' must be 3x4, got {transform.shape}")
    rotation, translation = transform[:, :3], transform[:, 3]
    # p = R^T (p_ns / s - t) = (1/s) R^T p_ns - R^T t
    return Similarity(rotation.T, 1.0 / scale, -rotation.T @ translation)


def frame_transform(frame: Frame, run_dir: Path) -> Similarity:
    """The similarity from the nerfstudio (training) frame to ``frame``."""
    if frame == "nerfstudio":
        return IDENTITY
    if frame == "data":
        return read_dataparser_transform(run_dir)
    if frame == "y-up":
        return Similarity(Z_UP_TO_Y_UP, 1.0, np.zeros(3))
    raise BytesplatError(f"unknown frame {frame!r}", hint=f"choose one of {', '.join(FRAMES)}")
