"""Every bundled CUDA/C++ source compiles with nvcc against the installed torch (no GPU needed).

One test per file in cuda/; each checks that nvcc exits 0 AND writes the object file. Skipped only
when nvcc is absent. Target sm_90 (H100/H200), the architecture the fused kernels are tuned for.
Each file gets its own nvcc process with the same flags; a module fixture runs them side by side (one
per CPU), and each file's test reads its own result.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.helpers.concurrent_jobs import run_jobs, selected_params, selected_tests
from tests.helpers.nvcc import CUDA_DIR, find_nvcc

SOURCES = sorted(p.name for p in CUDA_DIR.iterdir() if p.suffix in (".cu", ".cpp"))


def test_sources_found():
    assert {"bindings.cpp", "render_fwd.cu", "render_bwd.cu", "fused_loss.cu"} <= set(SOURCES)


def test_jit_builds_list_every_file():
    """Each source in cuda/ is built by exactly one JIT extension, and every header a source includes
    is among its extension's hashed headers (an edit to it rebuilds the extension)."""
    import re

    from bytesplat_ns.raster._build import RASTER_KERNELS, SPARSE_GRAD_KERNELS

    built = [name for ext in (RASTER_KERNELS, SPARSE_GRAD_KERNELS) for name in ext.sources]
    assert sorted(built) == SOURCES
    headers_on_disk = sorted(p.name for p in CUDA_DIR.iterdir() if p.suffix == ".cuh")
    assert sorted(RASTER_KERNELS.headers) == headers_on_disk
    for ext in (RASTER_KERNELS, SPARSE_GRAD_KERNELS):
        for name in ext.sources + ext.headers:
            included = re.findall(r'^#include "([^"]+)"', (CUDA_DIR / name).read_text(), re.M)
            assert set(included) <= set(ext.headers), f"{name} includes {included}, {ext.prefix} hashes {ext.headers}"


def _nvcc_command(nvcc: str) -> list:
    """nvcc and the flags every file is compiled with (the JIT build's: torch's headers and ABI)."""
    import torch

    from bytesplat_ns.raster._build import cxx_std, include_paths

    cmd = [
        nvcc, "-c",
        "-arch=sm_90", f"-std={cxx_std()}", "--expt-relaxed-constexpr",
        f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}",
        "-DTORCH_EXTENSION_NAME=bytesplat_cuda", "-DTORCH_API_INCLUDE_EXTENSION_H",
        "-Xcompiler", "-fPIC",
    ]
    return cmd + [f"-I{p}" for p in (*include_paths(), str(CUDA_DIR))]


def _compile(command: list, name: str, out_dir: Path):
    obj = out_dir / (name + ".o")
    language = ["-x", "c++" if name.endswith(".cpp") else "cu"]
    cmd = command[:2] + language + command[2:] + ["-o", str(obj), str(CUDA_DIR / name)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=900), obj


@pytest.fixture(scope="module")
def compiled(request, tmp_path_factory):
    """Every selected source compiled, side by side (one nvcc per CPU): name -> (process, object file).
    Each file gets its own nvcc run with the flags above; only the waiting is shared."""
    nvcc = find_nvcc()
    if nvcc is None:
        pytest.skip("nvcc not found")
    command, out_dir = _nvcc_command(nvcc), tmp_path_factory.mktemp("nvcc")
    names = selected_params(request, "name")
    if "test_raster_objects_link" in selected_tests(request):
        names += [name for name in SOURCES if name not in names]
    return run_jobs({name: (lambda name=name: _compile(command, name, out_dir)) for name in names})


# The first test waits for all the compiles: about 10 min of CPU for cuda/, about 5 min on two cores.
@pytest.mark.timeout(1800)
@pytest.mark.parametrize("name", SOURCES)
def test_compiles(name, compiled):
    proc, obj = compiled[name]
    assert proc.returncode == 0, f"nvcc failed on {name}:\n{proc.stderr[-6000:]}"
    assert obj.exists() and obj.stat().st_size > 0, f"nvcc wrote no object file for {name}"


def _symbols(obj: Path, which: str) -> set:
    """Demangled bytesplat:: names an object defines as code (``--defined-only``) or needs
    (``--undefined-only``), from nm's ``[address] TYPE name`` lines."""
    import re

    out = subprocess.run(["nm", "-C", which, str(obj)], capture_output=True, text=True, check=True).stdout
    names = set()
    for line in out.splitlines():
        m = re.match(r"^\s*(?:[0-9a-fA-F]+\s+)?([A-Za-z])\s+(.*)$", line)
        if m and "bytesplat::" in m.group(2) and (which == "--undefined-only" or m.group(1) in "TtWw"):
            names.add(m.group(2).strip())
    return names


@pytest.mark.timeout(1800)
def test_raster_objects_link(compiled):
    """Every bytesplat:: function an object of the rasterizer's extension calls (the bindings' ops above
    all) is defined by one of its sources: a file left out of the JIT build's list would otherwise fail
    only when a GPU machine loads the extension."""
    import shutil

    from bytesplat_ns.raster._build import RASTER_KERNELS

    if shutil.which("nm") is None:
        pytest.skip("nm not found")
    defined, needed = {}, set()
    for name in RASTER_KERNELS.sources:
        proc, obj = compiled[name]
        assert proc.returncode == 0, f"nvcc failed on {name}"
        for symbol in _symbols(obj, "--defined-only"):
            defined.setdefault(symbol, []).append(name)
        needed |= _symbols(obj, "--undefined-only")
    assert needed, "the bindings call no bytesplat:: function: the symbol listing is broken"
    missing = sorted(s for s in needed if s not in defined)
    assert not missing, f"called but defined by no source of the build: {missing}"
