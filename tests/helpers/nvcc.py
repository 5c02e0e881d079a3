"""Where the CUDA compiler is, for the tests that run nvcc without a GPU (compiles, host programs)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Optional

CUDA_DIR = Path(__file__).resolve().parents[2] / "cuda"


def find_nvcc() -> Optional[str]:
    """nvcc from CUDA_HOME / CUDA_PATH, the PATH, or the usual install folders; None when absent."""
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    if home and (Path(home) / "bin" / "nvcc").exists():
        return str(Path(home) / "bin" / "nvcc")
    if shutil.which("nvcc"):
        return shutil.which("nvcc")
    for cand in ("/usr/local/cuda/bin/nvcc", "/usr/local/bin/nvcc"):
        if Path(cand).exists():
            return cand
    return None
