#!/usr/bin/env bash
# One two-GPU call (nvidia-h200-x2) for issues 5, 6 and 7, every stage bounded by what is left of BUDGET:
#   1. quality at full resolution (--pipeline.model.num-downscales 0: the earlier runs trained at a
#      quarter of the eval resolution, gpu_diagnose_quality_x2.sh), built-in medium scene, 2 views per
#      step, a checkpoint every 100 steps, three runs at the same time: one GPU (bytesplat-distributed,
#      1 process; the reference run) and two GPUs with sparse-grad, ITERS steps each, and two GPUs
#      with pixel, P_ITERS steps (its step took ~360 ms in ns-train on H200s, gpu_next_x2.sh); each
#      ns-eval'd at its end (eval_{gpu1,sparse2,pixel2}.json) and the first two also at the pixel
#      run's last step (eval_{gpu1,sparse2}_STEP.json): the same-step comparison;
#   2. alone: cProfile of both ranks of a short two-GPU pixel run (profile_rank{0,1}.txt): where the
#      pixel step's time goes;
#   3. alone: `bytesplat-bench matrix` with its raster and distributed pieces (1M and 4M Gaussians,
#      1920x1080, 8 views, 1 and 2 ranks, dense / sparse-grad / pixel, gsplat) into $OUT/matrix.tgz.
# Writes to $OUT: log.txt and the files named above.
#   device tool: kind nvidia-h200-x2, carry [".whl", ".ext"], timeout_s 600
BUDGET=${BUDGET:-570}
ITERS=${ITERS:-1000}
P_ITERS=${P_ITERS:-401}  # the last checkpoint at step 400 (nerfstudio saves at max - 1)
export BYTESPLAT_DIST_TIMEOUT=${BYTESPLAT_DIST_TIMEOUT:-300}
SCENES=medium
source scripts/gpu_begin.sh || exit 1

Q="--steps-per-save 100 --pipeline.model.num-downscales 0 --pipeline.views-per-step 2"
DATA="bytesplat-scene --scene-size medium"
( quality gpu1 1 1 $ITERS $Q $DATA ) & A=$!
( quality sparse2 2 0,1 $ITERS $Q --pipeline.communicator sparse-grad $DATA ) & B=$!
( BUDGET=$(( BUDGET - 300 )) quality pixel2 2 0,1 $P_ITERS $Q --pipeline.communicator pixel $DATA ) & C=$!
wait $A $B $C
last=$(ls /tmp/quality/pixel2/*/run/nerfstudio_models/ 2>/dev/null | sed 's/step-0*\([0-9]*\).ckpt/\1/' | sort -n | tail -n 1)
if [[ -n "$last" ]]; then
  ( CUDA_VISIBLE_DEVICES=0 eval_at gpu1 $last ) & A=$!
  ( CUDA_VISIBLE_DEVICES=1 eval_at sparse2 $last ) & B=$!
  wait $A $B
fi

stamp "both GPUs: cProfile of a two-GPU pixel run (60 steps)"
timeout 90 $PY -m torch.distributed.run --standalone --nproc-per-node 2 scripts/profile_rank.py "$OUT" bytesplat_ns.train \
  bytesplat-distributed --output-dir /tmp/prof --timestamp run --vis tensorboard --max-num-iterations 60 \
  --pipeline.communicator pixel --pipeline.model.num-downscales 0 $DATA > /tmp/prof.log 2>&1
stamp "pixel profile rc=$? $(grep -E '^ *50 \(' /tmp/prof.log | tail -n 1)"
grep -A 25 "Ordered by: internal" "$OUT/profile_rank0.txt" | head -30 | cut -c1-160

t=$(( $(left) - 5 )); (( t > 200 )) && t=200
matrix_parts $t
stamp "done"
