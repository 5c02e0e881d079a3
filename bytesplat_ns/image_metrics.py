"""Eval-image metrics (PSNR, LPIPS) without torchmetrics.

splatfacto builds torchmetrics' PeakSignalNoiseRatio and LPIPS when the model is set up. Importing
torchmetrics imports its optional integrations too (``transformers`` where it is installed): seconds
of every ``ns-train``, ``ns-eval`` and ``ns-export`` start-up, before the first step. The same
numbers come from a few tensor operations here; the tests hold them against torchmetrics.

LPIPS (Zhang et al. 2018, the 'alex' variant splatfacto reports, version 0.1): the images, scaled to
[-1, 1] and shifted/scaled per channel, go through AlexNet's five conv+ReLU stages; each stage's
features are normalised to unit length over channels, squared differences are weighted per channel
(the LPIPS linear layers), averaged over the image and summed over the stages. The AlexNet weights are
torchvision's ImageNet ones from torch's hub cache (downloaded once, when the host answers); the linear
weights ship inside the torchmetrics package and are read from its folder without importing it.
"""

from __future__ import annotations

import importlib.util
import socket
import threading
import warnings
from pathlib import Path
from typing import Dict, List, Optional, Tuple
from urllib.parse import urlparse

import torch
import torch.nn.functional as F

# LPIPS' input normalisation (its "scaling layer"), per RGB channel
LPIPS_SHIFT = (-0.030, -0.088, -0.188)
LPIPS_SCALE = (0.458, 0.448, 0.450)
# AlexNet's feature convolutions: (index in torchvision's `features`, stride, padding); a 3x3/2 max pool
# comes before the second and third
ALEX_CONVS = ((0, 4, 2), (3, 1, 2), (6, 1, 1), (8, 1, 1), (10, 1, 1))
POOL_BEFORE = (1, 2)
FEATURE_EPS = 1e-8  # LPIPS' feature normalisation: x / sqrt(eps + sum_c x^2)


def psnr(a: torch.Tensor, b: torch.Tensor, data_range: float = 1.0) -> torch.Tensor:
    """PSNR of one batch, as torchmetrics' ``PeakSignalNoiseRatio(data_range)(a, b)``: over all elements."""
    mse = torch.mean((a.float() - b.float()) ** 2)
    return 10.0 * torch.log10(data_range**2 / mse)


def lpips_linear_weights_file(net_type: str = "alex") -> Optional[Path]:
    """The LPIPS linear-layer weights torchmetrics ships, found without importing torchmetrics."""
    spec = importlib.util.find_spec("torchmetrics")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(list(spec.submodule_search_locations)[0]) / "functional" / "image" / "lpips_models" / f"{net_type}.pth"
    return path if path.is_file() else None


def alexnet_lpips_distance(x: torch.Tensor, y: torch.Tensor, backbone: Dict[str, torch.Tensor],
                           linear: List[torch.Tensor]) -> torch.Tensor:
    """Per-image LPIPS [N] of [N,3,H,W] images in [-1, 1]; ``backbone`` holds AlexNet's ``features.*``
    weights, ``linear`` the five [1,C,1,1] LPIPS weights."""
    shift = torch.tensor(LPIPS_SHIFT, device=x.device, dtype=x.dtype).view(1, 3, 1, 1)
    scale = torch.tensor(LPIPS_SCALE, device=x.device, dtype=x.dtype).view(1, 3, 1, 1)
    both = (torch.cat([x, y]) - shift) / scale  # one pass through the network for both images
    total = torch.zeros(x.shape[0], device=x.device, dtype=x.dtype)
    for stage, (index, stride, padding) in enumerate(ALEX_CONVS):
        if stage in POOL_BEFORE:
            both = F.max_pool2d(both, kernel_size=3, stride=2)
        both = F.relu(F.conv2d(both, backbone[f"features.{index}.weight"], backbone[f"features.{index}.bias"],
                               stride=stride, padding=padding))
        unit = both / torch.sqrt(FEATURE_EPS + (both**2).sum(dim=1, keepdim=True))
        fx, fy = unit.chunk(2)
        total = total + F.conv2d((fx - fy) ** 2, linear[stage]).mean(dim=(1, 2, 3))
    return total


class Lpips:
    """splatfacto's ``LearnedPerceptualImagePatchSimilarity(normalize=True)``: images in [0, 1], the mean
    over the batch. Weights are loaded on the first call (the first eval image), not at start-up, and
    never enter the model's state dict. Offline without cached weights it warns once, ``available``
    turns False and calls return 0 (the model then reports no lpips)."""

    def __init__(self, connect_timeout_s: float = 0.8, download_timeout_s: float = 10.0):
        self.connect_timeout_s = connect_timeout_s
        self.download_timeout_s = download_timeout_s
        self.available = True
        self._weights: Optional[Tuple[Dict[str, torch.Tensor], List[torch.Tensor]]] = None
        self._on_device: Dict[Tuple[torch.device, torch.dtype], Tuple[Dict[str, torch.Tensor], List[torch.Tensor]]] = {}
        self._lock = threading.Lock()  # the trainer's eval-image worker and the main thread may both call

    def __getstate__(self) -> dict:
        # copies (the sharded pipeline deep-copies the model) share nothing: no lock, no loaded weights
        state = dict(self.__dict__)
        state.update(_weights=None, _on_device={}, _lock=None)
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def __call__(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        for image in (a, b):
            if image.min() < 0.0 or image.max() > 1.0:
                raise ValueError("LPIPS expects images in [0, 1] (normalize=True)")
        weights = self._weights_for(a.device, a.dtype)
        if weights is None:
            return torch.zeros((), device=a.device)
        with torch.no_grad():
            return alexnet_lpips_distance(2 * a - 1, 2 * b - 1, *weights).mean()

    def _weights_for(self, device: torch.device, dtype: torch.dtype):
        with self._lock:
            if self._weights is None and self.available:
                self._weights = self._load()
                self.available = self._weights is not None
            if self._weights is None:
                return None
            key = (device, dtype)
            if key not in self._on_device:
                backbone, linear = self._weights
                self._on_device[key] = ({k: v.to(device, dtype) for k, v in backbone.items()},
                                        [w.to(device, dtype) for w in linear])
            return self._on_device[key]

    def _load(self) -> Optional[Tuple[Dict[str, torch.Tensor], List[torch.Tensor]]]:
        from bytesplat_ns.compat import can_reach, lpips_weights

        url, cached = lpips_weights("alex")
        linear_file = lpips_linear_weights_file("alex")
        if linear_file is None:
            return self._unavailable("torchmetrics' LPIPS linear weights (lpips_models/alex.pth) are not installed",
                                     cached)
        if not cached.is_file():
            if not can_reach(url, self.connect_timeout_s):
                return self._unavailable(f"{urlparse(url).hostname} is unreachable and nothing is cached", cached)
            previous_timeout = socket.getdefaulttimeout()
            socket.setdefaulttimeout(self.download_timeout_s)  # a connection dropped mid-download must not hang
            try:
                cached.parent.mkdir(parents=True, exist_ok=True)
                torch.hub.download_url_to_file(url, str(cached), progress=False)
            except Exception as error:  # noqa: BLE001 - any download/IO failure means "no LPIPS"
                return self._unavailable(f"{type(error).__name__}: {error}", cached)
            finally:
                socket.setdefaulttimeout(previous_timeout)
        try:
            state = torch.load(cached, map_location="cpu", weights_only=True)
            backbone = {k: state[k].float() for k in state if k.startswith("features.")}
            lin_state = torch.load(linear_file, map_location="cpu", weights_only=True)
            linear = [lin_state[f"lin{stage}.model.1.weight"].float() for stage in range(len(ALEX_CONVS))]
        except Exception as error:  # noqa: BLE001 - a damaged cache file: no LPIPS, say which
            return self._unavailable(f"{type(error).__name__} reading {cached}: {error}", cached)
        return backbone, linear

    def _unavailable(self, reason: str, cached: Path) -> None:
        from bytesplat_ns.compat import lpips_unavailable_message

        warnings.warn(lpips_unavailable_message(reason, cached), stacklevel=5)
        return None
