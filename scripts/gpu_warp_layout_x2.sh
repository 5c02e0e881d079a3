#!/usr/bin/env bash
# Two-GPU call (nvidia-h200-x2): the plain render kernels' warps hold 8x4-pixel blocks instead of
# 16x2 rows (cuda/common.cuh thread_pixel; the culling mask follows the layout). GPU 0: every
# one-GPU test (tests.log); GPU 1 meanwhile: `bytesplat-bench raster` at 1M and 4M (raster.json, with
# culling on and off in the same run). The two-GPU NCCL tests are not run: nothing outside the
# kernels changed (the last device minutes of the session).
# Writes to $OUT: log.txt, tests.log, raster.json.
#   device tool: kind nvidia-h200-x2, carry [".whl", ".ext"], timeout_s 300
BUDGET=${BUDGET:-250}
source scripts/gpu_begin.sh || exit 1
( export CUDA_VISIBLE_DEVICES=1; raster_bench raster ) &
SIDE_PID=$!
gpu_tests_one
wait $SIDE_PID
stamp "done"
