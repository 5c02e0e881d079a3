"""The Gaussians of a run as plain float32 arrays in the 3DGS PLY conventions.

``means`` [N,3]; ``log_scales`` [N,3]; ``quats`` [N,4] wxyz, unit length; ``logit_opacities`` [N];
``sh0`` [N,3] (the DC coefficient per channel); ``sh_rest`` [N,K,3] (coefficient-major, K = 0, 3, 8 or 15).
Every format writer takes a :class:`Splats`, and every frame change returns a new one.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Tuple

import numpy as np

from bytesplat_ns.errors import BytesplatError

SH_C0 = 0.5 / np.sqrt(np.pi)  # the degree-0 SH basis: colour = 0.5 + SH_C0 * sh0

# 3DGS rasterizers skip Gaussians below alpha 1/255; nerfstudio's exporter drops them too.
MIN_LOGIT_OPACITY = float(np.log((1 / 255) / (1 - 1 / 255)))


@dataclass(frozen=True)
class Splats:
    means: np.ndarray
    log_scales: np.ndarray
    quats: np.ndarray
    logit_opacities: np.ndarray
    sh0: np.ndarray
    sh_rest: np.ndarray

    def __post_init__(self):
        n = len(self.means)
        shapes = {
            "means": (n, 3), "log_scales": (n, 3), "quats": (n, 4), "logit_opacities": (n,), "sh0": (n, 3),
        }
        for name, shape in shapes.items():
            if getattr(self, name).shape != shape:
                raise ValueError(f"Splats.{name} has shape {getattr(self, name).shape}, expected {shape}")
        if self.sh_rest.shape[0] != n or self.sh_rest.shape[2:] != (3,) or self.sh_rest.shape[1] not in (0, 3, 8, 15):
            raise ValueError(f"Splats.sh_rest has shape {self.sh_rest.shape}, expected (N, 0/3/8/15, 3)")

    def __len__(self) -> int:
        return len(self.means)

    @property
    def sh_degree(self) -> int:
        return {0: 0, 3: 1, 8: 2, 15: 3}[self.sh_rest.shape[1]]

    def with_sh_degree(self, degree: int) -> "Splats":
        """Keep the SH bands up to ``degree`` (0..3, at most the model's)."""
        if not 0 <= degree <= self.sh_degree:
            raise BytesplatError(
                f"SH degree {degree} asked for, but the model has degree {self.sh_degree}",
                hint=f"pass --sh-degree between 0 and {self.sh_degree}",
            )
        return replace(self, sh_rest=self.sh_rest[:, : (degree + 1) ** 2 - 1].copy())

    def select(self, keep: np.ndarray) -> "Splats":
        return Splats(*(getattr(self, f)[keep] for f in FIELDS))

    def drop_invisible(self) -> Tuple["Splats", int]:
        """Drop Gaussians with non-finite values or below the rasterizers' opacity cut; returns (kept, dropped)."""
        keep = self.logit_opacities >= MIN_LOGIT_OPACITY
        for name in FIELDS:
            values = getattr(self, name)
            keep &= np.isfinite(values.reshape(len(values), -1)).all(axis=1)
        return self.select(keep), int((~keep).sum())

    def colors(self) -> np.ndarray:
        """Base (view-independent) RGB in [0, 1], as formats without SH store it."""
        return np.clip(0.5 + SH_C0 * self.sh0, 0.0, 1.0)

    def opacities(self) -> np.ndarray:
        return 1.0 / (1.0 + np.exp(-self.logit_opacities.astype(np.float64)))


FIELDS = ("means", "log_scales", "quats", "logit_opacities", "sh0", "sh_rest")


def normalized_quats(quats: np.ndarray) -> np.ndarray:
    """Unit quaternions with w >= 0 (q and -q are the same rotation; formats store one of them)."""
    q = quats / np.linalg.norm(quats, axis=1, keepdims=True)
    return np.where(q[:, :1] < 0, -q, q).astype(np.float32)


def splats_from_model(model) -> Splats:
    """A splatfacto-style model's Gaussians (nerfstudio frame), as stored in its checkpoint."""
    import torch

    params = model.gauss_params
    with torch.no_grad():
        def arr(name):
            return params[name].detach().float().cpu().numpy()

        dc = arr("features_dc")
        if model.config.sh_degree == 0:
            # splatfacto keeps RGB logits at degree 0; the formats want an SH DC coefficient
            dc = (1.0 / (1.0 + np.exp(-dc)) - 0.5) / SH_C0
        rest = arr("features_rest")[:, : (model.config.sh_degree + 1) ** 2 - 1]
        return Splats(
            means=arr("means"),
            log_scales=arr("scales"),
            quats=normalized_quats(arr("quats")),
            logit_opacities=arr("opacities").reshape(-1),
            sh0=dc.reshape(-1, 3).astype(np.float32),
            sh_rest=np.ascontiguousarray(rest, dtype=np.float32),
        )


def run_dir_of(config_path: Path) -> Path:
    """The run directory of a run's config.yml (checked to exist)."""
    config_path = Path(config_path)
    if not config_path.is_file():
        raise BytesplatError(
            f"no such file: {config_path}", hint="pass the config.yml of a finished ns-train run (--load-config)"
        )
    return config_path.parent


def load_pipeline(config_path: Path):
    """A run's pipeline, loaded as nerfstudio's own tools load it.

    ``eval_setup`` reads the latest checkpoint, which holds every Gaussian also for runs trained on
    several ranks, and runs on CPU when no GPU is there.
    """
    from nerfstudio.utils.eval_utils import eval_setup

    run_dir_of(config_path)
    config, pipeline, _, _ = eval_setup(Path(config_path), test_mode="inference")
    if not hasattr(pipeline.model, "gauss_params"):
        raise BytesplatError(f"{config_path} is a {config.method_name} run, not a Gaussian splatting one")
    return pipeline
