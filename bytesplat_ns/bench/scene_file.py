"""A benchmark scene handed to a child process: ``synthetic_scene``'s dict (or a trained run's, from
``bench.trained.raster_scene``) written once with ``torch.save`` and read back by the child, which
times another gsplat version (first on its path) on exactly these Gaussians, cameras and image."""

from __future__ import annotations

from pathlib import Path
from typing import Dict, Union

import torch


def save_scene(scene: Dict, path: Union[str, Path]) -> Path:
    """Write ``scene`` (tensors, moved to the host, and plain numbers) to ``path``."""
    path = Path(path)
    torch.save({k: (v.detach().cpu() if isinstance(v, torch.Tensor) else v) for k, v in scene.items()}, path)
    return path


def load_scene(path: Union[str, Path], device: str = "cuda") -> Dict:
    """The scene :func:`save_scene` wrote, its tensors on ``device`` (contiguous)."""
    scene = torch.load(Path(path), map_location="cpu", weights_only=True)
    return {k: (v.to(device).contiguous() if isinstance(v, torch.Tensor) else v) for k, v in scene.items()}
