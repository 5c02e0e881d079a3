#!/usr/bin/env bash
# A short closing call on two H200s (nvidia-h200-x2), every stage bounded:
#   1. both GPUs: 100M Gaussians on two ranks (`bytesplat-bench distributed`, dense and sparse-grad,
#      4 views of 1920x1080; the all-ranks rows only), while GPU 0 also runs the one-GPU tests
#      (fused kernels incl. the contribution score, sharded step, pruning; they need little memory);
#   2. splatfacto and bytesplat on the large scene at the same time, one per GPU (same GPUs, same
#      host load), when time remains.
# Writes to $OUT: log.txt capacity_100m.json tests.log train_large.json.
#   device tool: kind nvidia-h200-x2, carry [".whl", ".ext"]; BUDGET = seconds this script may use
set -o pipefail
OUT=${OUT:-$PWD/gpu_out}; mkdir -p "$OUT"
export BYTESPLAT_DIST_TIMEOUT=${BYTESPLAT_DIST_TIMEOUT:-300}
BUDGET=${BUDGET:-330}
N=${N:-100000000}
exec > >(tee -a "$OUT/log.txt") 2>&1
source scripts/gpu_setup.sh || exit 1

tests() {
  export CUDA_VISIBLE_DEVICES=0
  stamp "GPU 0: tests"
  BYTESPLAT_TEST_GSPLAT_PROJECTION=1 timeout 150 $PY -m pytest -q -p no:cacheprovider -o addopts="" \
    tests/test_fused_gpu.py tests/test_distributed_gpu.py tests/test_pruning.py tests/test_binning_gpu.py \
    tests/test_sparse_kernels_gpu.py tests/test_pixel_gpu.py \
    -m gpu -k "not training_run_cross_checked" -rfE --tb=short > "$OUT/tests.log" 2>&1
  stamp "GPU 0: tests rc=$? $(tail -n 1 "$OUT/tests.log")"
}
capacity() {
  stamp "both GPUs: N=$N on two ranks (timeout 170s)"
  PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True timeout 170 $PY -m torch.distributed.run --standalone --nproc-per-node 2 \
    -m bytesplat_ns.bench.cli distributed --num-gaussians $N --views 4 --width 1920 --height 1080 \
    --communicators dense sparse-grad --skip-one-rank --skip-gsplat --warmup 1 --repeats 2 \
    --out "$OUT/capacity_100m.json" > /tmp/cap.log 2>&1
  stamp "capacity rc=$?"; grep -E "^ +N=|out of memory|Error" /tmp/cap.log | head -6 | cut -c1-400
}
train() {  # train GPU METHOD
  export CUDA_VISIBLE_DEVICES=$1
  stamp "GPU $1: training $2, large scene, 3000 iterations (timeout $(( $(left) - 5 ))s)"
  timeout $(( $(left) - 5 )) $PY -m bytesplat_ns.bench.train --scene large --iterations 3000 --num-downscales 0 \
    --methods $2 --work-dir /tmp/train_runs_$1 --out /tmp/train_$1.json > /tmp/train_$1.log 2>&1
  stamp "GPU $1: $2 rc=$?"; grep -E "Error" /tmp/train_$1.log | head -3
}

( tests ) > /tmp/tests.log 2>&1 &
PT=$!
capacity
wait $PT; cat /tmp/tests.log
if (( $(left) > 75 )); then
  ( train 0 bytesplat:fused ) > /tmp/t0.log 2>&1 &
  P0=$!
  ( train 1 splatfacto ) > /tmp/t1.log 2>&1 &
  P1=$!
  wait $P0 $P1; cat /tmp/t0.log /tmp/t1.log
  $PY scripts/merge_train_json.py "$OUT/train_large.json" \
    "bytesplat on GPU 0 and splatfacto on GPU 1 at the same time, one process each" /tmp/train_0.json /tmp/train_1.json
else
  stamp "no time left for the training comparison"
fi
stamp "done"
