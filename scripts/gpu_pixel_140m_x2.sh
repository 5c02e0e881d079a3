#!/usr/bin/env bash
# Issues 6 and 7: the pixel exchange at the largest count measured for it. At 100M Gaussians on two
# ranks it peaked at 92,966 MiB per GPU (gpu_pixel_capacity_x2.sh, 2026-11-30), 904 MiB per million
# above its 4M run: 140M predicts ~129,000 MiB of the H200's 143,771 (dense/sparse-grad fit 125M
# at 131.1 GiB). Then, in what is left, seeds 7 and 8 of the quality runs (gpu1 / sparse2 / pixel2,
# as gpu_seeds_quality_x2.sh), all six at once.
# Writes to $OUT: log.txt, pixel_140m.json, quality_seeds_78.json, evals.tgz.
#   device tool: kind nvidia-h200-x2, carry [".whl", ".ext"], timeout_s 600
BUDGET=${BUDGET:-540}
ITERS=${ITERS:-1000}
export BYTESPLAT_DIST_TIMEOUT=${BYTESPLAT_DIST_TIMEOUT:-300}
SCENES=medium
source scripts/gpu_begin.sh || exit 1
EVAL_DIR=/tmp/evals; mkdir -p $EVAL_DIR

dist_bench pixel_140m 2 $(( $(left) - 150 )) --num-gaussians 140000000 --views 4 --warmup 1 --repeats 2 \
  --communicators pixel --skip-one-rank --skip-gsplat

Q="--pipeline.model.num-downscales 0 --pipeline.views-per-step 2"
DATA="bytesplat-scene --scene-size medium"
pids=()
for seed in 7 8; do
  ( OUT=$EVAL_DIR quality gpu1_s$seed 1 $(( seed % 2 )) $ITERS $Q --machine.seed $seed $DATA ) & pids+=($!)
  ( OUT=$EVAL_DIR quality sparse2_s$seed 2 0,1 $ITERS $Q --machine.seed $seed --pipeline.communicator sparse-grad $DATA ) & pids+=($!)
  ( OUT=$EVAL_DIR quality pixel2_s$seed 2 0,1 $ITERS $Q --machine.seed $seed --pipeline.communicator pixel $DATA ) & pids+=($!)
done
wait "${pids[@]}"
$PY scripts/pair_quality.py --evals $EVAL_DIR --logs /tmp --baseline gpu1 --out "$OUT/quality_seeds_78.json"
tar czf "$OUT/evals.tgz" -C $EVAL_DIR .
stamp "done"
