#!/usr/bin/env bash
# Is bytesplat's training quality equal to splatfacto's? One run per method cannot say (GPU atomics
# and densification make runs of one configuration differ by tenths of a dB), so: SEEDS seeds each,
# the built-in large scene, 3000 iterations, bytesplat (fused) on GPU 0 and splatfacto on GPU 1 at
# the same time (same host load), then one JSON with both, each method's mean and spread, and the
# comparison paired by seed.
# Writes to $OUT: log.txt train_seeds.json (and tests.log with TESTS=1).
#   device tool: kind nvidia-h200-x2, carry [".whl", ".ext"], timeout_s 600
#   SEEDS="1 2 3" METHODS0="bytesplat:fused" METHODS1="splatfacto" bash scripts/gpu_seeds_x2.sh
# TESTS=1 then spends what is left of BUDGET on the GPU tests: every one-GPU test on GPU 0 and the
# two-GPU NCCL tests after it (appends tests.log).
set -o pipefail
OUT=${OUT:-$PWD/gpu_out}; mkdir -p "$OUT"
SEEDS=${SEEDS:-1 2 3}
METHODS0=${METHODS0:-bytesplat:fused}
METHODS1=${METHODS1:-splatfacto}
BUDGET=${BUDGET:-560}
exec > >(tee -a "$OUT/log.txt") 2>&1
SCENES=large
source scripts/gpu_setup.sh || exit 1
source scripts/gpu_train_lib.sh

both 'seeds 0 seeds0 large "$SEEDS" "$METHODS0"' 'seeds 1 seeds1 large "$SEEDS" "$METHODS1"'
merge train_seeds "${METHODS1%% *}" "GPU 0: $METHODS0, GPU 1: $METHODS1, at the same time; seeds $SEEDS" seeds0.json seeds1.json
[[ -n "$TESTS" ]] && gpu_tests
stamp "done"
