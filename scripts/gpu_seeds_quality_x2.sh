#!/usr/bin/env bash
# Two-GPU call (nvidia-h200-x2), run 2026-11-30 02:58 UTC (log docs/benchmarks/gpu_seeds_quality_h200.log). Issues 5 and 6, quality against
# one GPU shown with seeds instead of one run (one run each gave -0.41 / +0.17 / +0.12 dB on
# 2026-11-30, the size of the run-to-run spread; docs/benchmarks.md "Training quality on two GPUs"):
# for each seed in SEEDS, at the same time: one GPU (bytesplat-distributed, 1 process, the reference),
# two GPUs with sparse-grad, two GPUs with pixel; built-in medium scene at full resolution, 2 views
# per step, ITERS steps, each ns-eval'd. Then the paired differences per seed (quality_seeds.json)
# and each run's median ms per step after warm-up: the first pixel run under nerfstudio's launcher
# since its ranks share the CPU cores and KdCells.locate runs on the GPU (was 180-360 ms per step).
# Alongside, on the same GPUs: every GPU test (gpu_tests; KdCells.locate and migration changed since
# the last GPU test run).
# Writes to $OUT: log.txt, tests.log, quality_seeds.json, evals.tgz (the per-run ns-eval files).
#   device tool: kind nvidia-h200-x2, carry [".whl", ".ext"], timeout_s 600
BUDGET=${BUDGET:-570}
ITERS=${ITERS:-1000}
SEEDS=${SEEDS:-1 2 3}
SCENES=medium
source scripts/gpu_begin.sh || exit 1
EVAL_DIR=/tmp/evals; mkdir -p $EVAL_DIR

Q="--pipeline.model.num-downscales 0 --pipeline.views-per-step 2"
DATA="bytesplat-scene --scene-size medium"
( gpu_tests ) & TESTS=$!
for seed in $SEEDS; do
  (( $(left) < 150 )) && { stamp "stopping before seed $seed: $(left)s left"; break; }
  ( OUT=$EVAL_DIR quality gpu1_s$seed 1 1 $ITERS $Q --machine.seed $seed $DATA ) & A=$!
  ( OUT=$EVAL_DIR quality sparse2_s$seed 2 0,1 $ITERS $Q --machine.seed $seed --pipeline.communicator sparse-grad $DATA ) & B=$!
  ( OUT=$EVAL_DIR quality pixel2_s$seed 2 0,1 $ITERS $Q --machine.seed $seed --pipeline.communicator pixel $DATA ) & C=$!
  wait $A $B $C
done
wait $TESTS
$PY scripts/pair_quality.py --evals $EVAL_DIR --logs /tmp --baseline gpu1 --out "$OUT/quality_seeds.json"
tar czf "$OUT/evals.tgz" -C $EVAL_DIR .
stamp "done"
