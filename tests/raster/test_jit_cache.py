"""The JIT build cache: a module built earlier (or unpacked from another machine's build, as
scripts/gpu_setup.sh does) is imported by its hashed name without a rebuild; a broken one is rebuilt.
CPU: a tiny C++ extension stands in for the CUDA kernels."""

import shutil

import pytest
import torch

from bytesplat_ns.raster import _build

SOURCE = """
#include <torch/extension.h>
at::Tensor plus_one(at::Tensor x) { return x + 1; }
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("plus_one", &plus_one); }
"""


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    if shutil.which("c++") is None and shutil.which("g++") is None:
        pytest.fail("the JIT cache test needs a C++ compiler (install.sh installs g++)")
    from torch.utils import cpp_extension

    root = tmp_path_factory.mktemp("jit")
    (root / "plus_one.cpp").write_text(SOURCE)
    build_dir = root / "bytesplat_test_ext"
    build_dir.mkdir()
    cpp_extension.load(name="bytesplat_test_ext", sources=[str(root / "plus_one.cpp")], build_directory=str(build_dir))
    return build_dir


def test_a_built_module_is_imported_from_its_so_alone(built, tmp_path):
    carried = tmp_path / "bytesplat_test_ext"  # only the .so travels: no object files, no ninja records
    carried.mkdir()
    shutil.copy2(built / "bytesplat_test_ext.so", carried)
    module = _build.import_built_module("bytesplat_test_ext", carried)
    assert module is not None and torch.equal(module.plus_one(torch.zeros(2)), torch.ones(2))


def test_no_module_or_a_broken_one_means_build_it(built, tmp_path):
    assert _build.import_built_module("bytesplat_test_ext", tmp_path) is None
    (tmp_path / "bytesplat_other_ext.so").write_bytes(b"\\x7fELF truncated")
    assert _build.import_built_module("bytesplat_other_ext", tmp_path) is None


def test_the_name_covers_the_torch_build(monkeypatch):
    name = _build.RASTER_KERNELS.name("90")
    monkeypatch.setattr(torch, "__version__", torch.__version__ + ".other")
    assert _build.RASTER_KERNELS.name("90") != name
    assert name.startswith("bytesplat_cuda_90_")
