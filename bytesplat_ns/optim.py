"""Adam that takes PyTorch's fused CUDA implementation when its parameters live on a GPU.

nerfstudio builds one ``torch.optim.Adam`` per Gaussian attribute (six per step), and the default
(``foreach``) update launches about nine kernels for each: on a scene the fused rasterizer trains in
a few milliseconds per step, those launches and their Python are a visible share of the iteration
(`bytesplat-bench profile`). ``fused=True`` does the whole update of a group in one kernel: the
same Adam arithmetic, rounded differently in the last bits. On CPU (tests, CPU training) nothing
changes: the default implementation is kept, so CPU runs stay comparable with earlier ones.
``fused_on_gpu=False`` (``--optimizers.<group>.optimizer.fused-on-gpu False``) keeps the default
implementation on the GPU too (A/B runs).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Type

import torch
from nerfstudio.engine.optimizers import AdamOptimizerConfig


def _all_on_cuda(params: list) -> bool:
    tensors = [p for group in params for p in (group["params"] if isinstance(group, dict) else [group])]
    return bool(tensors) and all(isinstance(t, torch.Tensor) and t.is_cuda and t.is_floating_point() for t in tensors)


class DeviceAdam(torch.optim.Adam):
    """``torch.optim.Adam``, fused when ``fused_on_gpu``, every parameter is a CUDA float tensor and
    the caller chose no implementation itself (``fused`` / ``foreach`` given explicitly are respected)."""

    def __init__(self, params: Iterable, fused_on_gpu: bool = True, **kwargs):
        params = list(params)
        chosen = kwargs.get("fused") is not None or kwargs.get("foreach") is not None
        if not chosen and fused_on_gpu and _all_on_cuda(params):
            kwargs["fused"] = True
        super().__init__(params, **kwargs)


@dataclass
class DeviceAdamOptimizerConfig(AdamOptimizerConfig):
    """nerfstudio's Adam config (same fields, same checkpoints) building a :class:`DeviceAdam`."""

    _target: Type = field(default_factory=lambda: DeviceAdam)
    fused_on_gpu: bool = True
    """Use PyTorch's fused Adam (one kernel per group) when every parameter is on the GPU; False keeps the default."""
