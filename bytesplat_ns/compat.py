"""Workarounds for nerfstudio 1.1.5 on current torch and on offline machines.

Applied by importing this module (the plugin imports it first): every nerfstudio CLI that loads a
bytesplat config or lists methods imports the plugin before it touches checkpoints.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.abc
import importlib.util
import os
import socket
import sys
import threading
import urllib.request
import warnings
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Callable, Dict, Iterator, Tuple
from urllib.parse import urlparse

import numpy as np
import torch


def allow_nerfstudio_checkpoints() -> None:
    """Let ``torch.load``'s default ``weights_only=True`` (torch >= 2.6) read nerfstudio checkpoints.

    nerfstudio's trainer and ``eval_utils`` call ``torch.load`` without ``weights_only``; their
    checkpoints hold numpy scalars (scheduler and grad-scaler state). Allow-listing exactly those
    types keeps the safe loader instead of switching it off for the whole process.
    """
    add_safe_globals = getattr(torch.serialization, "add_safe_globals", None)
    if add_safe_globals is None:  # torch < 2.4 loads with weights_only=False by default
        return
    numpy_types = [np.dtype, np.ndarray, np.float64, np.float32, np.int64, np.int32, np.bool_]
    numpy_types += [type(np.dtype(name)) for name in ("float64", "float32", "int64", "int32", "bool")]
    for module_name in ("numpy.core.multiarray", "numpy._core.multiarray"):
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            continue
        numpy_types += [getattr(module, name) for name in ("scalar", "_reconstruct") if hasattr(module, name)]
    add_safe_globals(numpy_types)


def install_checkpoint_loader() -> bool:
    """Route nerfstudio's ``eval_utils.eval_load_checkpoint`` (ns-eval, ns-export, ns-viewer all load
    through ``eval_setup``) to ``bytesplat_ns.checkpoints.load_for_eval``: clear errors for every bad
    checkpoint. Returns whether it is installed.

    eval_utils imports the method registry, which imports this plugin, before it defines the function;
    so this runs at plugin import when eval_utils is complete, and again when a bytesplat config.yml
    is read (``ByteSplatTrainerConfig.__setstate__``), which eval_setup does before loading.
    """
    eval_utils = sys.modules.get("nerfstudio.utils.eval_utils")
    if eval_utils is None or not hasattr(eval_utils, "eval_load_checkpoint"):
        return False
    from bytesplat_ns.checkpoints import load_for_eval

    eval_utils.eval_load_checkpoint = load_for_eval
    return True


@dataclass
class LpipsStatus:
    available: bool = True


class _LpipsPlaceholder(torch.nn.Module):
    """Stands in for LPIPS when its weights cannot be fetched; the model drops its value."""

    def forward(self, *_args, **_kwargs) -> torch.Tensor:
        return torch.tensor(0.0)


# torchmetrics' LPIPS backbones and the torchvision models whose ImageNet weights they download
LPIPS_BACKBONES = {"alex": "alexnet", "vgg": "vgg16", "squeeze": "squeezenet1_1"}


def lpips_weights(net_type: str = "alex") -> Tuple[str, Path]:
    """The URL of the backbone weights LPIPS downloads and the file torch's hub cache keeps them in."""
    import torchvision

    url = torchvision.models.get_model_weights(LPIPS_BACKBONES[net_type]).DEFAULT.url
    return url, Path(torch.hub.get_dir()) / "checkpoints" / os.path.basename(urlparse(url).path)


def lpips_unavailable_message(reason: str, cached: Path) -> str:
    return (f"LPIPS is unavailable ({reason}); its backbone weights could not be loaded, so the lpips metric is "
            f"skipped. Put {cached.name} in torch's hub cache ({cached.parent}) to enable it.")


def can_reach(url: str, timeout_s: float) -> bool:
    """Whether ``url`` answers a HEAD request within ``timeout_s``. An open TCP port is not enough
    (a proxy or firewall may accept connections and never answer), and name lookup ignores socket
    timeouts: the request runs in a thread that is abandoned at the deadline."""
    answered = threading.Event()

    def ask() -> None:
        try:
            with urllib.request.urlopen(urllib.request.Request(url, method="HEAD"), timeout=timeout_s) as reply:
                if reply.status < 400:
                    answered.set()
        except (OSError, ValueError):
            pass

    thread = threading.Thread(target=ask, daemon=True, name="lpips-reachability")
    thread.start()
    thread.join(timeout_s)
    return answered.is_set()


LPIPS_MODULE = "torchmetrics.image.lpip"


class _PatchAfterImport(importlib.abc.MetaPathFinder):
    """Runs ``patch(module)`` right after ``name`` is first imported: the patch costs nothing (no
    torchmetrics import) in a process that never builds torchmetrics' LPIPS."""

    def __init__(self, name: str, patch: Callable[[ModuleType], None]):
        self.name, self.patch = name, patch

    def find_spec(self, fullname, path, target=None):
        if fullname != self.name:
            return None
        sys.meta_path.remove(self)  # let the other finders find the real module
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return spec
        real_exec = spec.loader.exec_module

        def exec_module(module: ModuleType) -> None:
            real_exec(module)
            self.patch(module)

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


@contextlib.contextmanager
def offline_safe_lpips(connect_timeout_s: float = 0.8, download_timeout_s: float = 10.0) -> Iterator[LpipsStatus]:
    """While active, building torchmetrics' LPIPS never crashes or waits on a dead network: with its
    backbone weights in torch's hub cache it is built from there; otherwise the download host must
    answer within ``connect_timeout_s``, or it warns once and yields a placeholder
    (``status.available`` False). torchmetrics is patched when it is imported, not imported here."""
    status = LpipsStatus()
    patched: Dict[str, type] = {}

    def unavailable(reason: str, cached: Path) -> torch.nn.Module:
        status.available = False
        warnings.warn(lpips_unavailable_message(reason, cached), stacklevel=3)
        return _LpipsPlaceholder()

    def build(*args, **kwargs):
        url, cached = lpips_weights(kwargs.get("net_type", args[0] if args else "alex"))
        if not cached.is_file() and not can_reach(url, connect_timeout_s):
            return unavailable(f"{urlparse(url).hostname} is unreachable and nothing is cached", cached)
        previous_timeout = socket.getdefaulttimeout()
        socket.setdefaulttimeout(download_timeout_s)  # a connection dropped mid-download must not hang setup
        try:
            # Building the backbone draws its random initial weights before loading the real ones:
            # keep that off the training's random stream, so a run trains the same with or without
            # LPIPS weights and network.
            with torch.random.fork_rng(devices=[]):
                return patched["class"](*args, **kwargs)
        except Exception as error:  # noqa: BLE001 - any download/IO failure means "no LPIPS"
            return unavailable(f"{type(error).__name__}: {error}", cached)
        finally:
            socket.setdefaulttimeout(previous_timeout)

    def patch(module: ModuleType) -> None:
        patched["module"], patched["class"] = module, module.LearnedPerceptualImagePatchSimilarity
        module.LearnedPerceptualImagePatchSimilarity = build  # type: ignore[attr-defined]

    hook = None
    if LPIPS_MODULE in sys.modules:
        patch(sys.modules[LPIPS_MODULE])
    else:
        hook = _PatchAfterImport(LPIPS_MODULE, patch)
        sys.meta_path.insert(0, hook)
    try:
        yield status
    finally:
        if hook is not None and hook in sys.meta_path:
            sys.meta_path.remove(hook)
        if patched:
            patched["module"].LearnedPerceptualImagePatchSimilarity = patched["class"]


allow_nerfstudio_checkpoints()
install_checkpoint_loader()
