#!/usr/bin/env bash
# Fused backend quality on one GPU: every fused GPU test (kernels vs the torch twins and vs gsplat,
# the model's fused step vs gsplat's, a 901-iteration run cross-checked every 100 steps), next to
# the side-by-side training benchmark bytesplat:gsplat vs bytesplat:fused on the built-in scene
# with hardware-aware pruning off (rasterizers alone) and the fused step cross-checked against the
# unfused one every CHECK steps. Output under $OUT (default ./gpu_out), at most 6 files:
#   tests.log, train.json, train.log, gsplat_cuda.so (for later runs' .ext/).
#   ITERS=3000 SCENE=medium bash scripts/gpu_fused_quality.sh
set -o pipefail
OUT=${OUT:-$PWD/gpu_out}; mkdir -p "$OUT"
ITERS=${ITERS:-3000}; SCENE=${SCENE:-medium}; CHECK=${CHECK:-500}
METHODS=${METHODS:-bytesplat:gsplat bytesplat:fused}
source scripts/gpu_setup.sh 2>&1 || exit 1

stamp "fused GPU tests (background) + training benchmark: $METHODS ($SCENE, $ITERS iterations)"
( BYTESPLAT_TEST_GSPLAT_PROJECTION=1 timeout ${TEST_TIMEOUT:-420} $PY -m pytest -q -p no:cacheprovider -o addopts="" \
    tests/test_fused_gpu.py -rA --tb=short --durations=10 > "$OUT/tests.log" 2>&1; echo "tests rc=$?" >> "$OUT/tests.log" ) &
TESTS_PID=$!
BYTESPLAT_FUSED_CHECK=$CHECK timeout ${TRAIN_TIMEOUT:-420} $PY -m bytesplat_ns.bench.train --scene "$SCENE" \
  --iterations "$ITERS" --methods $METHODS --num-downscales 0 --hw-prune off \
  --work-dir /tmp/bench_outputs --out "$OUT/train.json" > "$OUT/train.log" 2>&1
stamp "training benchmark rc=$?"
grep -E "fused check" "$OUT/train.log" | cut -c1-400
grep -A12 '"label"' "$OUT/train.log" | grep -E 'label|ms_per|psnr|ssim"|num_gauss'
wait $TESTS_PID
grep -E "^(PASSED|FAILED|ERROR)|passed|failed|rc=" "$OUT/tests.log" | tail -60
stamp "done"
