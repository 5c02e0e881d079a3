#!/usr/bin/env bash
# Two-GPU call (nvidia-h200-x2): the view groups under the joint-binning memory budget on the GPU,
# and issue 7's capacity figures re-measured with the current sharded step (one fused call per
# group of a rank's views; the figures in docs were measured with the per-view step before).
# GPU 0: every one-GPU test (tests.log; includes the sharded step scored in groups against the
# reference compositor); GPU 1 at the same time: 62.5M Gaussians on one GPU (capacity_1gpu_62m.json).
# Then the two-GPU NCCL tests, then 125M on two GPUs, dense and sparse-grad (capacity_2gpu_125m.json).
#   device tool: kind nvidia-h200-x2, carry [".whl", ".ext"], timeout_s 560
BUDGET=${BUDGET:-550}
source scripts/gpu_begin.sh || exit 1
( gpu_tests_one 0 150 ) & TESTS=$!
( CUDA_VISIBLE_DEVICES=1 dist_bench capacity_1gpu_62m 1 150 --num-gaussians 62500000 --views 4 --warmup 1 --repeats 2 \
    --skip-gsplat ) & CAP1=$!
wait $TESTS $CAP1
grep -E "passed|failed" "$OUT/tests.log" | tail -n 3
( gpu_tests_two ) &
wait $!
capacity capacity_2gpu_125m 2 125000000 --communicators dense sparse-grad --skip-one-rank --skip-gsplat
nvidia-smi --query-gpu=index,memory.used --format=csv,noheader
stamp "done"
