"""JIT build of the bundled CUDA kernels (``cuda/`` in the repo, ``bytesplat_ns.cuda`` installed).

One builder (:class:`JitExtension`) for both extensions: :data:`RASTER_KERNELS` (the rasterizer:
render, fused loss, binning, SH of several views) and :data:`SPARSE_GRAD_KERNELS` (the sparse-grad
communicator's encoder/decoder, a separate small extension that builds in seconds).
``load_extension()`` compiles the rasterizer's sources with ``torch.utils.cpp_extension.load`` on first use for
the current GPU's architecture, caches the result (``TORCH_EXTENSIONS_DIR``, else torch's default
cache) and returns the module. The build's name hashes everything it depends on (sources, headers,
flags, the torch build), so a module of that name in the cache is imported as it is, without torch's
ninja check: a module carried from another machine's build needs only its ``.so``. Every reason it cannot (no CUDA device, no nvcc, a GPU older than
compute capability 7.0, a compiler error) raises :class:`CudaBuildError` with one message naming
the cause. Only where the build runs is configured by the environment, as with gsplat: ``MAX_JOBS``
(torch's ninja build) and ``TORCH_EXTENSIONS_DIR`` (the cache). Nothing in the environment changes the
flags: what the kernels compute is chosen by config fields (``FusedOptions``), recorded in config.yml.
"""

from __future__ import annotations

import hashlib
import importlib.resources
import os
import shutil
import sys
import threading
from pathlib import Path
from typing import List, Optional

try:  # the project's user-error type, when present
    from bytesplat_ns.errors import BytesplatError as _ErrorBase
except Exception:  # pragma: no cover - errors.py is optional for this module
    _ErrorBase = RuntimeError  # type: ignore[misc,assignment]

MIN_COMPUTE_CAPABILITY = (7, 0)
SOURCES = ("bindings.cpp", "render_fwd.cu", "render_bwd.cu", "fused_loss.cu", "loss_grad.cu", "binning.cu",
           "tile_reach.cu", "warp_masks.cu", "sh_views_fwd.cu", "sh_views_bwd.cu", "adam.cu")
HEADERS = ("common.cuh", "render.cuh", "ssim_tile.cuh", "sh_views.cuh")
SPARSE_GRAD_SOURCES = ("sparse_grad.cu", "sparse_grad_bindings.cpp")


class CudaBuildError(_ErrorBase):  # type: ignore[misc,valid-type]
    """The fused CUDA kernels cannot be built or loaded here (the message says why)."""


def cuda_source_dir() -> Path:
    """Directory holding the bundled .cu/.cuh/.cpp files (editable and normal installs map the
    package ``bytesplat_ns.cuda`` to it; a plain source checkout on PYTHONPATH has it at ../cuda)."""
    try:
        d = Path(str(importlib.resources.files("bytesplat_ns.cuda")))
        if (d / SOURCES[0]).exists():
            return d
    except ModuleNotFoundError:
        pass
    import bytesplat_ns

    return Path(bytesplat_ns.__file__).resolve().parent.parent / "cuda"


def _nvcc_path() -> Optional[str]:
    from torch.utils import cpp_extension

    home = cpp_extension.CUDA_HOME
    if home:
        cand = Path(home) / "bin" / "nvcc"
        if cand.exists():
            return str(cand)
    return shutil.which("nvcc")


def cxx_std() -> str:
    """The C++ standard torch's headers need (torch >= 2.10 headers require C++20)."""
    import torch

    ver = tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:2])
    return "c++20" if ver >= (2, 10) else "c++17"


def cxx_flags() -> List[str]:
    """The host compiler's flags for the bindings."""
    return ["-O3", f"-std={cxx_std()}"]


def nvcc_flags(arch: str) -> List[str]:
    return [
        "-O3",
        f"-std={cxx_std()}",
        "--expt-relaxed-constexpr",
        f"-gencode=arch=compute_{arch},code=sm_{arch}",
        "-lineinfo",
    ]


def include_paths() -> List[str]:
    """torch's C++/CUDA headers and Python's: what a bundled source includes besides cuda/ (for compiling
    one outside torch's JIT build: the CPU compile test, ``bytesplat-bench sass``)."""
    import sysconfig

    from torch.utils import cpp_extension

    try:
        paths = cpp_extension.include_paths(device_type="cuda")
    except TypeError:  # torch < 2.6
        paths = cpp_extension.include_paths(cuda=True)
    return list(paths) + [sysconfig.get_paths()["include"]]


def _check_device():
    import torch

    if not torch.cuda.is_available():
        raise CudaBuildError(
            "The fused rasterizer needs a CUDA GPU, but torch sees none "
            f"(torch {torch.__version__}, built with CUDA {torch.version.cuda}). "
            "Use the 'reference' (CPU) or 'gsplat' backend instead."
        )
    if torch.version.cuda is None:
        raise CudaBuildError(f"torch {torch.__version__} is a CPU-only build; install a CUDA build of torch.")
    dev = torch.cuda.current_device()
    cc = torch.cuda.get_device_capability(dev)
    if cc < MIN_COMPUTE_CAPABILITY:
        raise CudaBuildError(
            f"GPU '{torch.cuda.get_device_name(dev)}' has compute capability {cc[0]}.{cc[1]}; "
            f"the fused rasterizer needs {MIN_COMPUTE_CAPABILITY[0]}.{MIN_COMPUTE_CAPABILITY[1]} or newer."
        )
    return cc


def import_built_module(name: str, build_dir: Path):
    """The module ``build_dir/NAME.so`` as built earlier (here, or on another machine and unpacked into the
    cache: ``scripts/gpu_setup.sh``), imported without torch's ninja check, or None when there is none or
    it does not import (a partial file: the caller builds it again). The name's hash stands for the check:
    it covers everything the build depends on (:meth:`JitExtension.name`), and the object files ninja
    would compare need not be there."""
    import importlib.util

    path = build_dir / f"{name}.so"
    if not path.is_file():
        return None
    try:
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    except (ImportError, OSError):
        return None
    return module


class JitExtension:
    """One extension JIT-built from bundled sources in ``cuda/`` for the current GPU.

    The build is named after a hash of its sources, headers and flags (an edit or another GPU never
    reuses a stale build), cached by torch, and loaded once per process. Every reason it cannot be
    built raises :class:`CudaBuildError` naming the cause; a message is printed while building."""

    def __init__(self, prefix: str, what: str, sources, headers=()):
        self.prefix, self.what = prefix, what
        self.sources, self.headers = tuple(sources), tuple(headers)
        self._lock = threading.Lock()
        self._module = None

    def source_paths(self) -> List[Path]:
        d = cuda_source_dir()
        return [d / s for s in self.sources]

    def name(self, arch: str) -> str:
        """``PREFIX_ARCH_HASH``: the hash covers the sources, headers, both compilers' flags and the torch
        build they link against, so a module of this name in the cache was built from exactly these."""
        import torch

        h = hashlib.sha1()
        d = cuda_source_dir()
        for name in self.sources + self.headers:
            h.update(name.encode())
            h.update((d / name).read_bytes())
        h.update(" ".join(nvcc_flags(arch)).encode())
        h.update(f"{' '.join(cxx_flags())} torch {torch.__version__} cuda {torch.version.cuda}".encode())
        return f"{self.prefix}_{arch}_{h.hexdigest()[:10]}"

    def load(self, verbose: bool = False):
        """Build (first use) or load the cached extension and return it."""
        if self._module is not None:
            return self._module
        with self._lock:
            if self._module is None:
                self._module = self._build(verbose)
            return self._module

    def _build(self, verbose: bool):
        cc = _check_device()
        if _nvcc_path() is None:
            raise CudaBuildError(
                f"Building {self.what} needs the CUDA toolkit's nvcc, which was not found "
                "(set CUDA_HOME or put nvcc on PATH)."
            )
        for p in self.source_paths():
            if not p.exists():
                raise CudaBuildError(f"CUDA source {p} is missing from the installation (reinstall bytesplat-ns).")
        from torch.utils import cpp_extension

        arch = f"{cc[0]}{cc[1]}"
        name = self.name(arch)
        build_dir = Path(cpp_extension._get_build_directory(name, verbose=False))
        built = import_built_module(name, build_dir)
        if built is not None:
            return built
        cached = any(build_dir.glob(f"{name}*.so")) or any(build_dir.glob(f"{name}*.pyd"))
        if not cached:
            print(f"Building {self.what} for sm_{arch} (first use, ~1 min) in {build_dir} ...", file=sys.stderr, flush=True)
        # torch adds -gencode flags from TORCH_CUDA_ARCH_LIST (else from every visible GPU);
        # pin it to this device so exactly one architecture is compiled.
        old_arch = os.environ.get("TORCH_CUDA_ARCH_LIST")
        os.environ["TORCH_CUDA_ARCH_LIST"] = f"{cc[0]}.{cc[1]}"
        try:
            module = cpp_extension.load(
                name=name,
                sources=[str(p) for p in self.source_paths()],
                extra_cflags=cxx_flags(),
                extra_cuda_cflags=nvcc_flags(arch),
                extra_include_paths=[str(cuda_source_dir())],
                build_directory=str(build_dir),
                verbose=verbose,
            )
        except Exception as e:  # compiler / linker errors
            raise CudaBuildError(
                f"Building {self.what} failed ({type(e).__name__}: {str(e).strip()[-2000:]}). "
                f"Build directory: {build_dir}; rerun with verbose=True for the compiler output."
            ) from e
        finally:
            if old_arch is None:
                os.environ.pop("TORCH_CUDA_ARCH_LIST", None)
            else:
                os.environ["TORCH_CUDA_ARCH_LIST"] = old_arch
        if not cached:
            print(f"Built {self.what}.", file=sys.stderr, flush=True)
        return module


# The rasterizer's kernels (render, fused loss, binning, SH of several views).
RASTER_KERNELS = JitExtension("bytesplat_cuda", "the bytesplat CUDA kernels", SOURCES, HEADERS)
# The sparse-grad communicator's kernels: built independently of the rasterizer's.
SPARSE_GRAD_KERNELS = JitExtension("bytesplat_sparse_grad", "the bytesplat sparse-grad CUDA kernels",
                                   SPARSE_GRAD_SOURCES)


def load_extension(verbose: bool = False):
    """Build (first use) or load the rasterizer's cached CUDA extension and return it."""
    return RASTER_KERNELS.load(verbose)
