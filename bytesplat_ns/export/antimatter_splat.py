"""The ``.splat`` format of antimatter15's WebGL viewer (read by most web viewers), written by hand
(it is 32 bytes a Gaussian and no maintained Python library writes it).

Per Gaussian, little-endian: position float32 x3, scale float32 x3 (linear, not log), RGBA uint8 (base
colour 0.5 + C0 * sh0 and sigmoid(opacity), times 255), rotation uint8 x4 (unit wxyz quaternion mapped
from [-1, 1] to 0..255 as q * 128 + 128). No SH beyond the base colour. Sorted by decreasing
volume x opacity, as the viewers that stream it expect the important splats first.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from bytesplat_ns.export.splats import Splats

SPLAT_DTYPE = np.dtype([("position", "<f4", 3), ("scale", "<f4", 3), ("rgba", "u1", 4), ("rotation", "u1", 4)])


def write_splat(path: Path, splats: Splats) -> None:
    importance = np.exp(splats.log_scales.astype(np.float64).sum(axis=1)) * splats.opacities()
    order = np.argsort(-importance, kind="stable")
    table = np.empty(len(splats), dtype=SPLAT_DTYPE)
    table["position"] = splats.means[order]
    table["scale"] = np.exp(splats.log_scales[order])
    rgba = np.concatenate([splats.colors(), splats.opacities()[:, None]], axis=1)[order]
    table["rgba"] = np.clip(np.round(rgba * 255.0), 0, 255)
    table["rotation"] = np.clip(np.round(splats.quats[order] * 128.0 + 128.0), 0, 255)
    Path(path).write_bytes(table.tobytes())
