"""Device-memory traffic of one raster+loss stage (fused vs gsplat), for Nsight Compute.

Runs the stage a few times to warm up, then exactly once between ``cudaProfilerStart/Stop``;
``ncu --profile-from-start off`` then measures only that run's kernels. ``--parse`` sums ncu's
CSV (``dram__bytes_read.sum``, ``dram__bytes_write.sum``, base units) into one JSON line.

    ncu --profile-from-start off --metrics dram__bytes_read.sum,dram__bytes_write.sum --csv \\
        --print-units base python -m bytesplat_ns.bench.dram --stage fused --num-gaussians 1000000 > fused.csv
    python -m bytesplat_ns.bench.dram --parse fused.csv

Stages: ``fused`` (two launches of the fused kernel), ``fused-one-launch``, ``fused-split``
(render_fwd -> loss_grad -> render_bwd), ``gsplat`` (rasterize_to_pixels + torch loss).
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import sys
from typing import Dict, List, Optional

METRICS = ("dram__bytes_read.sum", "dram__bytes_write.sum")


def parse_ncu_csv(text: str) -> Dict[str, float]:
    """Sum each metric over all profiled kernels of an ``ncu --csv --print-units base`` report."""
    start = text.find('"ID"')
    if start < 0:
        raise ValueError("no ncu CSV table in the input")
    totals = {m: 0.0 for m in METRICS}
    kernels = set()
    for row in csv.DictReader(io.StringIO(text[start:])):
        name = row.get("Metric Name")
        if name in totals:
            totals[name] += float(str(row.get("Metric Value", "0")).replace(",", ""))
            kernels.add(row.get("ID"))
    return {"kernels": len(kernels), "dram_read_bytes": totals[METRICS[0]],
            "dram_write_bytes": totals[METRICS[1]], "dram_bytes": totals[METRICS[0]] + totals[METRICS[1]]}


def run_stage(stage: str, n: int, width: int, height: int, sh_degree: int, warmup: int) -> None:
    import torch

    from bytesplat_ns.bench.raster import StageInputs

    inp = StageInputs(n, width, height, sh_degree)
    step = {"fused": lambda: inp.fused_raster_loss(schedule="two_launch"),
            "fused-one-launch": lambda: inp.fused_raster_loss(schedule="one_launch"),
            "fused-split": lambda: inp.fused_raster_loss(schedule="split")}.get(stage)
    if stage == "gsplat":
        binned = inp.gsplat_binning()
        step = lambda: inp.gsplat_raster_loss(binned)  # noqa: E731
    if step is None:
        raise SystemExit(f"unknown stage {stage!r}")
    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    step()
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()


def main(argv: Optional[List[str]] = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--stage", choices=["fused", "fused-one-launch", "fused-split", "gsplat"],
                   help="fused: two launches (the default schedule); fused-split: render_fwd -> loss_grad -> render_bwd")
    p.add_argument("--num-gaussians", type=int, default=1_000_000)
    p.add_argument("--width", type=int, default=1920)
    p.add_argument("--height", type=int, default=1080)
    p.add_argument("--sh-degree", type=int, default=3)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--parse", type=str, default=None, help="an ncu CSV file to sum")
    a = p.parse_args(argv)
    if a.parse:
        with open(a.parse) as f:
            print(json.dumps(parse_ncu_csv(f.read())))
        return
    if not a.stage:
        p.error("--stage or --parse is required")
    run_stage(a.stage, a.num_gaussians, a.width, a.height, a.sh_degree, a.warmup)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
