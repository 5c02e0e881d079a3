#!/usr/bin/env bash
# Two-GPU call (nvidia-h200-x2), run 2026-11-30 03:05 UTC (log docs/benchmarks/gpu_pixel_capacity_h200.log). What the 2026-11-30 calls left:
#   1. `bytesplat-bench matrix`, raster and distributed parts (1M and 4M Gaussians, 1920x1080, 8 views,
#      1 and 2 ranks, dense / sparse-grad / pixel, gsplat): fresh issue 5 numbers (fused Adam in both
#      implementations, the sharded step's fewer host waits) as one matrix run, returned as matrix.tgz;
#   2. the pixel exchange at 100M Gaussians on two ranks, 4 views (issues 6 and 7: pixel_100m.json).
# Writes to $OUT: log.txt, matrix.tgz, pixel_100m.json.
#   device tool: kind nvidia-h200-x2, carry [".whl", ".ext"], timeout_s 600
BUDGET=${BUDGET:-570}
export BYTESPLAT_DIST_TIMEOUT=${BYTESPLAT_DIST_TIMEOUT:-300}
source scripts/gpu_begin.sh || exit 1

matrix_parts 200
capacity pixel_100m 2 100000000 --communicators pixel --skip-one-rank --skip-gsplat
stamp "done"
