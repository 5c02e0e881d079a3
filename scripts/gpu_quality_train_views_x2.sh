#!/usr/bin/env bash
# Two-GPU call (nvidia-h200-x2): issue 5's quality check, with the training views scored too.
# ns-train bytesplat-distributed on the medium scene, 1000 steps, 2 views per step, full
# resolution, seeds 1-4: one process on GPU 1 (gpu1, the baseline), two GPUs with sparse-grad
# (sparse2), and a repeat of the one-process run on GPU 0 (gpu1b: the run-to-run spread of one
# configuration), all three at the same time (times per step are therefore not comparable).
# Each run: ns-eval (held-out views, evals/) and scripts/eval_split.py --split train (the 88
# training views, train/), paired by seed with scripts/pair_quality.py.
# Writes quality_eval.json, quality_train.json, evals.tgz.
#   device tool: kind nvidia-h200-x2, carry [".whl", ".ext"], timeout_s 580
BUDGET=${BUDGET:-570}
SCENES=medium
source scripts/gpu_begin.sh || exit 1
EVAL_DIR=/tmp/evals TRAIN_DIR=/tmp/train_split; mkdir -p $EVAL_DIR $TRAIN_DIR
Q="--pipeline.model.num-downscales 0 --pipeline.views-per-step 2"
DATA="bytesplat-scene --scene-size medium"
train_views() {  # train_views NAME: the run's training views through eval_split.py
  local cfg; cfg=$(find /tmp/quality/$1 -name config.yml | head -1)
  [[ -z "$cfg" ]] && return 1
  CUDA_VISIBLE_DEVICES=${2:-0} timeout 90 $PY scripts/eval_split.py --load-config "$cfg" --split train \
    --out "$TRAIN_DIR/eval_$1.json" >> /tmp/quality_$1.log 2>&1
  stamp "$1 train views rc=$? $(tail -n 1 /tmp/quality_$1.log | cut -c1-120)"
}
for seed in 1 2 3 4; do
  (( $(left) < 150 )) && { stamp "stopping before seed $seed: $(left)s left"; break; }
  ( OUT=$EVAL_DIR quality gpu1_s$seed 1 1 1000 $Q --machine.seed $seed $DATA; train_views gpu1_s$seed 1 ) & A=$!
  ( OUT=$EVAL_DIR quality sparse2_s$seed 2 0,1 1000 $Q --machine.seed $seed --pipeline.communicator sparse-grad $DATA
    train_views sparse2_s$seed 0 ) & B=$!
  ( OUT=$EVAL_DIR quality gpu1b_s$seed 1 0 1000 $Q --machine.seed $seed $DATA; train_views gpu1b_s$seed 0 ) & C=$!
  wait $A $B $C
done
$PY scripts/pair_quality.py --evals $EVAL_DIR --logs /tmp --baseline gpu1 --out "$OUT/quality_eval.json"
$PY scripts/pair_quality.py --evals $TRAIN_DIR --logs /tmp --baseline gpu1 --out "$OUT/quality_train.json"
mkdir -p /tmp/pack/evals /tmp/pack/train; cp $EVAL_DIR/*.json /tmp/pack/evals/; cp $TRAIN_DIR/*.json /tmp/pack/train/
cp /tmp/quality_*.log /tmp/pack/ 2>/dev/null; tar czf "$OUT/evals.tgz" -C /tmp/pack .
stamp "done"
