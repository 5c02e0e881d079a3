#!/usr/bin/env bash
# A short two-GPU call (nvidia-h200-x2): GPU 0 reruns the sync-free training-step test; GPU 1 at the
# same time measures bytesplat's one-H200 capacity at N1 Gaussians (4 views of 1080p, no gsplat
# row: gsplat's one-GPU 50M row is in capacity_h200.json).
# Writes to $OUT: log.txt tests.log capacity_1gpu.json.
#   device tool: kind nvidia-h200-x2, carry [".whl", ".ext"], timeout_s 200; BUDGET=190 N1=50000000
set -o pipefail
OUT=${OUT:-$PWD/gpu_out}; mkdir -p "$OUT"
BUDGET=${BUDGET:-190}
N1=${N1:-50000000}
exec > >(tee -a "$OUT/log.txt") 2>&1
source scripts/gpu_setup.sh || exit 1
source scripts/gpu_train_lib.sh

gpu0() {
  export CUDA_VISIBLE_DEVICES=0
  timeout $(( $(left) - 5 )) $PY -m pytest -q -p no:cacheprovider -o addopts="" tests/test_bench_train.py tests/test_optim.py \
    -m gpu -rfE --tb=short > "$OUT/tests.log" 2>&1
  stamp "GPU 0: tests rc=$? $(tail -n 1 "$OUT/tests.log")"
}
gpu1() {
  export CUDA_VISIBLE_DEVICES=1
  capacity capacity_1gpu 1 $N1 --skip-gsplat
}
both gpu0 gpu1
stamp "done"
