#!/usr/bin/env bash
# One two-GPU call (nvidia-h200-x2) after the sync-free training step (no host-device waits between
# densification steps) and fused Adam, every stage bounded by what is left of BUDGET:
#   1. bytesplat (fused) on GPU 0 and splatfacto on GPU 1 at the same time, large scene, 3000
#      iterations, SEEDS seeds each, paired by seed (train_seeds.json);
#   2. GPU 0: the iteration profile with its sync sources (profile.json), then every one-GPU test
#      (tests.log); GPU 1 at the same time: how many Gaussians train on one H200 (bytesplat and
#      gsplat, N1 Gaussians, 4 views of 1080p: capacity_1gpu.json);
#   3. both GPUs: the two-GPU NCCL tests, then N2 Gaussians on two ranks (dense and sparse-grad:
#      capacity_2gpu.json) when enough time is left.
# Writes to $OUT: log.txt and the files named above.
#   device tool: kind nvidia-h200-x2, carry [".whl", ".ext"], timeout_s 600
set -o pipefail
OUT=${OUT:-$PWD/gpu_out}; mkdir -p "$OUT"
BUDGET=${BUDGET:-560}
SEEDS=${SEEDS:-1 2 3}
N1=${N1:-75000000}
N2=${N2:-125000000}
export BYTESPLAT_DIST_TIMEOUT=${BYTESPLAT_DIST_TIMEOUT:-300}
exec > >(tee -a "$OUT/log.txt") 2>&1
SCENES=large
source scripts/gpu_setup.sh || exit 1
source scripts/gpu_train_lib.sh

both 'seeds 0 speed0 large "$SEEDS" bytesplat:fused' 'seeds 1 speed1 large "$SEEDS" splatfacto'
merge train_seeds splatfacto "GPU 0: bytesplat:fused, GPU 1: splatfacto, at the same time; seeds $SEEDS" speed0.json speed1.json

gpu0() {
  export CUDA_VISIBLE_DEVICES=0
  stamp "GPU 0: profile"
  timeout 120 $PY -m bytesplat_ns.bench.profile_train --scene large --warmup-iters 1000 --profile-iters 30 \
    --methods bytesplat:fused --work-dir /tmp/profile_runs --out "$OUT/profile.json" > /tmp/profile.log 2>&1
  stamp "GPU 0: profile rc=$?"; grep -E "^[a-z]|sync x" /tmp/profile.log | head -20 | cut -c1-200
  stamp "GPU 0: one-GPU tests (timeout $(( $(left) - 200 ))s)"
  BYTESPLAT_TEST_GSPLAT_PROJECTION=1 timeout $(( $(left) - 200 )) $PY -m pytest -q -p no:cacheprovider -o addopts="" \
    tests -m gpu -k "not two_gpus and not nccl and not training_run_cross_checked" -rfE --tb=short > "$OUT/tests.log" 2>&1
  stamp "one-GPU tests rc=$? $(tail -n 1 "$OUT/tests.log")"
}
gpu1() {
  export CUDA_VISIBLE_DEVICES=1
  capacity capacity_1gpu 1 $N1
}
both gpu0 gpu1
unset CUDA_VISIBLE_DEVICES
stamp "both GPUs: two-GPU NCCL tests"
timeout 100 $PY -m pytest -q -p no:cacheprovider -o addopts="" tests -k "two_gpus or nccl" -rfEs --tb=short \
  >> "$OUT/tests.log" 2>&1
stamp "two-GPU tests rc=$? $(tail -n 1 "$OUT/tests.log")"
if (( $(left) > 150 )); then
  capacity capacity_2gpu 2 $N2 --communicators dense sparse-grad --skip-one-rank --skip-gsplat
fi
stamp "done"
