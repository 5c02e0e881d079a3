#!/usr/bin/env bash
# Two-GPU call (nvidia-h200-x2) after per-warp culling and the 256-Gaussian backward chunk:
# 1. issue 3's full training iteration: the built-in large scene, 3000 iterations, full resolution,
#    seeds $SEEDS, bytesplat (fused) on GPU 0 and splatfacto on GPU 1 at the same time, paired by
#    seed (train_seeds.json);
# 2. GPU 0 once its runs are done: `bytesplat-bench raster --trained` on bytesplat's seed-1 run at
#    2.4x (1920x1440; raster_trained.json), then the occupancy variants of the plain backward, each a
#    copy of the installed package with one edit of cuda/render.cu, run from its own directory (the
#    first try, gpu_bwd_occupancy_x2.sh, ran them from the checkout, whose ../cuda won: all four
#    measured the committed kernels): base, bwd5 (__launch_bounds__(kBlock, 5): 48 registers),
#    bwd6 (__launch_bounds__(kBlock, 6): 40 registers, some spill) -> raster_{base,bwd5,bwd6}.json.
# Writes to $OUT: log.txt, train_seeds.json, raster_trained.json, raster_{base,bwd5,bwd6}.json.
#   device tool: kind nvidia-h200-x2, carry [".whl", ".ext"], timeout_s 600
SEEDS=${SEEDS:-1 2 3}
BUDGET=${BUDGET:-480}
SCENES=large
source scripts/gpu_begin.sh || exit 1
BWD='s/__global__ void __launch_bounds__(kBlock) render_bwd_kernel/__global__ void __launch_bounds__(kBlock, MINB) render_bwd_kernel/'
gpu0() {
  seeds 0 seeds0 large "$SEEDS" "bytesplat:fused"
  # built now, with 4 jobs each, so as not to load the host while bytesplat trains (splatfacto may
  # still be training on GPU 1)
  MAX_JOBS=4 variant bwd5 "sed -i '${BWD/MINB/5}' \$CUDA/render.cu" > /tmp/var_bwd5.log 2>&1 & local vb5=$!
  MAX_JOBS=4 variant bwd6 "sed -i '${BWD/MINB/6}' \$CUDA/render.cu" > /tmp/var_bwd6.log 2>&1 & local vb6=$!
  TRAINED=$(ls -d /tmp/runs_seeds0/*seed1*/bytesplat/bench 2>/dev/null | head -1)
  stamp "GPU 0: raster benchmark on $TRAINED"
  timeout 120 $PY -m bytesplat_ns.bench.cli raster --trained $TRAINED --trained-scale 2.4 --warmup 3 \
    --repeats 10 --out "$OUT/raster_trained.json" > /tmp/raster_trained.log 2>&1
  stamp "GPU 0: raster trained rc=$?"; tail -n 2 /tmp/raster_trained.log | cut -c1-1200
  wait $vb5 $vb6; cat /tmp/var_bwd5.log /tmp/var_bwd6.log
  raster_bench raster_base
  for v in bwd5 bwd6; do
    (( $(left) < 40 )) && break
    (cd /tmp/var_$v && PYTHONPATH=/tmp/var_$v:$PYTHONPATH raster_bench raster_$v)
  done
}
both 'gpu0' 'seeds 1 seeds1 large "$SEEDS" splatfacto'
merge train_seeds splatfacto "GPU 0: bytesplat:fused, GPU 1: splatfacto, at the same time; seeds $SEEDS" seeds0.json seeds1.json
stamp "done"
