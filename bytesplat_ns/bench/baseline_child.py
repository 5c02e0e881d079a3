"""The child process of ``bench.baselines``: time this process's gsplat (the one first on its path)
with each SSIM on ``synthetic_scene``'s random Gaussians, or on the scene of ``--scene-file``
(``bench.scene_file``: e.g. a trained run's); JSON rows to ``--out``."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import List, Optional

from bytesplat_ns.bench.baselines import SSIM_IMPLEMENTATIONS, measure
from bytesplat_ns.bench.timing import QUEUE_MS


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bytesplat_ns.bench.baseline_child",
                                description="time this process's gsplat + each SSIM on one random scene (JSON rows)")
    scene = p.add_mutually_exclusive_group(required=True)
    scene.add_argument("--num-gaussians", type=int)
    scene.add_argument("--scene-file", type=Path, help="a scene written by bench.scene_file.save_scene")
    p.add_argument("--width", type=int, default=1920)
    p.add_argument("--height", type=int, default=1080)
    p.add_argument("--sh-degree", type=int, default=3)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--queue-ms", type=float, default=QUEUE_MS)
    p.add_argument("--projection", choices=["gsplat", "torch"], default="torch")
    p.add_argument("--ssim", nargs="+", default=list(SSIM_IMPLEMENTATIONS), choices=SSIM_IMPLEMENTATIONS)
    p.add_argument("--raster-only", action="store_true")
    p.add_argument("--out", type=Path, required=True)
    a = p.parse_args(argv)
    from bytesplat_ns.bench.raster import StageInputs

    from bytesplat_ns.bench.scene_file import load_scene

    scene = load_scene(a.scene_file) if a.scene_file is not None else None
    inputs = StageInputs(a.num_gaussians or 0, a.width, a.height, a.sh_degree, a.projection, scene=scene)
    rows = measure(inputs, a.ssim, a.warmup, a.repeats, a.raster_only, a.queue_ms)
    a.out.write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
