#!/usr/bin/env bash
# Written for a later two-GPU call (nvidia-h200-x2); NOT RUN YET. The one-GPU low tail of
# 2026-11-30 (docs/benchmarks.md, "Training quality on two GPUs": 3 of 14 one-process runs scored
# 27.3-28.1 dB, all 16 two-GPU runs 28.5-28.9; a low run's seed scored normally when re-run). Which
# step do low runs part from the others at, and is it the one-process sharded step or one GPU
# rendering two views? Per seed in SEEDS, at once: the one-process sharded run twice (gpu1, gpu1b:
# 2 views per step in one process) and plain `ns-train bytesplat` (one view per step, 2000 steps: the
# same views seen); each with its tensorboard events (train loss, Gaussian count per step) returned.
# Writes to $OUT: log.txt, spread.json (pair_quality.py), runs.tgz (ns-eval files + event files).
#   device tool: kind nvidia-h200-x2, carry [".whl", ".ext"], timeout_s 600
BUDGET=${BUDGET:-570}
SEEDS=${SEEDS:-1 2 3 4 5 6}
SCENES=medium
source scripts/gpu_begin.sh || exit 1
EVAL_DIR=/tmp/evals; mkdir -p $EVAL_DIR
Q="--pipeline.model.num-downscales 0"
DATA="bytesplat-scene --scene-size medium"
set -- $SEEDS
while (( $# > 0 )); do
  (( $(left) < 150 )) && { stamp "stopping before seed $1: $(left)s left"; break; }
  pids=()
  for seed in $1 $2; do  # two seeds at a time: six runs over the two GPUs
    g=$(( seed % 2 ))
    ( OUT=$EVAL_DIR quality gpu1_s$seed 1 $g 1000 $Q --pipeline.views-per-step 2 --machine.seed $seed $DATA ) & pids+=($!)
    ( OUT=$EVAL_DIR quality gpu1b_s$seed 1 $g 1000 $Q --pipeline.views-per-step 2 --machine.seed $seed $DATA ) & pids+=($!)
    ( OUT=$EVAL_DIR METHOD=bytesplat quality plain_s$seed 1 $g 2000 $Q --machine.seed $seed $DATA ) & pids+=($!)
  done
  wait "${pids[@]}"
  shift 2 2>/dev/null || shift $#
done
$PY scripts/pair_quality.py --evals $EVAL_DIR --logs /tmp --baseline gpu1 --out "$OUT/spread.json"
tar czf "$OUT/runs.tgz" -C /tmp evals $(cd /tmp && find quality -name "events.out.tfevents.*")
stamp "done"
