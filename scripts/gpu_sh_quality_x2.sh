#!/usr/bin/env bash
# Two-GPU call (nvidia-h200-x2): training quality through ns-train with the multi-camera SH kernel
# (the sharded step's projection now uses it): bytesplat-distributed on the medium scene, 1000 steps,
# 2 views per step, full resolution, seeds 1 and 2, one process on GPU 1 next to two GPUs with
# sparse-grad (as gpu_seeds_quality_x2.sh, whose seeds 1-8 before the kernel are in
# docs/benchmarks/quality_seeds_h200/); then ns-eval. Writes quality_seeds.json, evals.tgz.
#   device tool: kind nvidia-h200-x2, carry [".whl", ".ext"], timeout_s 280
BUDGET=${BUDGET:-270}
SCENES=medium
source scripts/gpu_begin.sh || exit 1
EVAL_DIR=/tmp/evals; mkdir -p $EVAL_DIR
Q="--pipeline.model.num-downscales 0 --pipeline.views-per-step 2"
DATA="bytesplat-scene --scene-size medium"
for seed in 1 2; do
  (( $(left) < 100 )) && { stamp "stopping before seed $seed: $(left)s left"; break; }
  ( OUT=$EVAL_DIR quality gpu1_s$seed 1 1 1000 $Q --machine.seed $seed $DATA ) & A=$!
  ( OUT=$EVAL_DIR quality sparse2_s$seed 2 0,1 1000 $Q --machine.seed $seed --pipeline.communicator sparse-grad $DATA ) & B=$!
  wait $A $B
done
$PY scripts/pair_quality.py --evals $EVAL_DIR --logs /tmp --baseline gpu1 --out "$OUT/quality_seeds.json"
tar czf "$OUT/evals.tgz" -C $EVAL_DIR .
stamp "done"
