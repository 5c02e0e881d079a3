#!/usr/bin/env bash
# Written for the next two-GPU call (nvidia-h200-x2); NOT RUN YET. It re-measures issues 5 and 6
# after the changes of 2026-11-30 that no two-GPU benchmark has seen (fused Adam in the benchmark's
# step for both implementations; the sharded step's host waits cut from 24 to 4 per step), then
# issue 7's missing strategy at capacity:
#   1. `bytesplat-bench distributed` at 1M and 4M random Gaussians, 8 views of 1080p per step:
#      bytesplat 1 rank vs 2 ranks (dense, sparse-grad, pixel) vs gsplat (1 rank, distributed=True)
#      (distributed.json; issue 5's targets: 1.9x one GPU, 1.5x gsplat distributed);
#   2. the pixel exchange at 100M Gaussians on two ranks, 4 views (pixel_100m.json).
# Writes to $OUT: log.txt and the JSON files named above.
#   device tool: kind nvidia-h200-x2, carry [".whl", ".ext"], timeout_s 600
set -o pipefail
OUT=${OUT:-$PWD/gpu_out}; mkdir -p "$OUT"
BUDGET=${BUDGET:-560}
export BYTESPLAT_DIST_TIMEOUT=${BYTESPLAT_DIST_TIMEOUT:-300}
exec > >(tee -a "$OUT/log.txt") 2>&1
source scripts/gpu_setup.sh || exit 1
source scripts/gpu_train_lib.sh

t=$(( $(left) - 220 )); (( t > 240 )) && t=240
dist_bench distributed 2 $t --num-gaussians 1000000 4000000 --views 8 --warmup 3 --repeats 10 \
  --communicators dense sparse-grad pixel
(( $(left) > 125 )) && capacity pixel_100m 2 100000000 --communicators pixel --skip-one-rank --skip-gsplat
stamp "done"
