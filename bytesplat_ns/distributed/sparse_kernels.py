"""GPU encoder/decoder of the ``sparse-grad`` communicator (``cuda/sparse_grad.cu``), JIT-built.

``encode(grad)`` and ``decode(index, values, sent_index, buffer)`` do on the GPU exactly what
``SparseGradCommunicator.encode``/``decode``'s torch code does (same rows, same order, same bytes;
the decoder adds with atomicAdd straight into the owner's gradient buffer). ``usable(tensor)``
says whether the kernels serve a tensor: a CUDA float32/float64 tensor, the extension builds, and
``BYTESPLAT_SPARSE_KERNELS`` is not ``0``. The build uses the rasterizer's helpers
(``bytesplat_ns.raster._build``: device check, nvcc, flags) but is a separate, small extension
(``sparse_grad.cu`` + ``sparse_grad_bindings.cpp``) so it builds in seconds and independently of
the rasterizer's kernels. If it cannot be built, the communicator warns once and keeps the torch
implementation (same results, more memory traffic).
"""

from __future__ import annotations

import hashlib
import os
import sys
import threading
import warnings
from pathlib import Path
from typing import List, Optional, Tuple

import torch
from torch import Tensor

SOURCES = ("sparse_grad.cu", "sparse_grad_bindings.cpp")
ENV_SWITCH = "BYTESPLAT_SPARSE_KERNELS"

_lock = threading.Lock()
_module = None
_failed: Optional[str] = None


def source_paths() -> List[Path]:
    from bytesplat_ns.raster._build import cuda_source_dir

    d = cuda_source_dir()
    return [d / s for s in SOURCES]


def _extension_name(arch: str) -> str:
    from bytesplat_ns.raster._build import nvcc_flags

    h = hashlib.sha1()
    for p in source_paths():
        h.update(p.name.encode())
        h.update(p.read_bytes())
    h.update(" ".join(nvcc_flags(arch)).encode())
    return f"bytesplat_sparse_grad_{arch}_{h.hexdigest()[:10]}"


def load_extension(verbose: bool = False):
    """Build (first use) or load the cached extension; raises ``CudaBuildError`` with the reason."""
    global _module
    if _module is not None:
        return _module
    with _lock:
        if _module is not None:
            return _module
        from torch.utils import cpp_extension

        from bytesplat_ns.raster._build import CudaBuildError, _check_device, _nvcc_path, cxx_std, nvcc_flags

        cc = _check_device()
        if _nvcc_path() is None:
            raise CudaBuildError("Building the sparse-grad kernels needs the CUDA toolkit's nvcc (set CUDA_HOME or put nvcc on PATH).")
        for p in source_paths():
            if not p.exists():
                raise CudaBuildError(f"CUDA source {p} is missing from the installation (reinstall bytesplat-ns).")
        arch = f"{cc[0]}{cc[1]}"
        name = _extension_name(arch)
        build_dir = Path(cpp_extension._get_build_directory(name, verbose=False))
        old_arch = os.environ.get("TORCH_CUDA_ARCH_LIST")
        os.environ["TORCH_CUDA_ARCH_LIST"] = f"{cc[0]}.{cc[1]}"
        try:
            if not any(build_dir.glob(f"{name}*.so")):
                print(f"Building bytesplat sparse-grad kernels for sm_{arch} in {build_dir} ...", file=sys.stderr, flush=True)
            _module = cpp_extension.load(
                name=name,
                sources=[str(p) for p in source_paths()],
                extra_cflags=["-O3", f"-std={cxx_std()}"],
                extra_cuda_cflags=nvcc_flags(arch),
                build_directory=str(build_dir),
                verbose=verbose,
            )
        except Exception as error:  # compiler / linker errors
            raise CudaBuildError(
                f"Building the sparse-grad CUDA kernels failed ({type(error).__name__}: {str(error).strip()[-1500:]}). "
                f"Build directory: {build_dir}."
            ) from error
        finally:
            if old_arch is None:
                os.environ.pop("TORCH_CUDA_ARCH_LIST", None)
            else:
                os.environ["TORCH_CUDA_ARCH_LIST"] = old_arch
        return _module


def usable(tensor: Tensor) -> bool:
    """True when the GPU kernels serve ``tensor`` (else the caller uses the torch implementation)."""
    global _failed
    if not tensor.is_cuda or tensor.dtype not in (torch.float32, torch.float64):
        return False
    if os.environ.get(ENV_SWITCH, "1") == "0" or _failed is not None:
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
