"""Every bundled CUDA/C++ source compiles with nvcc against the installed torch (no GPU needed).

One test per file in cuda/; each checks that nvcc exits 0 AND writes the object file. Skipped only
when nvcc is absent. Target sm_90 (H100/H200), the architecture the fused kernels are tuned for.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sysconfig
from pathlib import Path

import pytest

CUDA_DIR = Path(__file__).resolve().parents[2] / "cuda"
SOURCES = sorted(p.name for p in CUDA_DIR.iterdir() if p.suffix in (".cu", ".cpp"))


def _nvcc():
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    if home and (Path(home) / "bin" / "nvcc").exists():
        return str(Path(home) / "bin" / "nvcc")
    if shutil.which("nvcc"):
        return shutil.which("nvcc")
    for cand in ("/usr/local/cuda/bin/nvcc", "/usr/local/bin/nvcc"):
        if Path(cand).exists():
            return cand
    return None


def _include_paths():
    from torch.utils import cpp_extension

    try:
        paths = cpp_extension.include_paths(device_type="cuda")
    except TypeError:  # torch < 2.6
        paths = cpp_extension.include_paths(cuda=True)
    return list(paths) + [sysconfig.get_paths()["include"], str(CUDA_DIR)]


def test_sources_found():
    assert {"bindings.cpp", "render.cu", "fused_loss.cu"} <= set(SOURCES)


@pytest.mark.timeout(900)
@pytest.mark.parametrize("name", SOURCES)
def test_compiles(name, tmp_path):
    nvcc = _nvcc()
    if nvcc is None:
        pytest.skip("nvcc not found")
    import torch

    from bytesplat_ns.raster._build import cxx_std

    obj = tmp_path / (name + ".o")
    cmd = [
        nvcc, "-c", "-x", "c++" if name.endswith(".cpp") else "cu",
        "-arch=sm_90", f"-std={cxx_std()}", "--expt-relaxed-constexpr",
        f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}",
        "-DTORCH_EXTENSION_NAME=bytesplat_cuda", "-DTORCH_API_INCLUDE_EXTENSION_H",
        "-Xcompiler", "-fPIC",
    ]
    cmd += [f"-I{p}" for p in _include_paths()]
    cmd += ["-o", str(obj), str(CUDA_DIR / name)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, f"nvcc failed on {name}:\n{proc.stderr[-6000:]}"
    assert obj.exists() and obj.stat().st_size > 0, f"nvcc wrote no object file for {name}"
