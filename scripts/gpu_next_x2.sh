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

t=$(( $(left) - 220 )); (( t > 240 )) && t=240
stamp "both GPUs: distributed benchmark at 1M and 4M (timeout ${t}s)"
timeout $t $PY -m torch.distributed.run --standalone --nproc-per-node 2 -m bytesplat_ns.bench.cli distributed \
  --num-gaussians 1000000 4000000 --views 8 --width 1920 --height 1080 --warmup 3 --repeats 10 \
  --communicators dense sparse-grad pixel --out "$OUT/distributed.json" > /tmp/dist.log 2>&1
stamp "distributed rc=$?"; grep -E "^ +N=|targets" /tmp/dist.log | tail -n 24 | cut -c1-300

t=$(( $(left) - 5 ))
if (( t > 120 )); then
  stamp "both GPUs: pixel at 100M on two ranks (timeout ${t}s)"
  PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True timeout $t $PY -m torch.distributed.run --standalone --nproc-per-node 2 \
    -m bytesplat_ns.bench.cli distributed --num-gaussians 100000000 --views 4 --width 1920 --height 1080 \
    --communicators pixel --skip-one-rank --skip-gsplat --warmup 1 --repeats 2 --out "$OUT/pixel_100m.json" > /tmp/pixel.log 2>&1
  stamp "pixel 100M rc=$?"; grep -E "^ +N=|out of memory|Error" /tmp/pixel.log | head -6 | cut -c1-300
fi
stamp "done"
