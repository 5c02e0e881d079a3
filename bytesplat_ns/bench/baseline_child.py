"""The child process of ``bench.baselines``: time this process's gsplat (the one first on its path)
with each SSIM on ``synthetic_scene``'s random Gaussians; JSON rows to ``--out``."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import List, Optional

from bytesplat_ns.bench.baselines import SSIM_IMPLEMENTATIONS, measure


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bytesplat_ns.bench.baseline_child",
                                description="time this process's gsplat + each SSIM on one random scene (JSON rows)")
    p.add_argument("--num-gaussians", type=int, required=True)
    p.add_argument("--width", type=int, default=1920)
    p.add_argument("--height", type=int, default=1080)
    p.add_argument("--sh-degree", type=int, default=3)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--projection", choices=["gsplat", "torch"], default="torch")
    p.add_argument("--ssim", nargs="+", default=list(SSIM_IMPLEMENTATIONS), choices=SSIM_IMPLEMENTATIONS)
    p.add_argument("--raster-only", action="store_true")
    p.add_argument("--out", type=Path, required=True)
    a = p.parse_args(argv)
    from bytesplat_ns.bench.raster import StageInputs

    inputs = StageInputs(a.num_gaussians, a.width, a.height, a.sh_degree, a.projection)
    rows = measure(inputs, a.ssim, a.warmup, a.repeats, a.raster_only)
    a.out.write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
