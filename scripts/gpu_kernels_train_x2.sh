#!/usr/bin/env bash
# Two-GPU call (nvidia-h200-x2) with this session's kernels (rcp_unit in render_bwd, the 32x32 loss
# regions):
# 1. issue 3's full training iteration: the built-in large scene, 3000 iterations, full resolution,
#    seeds $SEEDS, bytesplat (fused) on GPU 0 and splatfacto on GPU 1 at the same time, paired by
#    seed (train_seeds.json); GPU 0 after its seeds: `bytesplat-bench raster --trained` on its seed-1
#    run at 2.4x (1920x1440; raster_trained.json), then the README quick start + ns-eval
#    (eval_quickstart.json);
# 2. issue 5's scaling at 1M and 4M, 8, 4 and 16 views per step, dense and sparse-grad, next to
#    gsplat (scaling_v{8,4,16}.json).
# Writes to $OUT: log.txt, train_seeds.json, raster_trained.json, eval_quickstart.json, scaling_v*.json.
#   device tool: kind nvidia-h200-x2, carry [".whl", ".ext"], timeout_s 600
SEEDS=${SEEDS:-1 2 3 4 5}
BUDGET=${BUDGET:-560}
SCENES=large
source scripts/gpu_begin.sh || exit 1
gpu0() {
  seeds 0 seeds0 large "$SEEDS" "bytesplat:fused"
  TRAINED=$(ls -d /tmp/runs_seeds0/*seed1*/bytesplat/bench 2>/dev/null | head -1)
  stamp "GPU 0: raster benchmark on $TRAINED"
  timeout 120 $PY -m bytesplat_ns.bench.cli raster --trained $TRAINED --trained-scale 2.4 --warmup 3 \
    --repeats 10 --out "$OUT/raster_trained.json" > /tmp/raster_trained.log 2>&1
  stamp "GPU 0: raster trained rc=$?"; tail -n 2 /tmp/raster_trained.log | cut -c1-1200
  quickstart
}
both 'gpu0' 'seeds 1 seeds1 large "$SEEDS" splatfacto'
merge train_seeds splatfacto "GPU 0: bytesplat:fused, GPU 1: splatfacto, at the same time; seeds $SEEDS" seeds0.json seeds1.json
dist_scaling 8 4 16
stamp "done"
