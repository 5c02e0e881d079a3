#!/usr/bin/env bash
# Two-GPU call (nvidia-h200-x2) after the plain backward went to 5 blocks per SM (cuda/render.cu):
# 1. GPU 0: every one-GPU test; meanwhile GPU 1: `bytesplat-bench raster` at 1M and 4M (raster.json,
#    culling on and off in the same run), then the README quick start and ns-eval of it;
# 2. the two-GPU NCCL tests;
# 3. issue 5's scaling at 1M and 4M, 8 and 4 views per step, dense and sparse-grad, next to gsplat.
# Writes to $OUT: log.txt, tests.log, raster.json, eval_quickstart.json, scaling_v8.json, scaling_v4.json.
#   device tool: kind nvidia-h200-x2, carry [".whl", ".ext"], timeout_s 600
BUDGET=${BUDGET:-520}
source scripts/gpu_begin.sh || exit 1
( export CUDA_VISIBLE_DEVICES=1; raster_bench raster; quickstart ) &
SIDE_PID=$!
gpu_tests_one
wait $SIDE_PID
gpu_tests_two
dist_scaling 8 4
stamp "done"
