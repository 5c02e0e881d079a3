"""Build fussim's CUDA extension against this machine's torch, for the benchmark baselines only.

    python3 scripts/build_fussim.py SRC_DIR SITE_DIR
    python3 scripts/build_fussim.py --target SITE_DIR     # only print where the extension goes

SRC_DIR holds fussim's published CUDA sources (``ext.cpp``, ``ssim.cu``, ``ssim_fp16.cu`` and their
headers: the ``csrc`` folder of its source distribution, which ``scripts/fetch_bench_baselines.sh``
puts in ``.whl_bench/fussim_src``); SITE_DIR is where fussim's Python package is installed
(``SITE_DIR/fussim/__init__.py``). The PyPI wheel's prebuilt extensions are linked against an older
torch and fail to load against torch 2.11 (pybind: incompatible function arguments), so
``scripts/gpu_setup.sh`` runs this on the GPU machine. It compiles with fussim's own nvcc flags
(``-O3 --maxrregcount=32 --use_fast_math``; the C++ standard torch's headers need) for the GPU
present, under the module name fussim looks for (``fussim._cuda_cuXYZ`` for torch's CUDA X.YZ), and
checks the result against pytorch_msssim on random images before it reports success.
"""

from __future__ import annotations

import shutil
import sys
import sysconfig
import tempfile
from pathlib import Path

SOURCES = ("ext.cpp", "ssim.cu", "ssim_fp16.cu")


def module_name() -> str:
    """The extension module fussim imports for this torch's CUDA (``_cuda_cu130`` for CUDA 13.0)."""
    import torch

    major, minor = torch.version.cuda.split(".")[:2]
    return f"_cuda_cu{major}{minor}"


def extension_file(site: Path) -> Path:
    return site / "fussim" / f"{module_name()}{sysconfig.get_config_var('EXT_SUFFIX')}"


def build(src: Path, site: Path) -> Path:
    import torch
    from torch.utils import cpp_extension

    missing = [name for name in SOURCES if not (src / name).is_file()]
    if missing:
        raise SystemExit(f"build_fussim: {src} lacks {', '.join(missing)} (fussim's csrc folder)")
    package = site / "fussim"
    if not (package / "__init__.py").is_file():
        raise SystemExit(f"build_fussim: no fussim package in {site}")
    from bytesplat_ns.raster._build import cxx_std

    major, minor = torch.cuda.get_device_capability()
    std = f"-std={cxx_std()}"
    with tempfile.TemporaryDirectory(prefix="fussim-build-") as build_dir:
        module = cpp_extension.load(
            name=module_name(),
            sources=[str(src / s) for s in SOURCES],
            extra_cflags=["-O3", std],
            extra_cuda_cflags=["-O3", "--maxrregcount=32", "--use_fast_math", std,
                               f"-gencode=arch=compute_{major}{minor},code=sm_{major}{minor}"],
            extra_include_paths=[str(src)],
            build_directory=build_dir,
            verbose=False,
        )
        target = extension_file(site)
        shutil.copyfile(module.__file__, target)
    return target


def check(site: Path) -> float:
    """fussim's SSIM as the benchmark calls it (``bench.baselines.ssim_function``: its
    pytorch_msssim-compatible entry point, splatfacto's settings) against pytorch_msssim's on random
    images: the largest difference of value and gradient."""
    sys.path.insert(0, str(site))
    import torch

    from bytesplat_ns.bench.baselines import ssim_function

    torch.manual_seed(0)
    gt = torch.rand(1, 3, 64, 64, device="cuda")
    pred = torch.rand(1, 3, 64, 64, device="cuda", requires_grad=True)
    values, grads = [], []
    for implementation in ("fussim", "pytorch_msssim"):
        value = ssim_function(implementation)(pred, gt)
        (grad,) = torch.autograd.grad(value, pred)
        values.append(value.detach())
        grads.append(grad)
    return max(float((values[0] - values[1]).abs()), float((grads[0] - grads[1]).abs().max()))


def main(argv) -> int:
    if len(argv) == 2 and argv[0] == "--target":
        print(extension_file(Path(argv[1])))
        return 0
    if len(argv) != 2:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    src, site = Path(argv[0]), Path(argv[1])
    target = build(src, site)
    difference = check(site)
    print(f"build_fussim: {target} built; against pytorch_msssim on random 64x64 images: largest difference {difference:.1e}")
    return 0 if difference < 1e-4 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
