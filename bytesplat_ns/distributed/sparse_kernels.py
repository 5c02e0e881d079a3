"""GPU encoder/decoder of the ``sparse-grad`` communicator (``cuda/sparse_grad.cu``), JIT-built.

``encode(grad)`` and ``decode(index, values, sent_index, buffer)`` do on the GPU exactly what
``SparseGradCommunicator.encode``/``decode``'s torch code does (same rows, same order, same bytes;
the decoder adds with atomicAdd straight into the owner's gradient buffer). ``usable(tensor)``
says whether the kernels serve a tensor: a CUDA float32/float64 tensor and the extension builds (the
communicator also asks its ``gpu_kernels`` switch, ``--pipeline.sparse-kernels``). It is built by
the rasterizer's builder as its own small extension (``raster._build.SPARSE_GRAD_KERNELS``:
``sparse_grad.cu`` + ``sparse_grad_bindings.cpp``). If it cannot be built, the communicator warns
once and keeps the torch implementation (same results, more memory traffic).
"""

from __future__ import annotations

import warnings
from typing import Optional, Tuple

import torch
from torch import Tensor

from bytesplat_ns.raster._build import SPARSE_GRAD_KERNELS as EXTENSION

_failed: Optional[str] = None


def load_extension(verbose: bool = False):
    """Build (first use) or load the cached extension; raises ``CudaBuildError`` with the reason."""
    return EXTENSION.load(verbose)


def usable(tensor: Tensor) -> bool:
    """True when the GPU kernels serve ``tensor`` (else the caller uses the torch implementation)."""
    global _failed
    if not tensor.is_cuda or tensor.dtype not in (torch.float32, torch.float64):
        return False
    if _failed is not None:
        return False
    try:
        load_extension()
    except Exception as error:  # noqa: BLE001 - any build failure: fall back, once, loudly
        _failed = str(error)
        warnings.warn(f"bytesplat: sparse-grad GPU kernels unavailable, using the torch implementation: {_failed}", stacklevel=2)
        return False
    return True


def encode(grad: Tensor) -> Tuple[Tensor, Tensor]:
    """[m, G] CUDA gradients -> (index [k] int32 of the rows with any entry != 0, values [k, G])."""
    index, values = load_extension().sparse_grad_encode(grad)
    return index, values


def decode(index: Tensor, values: Tensor, sent_index: Tensor, buffer: Tensor, bad: Optional[Tensor] = None) -> None:
    """``buffer[sent_index[index[i]]] += values[i]`` on the GPU (in place, atomicAdd).

    Out-of-range indices are skipped and flagged: with ``bad`` (an int32 CUDA tensor, zero before)
    the flag is left in ``bad[0]`` for the caller to check once (``check_decoded``) after decoding
    several messages; without it this call checks at once (one host sync)."""
    if not buffer.is_contiguous():
        raise ValueError("the gradient buffer must be contiguous")
    own = bad is None
    if own:
        bad = new_flag(buffer.device)
    load_extension().sparse_grad_decode(index, values, sent_index, buffer, bad)
    if own:
        check_decoded(bad)


def new_flag(device) -> Tensor:
    return torch.zeros(1, dtype=torch.int32, device=device)


def check_decoded(bad: Tensor) -> None:
    if int(bad[0].item()) != 0:
        raise ValueError("malformed sparse gradient message: a record index is out of range")
