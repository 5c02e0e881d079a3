#!/usr/bin/env bash
# One two-GPU call (nvidia-h200-x2) for issue 3's full-iteration target and issue 4's pruning
# measurement, every stage bounded by what is left of BUDGET:
#   1. speed at equal quality: bytesplat (fused) on GPU 0 and splatfacto on GPU 1 at the same time,
#      large scene, 3000 iterations, SEEDS seeds each, paired by seed (train_seeds.json);
#   2. pruning off (GPU 0) vs on (GPU 1) at the same time, tile occupancy every 100 steps, on the
#      large scene (prune_large.json) and then the medium one (prune_medium.json), PRUNE_SEEDS each;
#   3. GPU 0: where the iteration's time and host-device waits go (profile.json, with sync sources);
#      GPU 1: the raster benchmark on a phase-1 bytesplat run (the pruning score's cost included,
#      raster_trained.json).
# Writes to $OUT: log.txt and the JSON files named above.
#   device tool: kind nvidia-h200-x2, carry [".whl", ".ext"], timeout_s 600
set -o pipefail
OUT=${OUT:-$PWD/gpu_out}; mkdir -p "$OUT"
BUDGET=${BUDGET:-560}
SEEDS=${SEEDS:-1 2 3}
PRUNE_SEEDS=${PRUNE_SEEDS:-1 2}
exec > >(tee -a "$OUT/log.txt") 2>&1
SCENES="large medium"  # generated while the kernels build (the large one takes ~50 s)
source scripts/gpu_setup.sh || exit 1

source scripts/gpu_train_lib.sh

both 'seeds 0 speed0 large "$SEEDS" bytesplat:fused' 'seeds 1 speed1 large "$SEEDS" splatfacto'
merge train_seeds splatfacto "GPU 0: bytesplat:fused, GPU 1: splatfacto, at the same time; seeds $SEEDS" speed0.json speed1.json
for scene in large medium; do
  (( $(left) > 90 )) || break
  both "seeds 0 prune_off_$scene $scene '$PRUNE_SEEDS' bytesplat:fused@hw_prune=off --tile-stats-every 100" \
       "seeds 1 prune_on_$scene $scene '$PRUNE_SEEDS' bytesplat:fused@hw_prune=on --tile-stats-every 100"
  merge prune_$scene bytesplat:fused@hw_prune=off \
    "GPU 0: hw_prune=off, GPU 1: hw_prune=on, at the same time; seeds $PRUNE_SEEDS" prune_off_$scene.json prune_on_$scene.json
done
TRAINED=$(ls -d /tmp/runs_speed0/*seed1*/bytesplat/bench 2>/dev/null | head -1)
profile() {
  export CUDA_VISIBLE_DEVICES=0
  stamp "GPU 0: profile (timeout $(( $(left) - 5 ))s)"
  timeout $(( $(left) - 5 )) $PY -m bytesplat_ns.bench.profile_train --scene large --warmup-iters 1000 --profile-iters 30 \
    --methods bytesplat:fused splatfacto --work-dir /tmp/profile_runs --out "$OUT/profile.json" > /tmp/profile.log 2>&1
  stamp "GPU 0: profile rc=$?"; grep -E "^[a-z]|sync x" /tmp/profile.log | head -40 | cut -c1-200
}
raster() {
  export CUDA_VISIBLE_DEVICES=1
  [[ -n $TRAINED ]] || { stamp "GPU 1: no trained run for the raster benchmark"; return; }
  stamp "GPU 1: raster benchmark on $TRAINED (timeout $(( $(left) - 5 ))s)"
  timeout $(( $(left) - 5 )) $PY -m bytesplat_ns.bench.cli raster --trained $TRAINED --trained-scale 2.4 --warmup 3 \
    --repeats 10 --out "$OUT/raster_trained.json" > /tmp/raster.log 2>&1
  stamp "GPU 1: raster rc=$?"; tail -n 4 /tmp/raster.log | cut -c1-1500
}
if (( $(left) > 60 )); then both profile raster; fi
stamp "done"
