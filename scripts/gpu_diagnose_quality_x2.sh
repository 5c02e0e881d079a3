#!/usr/bin/env bash
# Why the one-process sharded run reached only 15.2 dB after 2000 steps on the medium scene on an
# H200 (gpu_next_x2.sh, 2026-11-30) while CPU runs of the same pipeline match `bytesplat`: the same
# run with one GPU-only piece switched back at a time, side by side (three per GPU), each ns-eval'd,
# with its tensorboard events (loss, Gaussian count per step):
#   default (fused compositor, gsplat projection, fused Adam) | BYTESPLAT_PROJECTION=torch |
#   --pipeline.compositor reference | BYTESPLAT_FUSED_ADAM=0 | SH degree 0 | ns-train bytesplat (control).
# Writes to $OUT: log.txt, eval_*.json, events_*/.
#   device tool: kind nvidia-h200-x2, carry [".whl", ".ext"], timeout_s 600
BUDGET=${BUDGET:-330}
ITERS=${ITERS:-2000}
SCENES=medium
source scripts/gpu_begin.sh || exit 1

P=()
D="--pipeline.views-per-step 2 bytesplat-scene --scene-size medium"
( quality default 1 0 $ITERS $D ) & P+=($!)
( BYTESPLAT_PROJECTION=torch quality torchproj 1 0 $ITERS $D ) & P+=($!)
( quality reference 1 0 $ITERS --pipeline.compositor reference $D ) & P+=($!)
( BYTESPLAT_FUSED_ADAM=0 quality plainadam 1 1 $ITERS $D ) & P+=($!)
( quality sh0 1 1 $ITERS --pipeline.model.sh-degree 0 $D ) & P+=($!)
( METHOD=bytesplat quality single 1 1 $ITERS bytesplat-scene --scene-size medium ) & P+=($!)
wait "${P[@]}"
stamp "done"
