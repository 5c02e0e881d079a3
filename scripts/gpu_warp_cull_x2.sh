#!/usr/bin/env bash
# Two-GPU call (nvidia-h200-x2) after the kernels learned per-warp culling (cuda/common.cuh,
# warp_mask: a warp skips the Gaussians that cannot reach alpha 1/255 at any of its 32 pixels).
# 1. GPU 0: every one-GPU test (tests/test_fused_gpu.py holds the culled kernels against the
#    reference, an edge-case scene included); meanwhile GPU 1: `bytesplat-bench raster` at 1M and
#    4M, 1920x1080, with culling (raster_cull.json) and, from an A/B build without it
#    (BYTESPLAT_WARP_CULL=0), without (raster_nocull.json);
# 2. the two-GPU NCCL tests;
# 3. issue 5's scaling at 1M and 4M, 8 and 4 views per step, dense and sparse-grad, next to gsplat.
# Writes to $OUT: log.txt, tests.log, raster_cull.json, raster_nocull.json, scaling_v8.json, scaling_v4.json.
# Record of the run of 2026-11-30 06:13 UTC (docs/benchmarks/warp_cull_h200/): then, BYTESPLAT_WARP_CULL=0
# selected a second build compiled with -DBYTESPLAT_NO_WARP_CULL; it is now a runtime switch of the
# same build (bytesplat_ns/raster/fused.py warp_cull), so the A/B build step only reloads. Its
# tests.log has 3 failures of the first form of the culling GPU test, which compared the culled
# kernels with the torch twin pixel for pixel on the edge scene and tripped on float differences
# at the 1/255 threshold (3e-5); it now compares culling on with off, bit for bit.
#   device tool: kind nvidia-h200-x2, carry [".whl", ".ext"], timeout_s 600
BUDGET=${BUDGET:-570}
source scripts/gpu_begin.sh || exit 1
(
  export CUDA_VISIBLE_DEVICES=1
  raster_bench raster_cull
  stamp "A/B build without per-warp culling"
  BYTESPLAT_WARP_CULL=0 timeout 240 $PY -c "from bytesplat_ns.raster._build import load_extension; load_extension()" 2>&1 | tail -n 2
  BYTESPLAT_WARP_CULL=0 raster_bench raster_nocull
) &
RASTER_PID=$!
gpu_tests_one
wait $RASTER_PID
gpu_tests_two
dist_scaling 8 4
stamp "done"
