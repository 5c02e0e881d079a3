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
T0=$(date +%s)
# the scenes generate while the kernels build (the large one takes ~50 s)
( ${PYTHON:-python3} -c "
from bytesplat_ns.data.scene import SceneSpec, ensure_scene
for size in ('large', 'medium'): print(ensure_scene(SceneSpec(size=size)))" > /tmp/scenes.log 2>&1 ) &
SCENES_PID=$!
source scripts/gpu_setup.sh || exit 1
wait $SCENES_PID; tail -n 2 /tmp/scenes.log

seeds() {  # seeds GPU NAME SCENE "SEEDS" "METHODS" [bench.train options]
  local gpu=$1 name=$2 scene=$3 seeds=$4 methods=$5; shift 5
  export CUDA_VISIBLE_DEVICES=$gpu
  stamp "GPU $gpu: $methods, $scene scene, seeds $seeds $* (timeout $(( $(left) - 10 ))s)"
  timeout $(( $(left) - 10 )) $PY -m bytesplat_ns.bench.train --scene $scene --iterations 3000 --num-downscales 0 \
    --methods $methods --seeds $seeds --work-dir /tmp/runs_$name --out /tmp/$name.json "$@" > /tmp/$name.log 2>&1
  stamp "GPU $gpu: $name rc=$?"; grep -E "Error" /tmp/$name.log | head -3
}
merge() {  # merge OUT_NAME BASELINE NOTE IN_NAME...
  local out=$1 baseline=$2 note=$3; shift 3
  $PY scripts/merge_train_json.py "$OUT/$out.json" "$note" "${@/#//tmp/}"
  $PY - "$OUT/$out.json" "$baseline" <<'EOF'
import json, sys
from bytesplat_ns.bench.train import summarize
d = json.load(open(sys.argv[1]))
d["summary"] = summarize(d["runs"], baseline=sys.argv[2])
json.dump(d, open(sys.argv[1], "w"), indent=1)
for method, row in d["summary"].items():
    print(f"{method}: {row['runs']} runs, PSNR {row['psnr_mean']:.3f} +- {row['psnr_std']:.3f}, "
          f"{row['ms_per_iteration_mean']:.2f} ms/it")
    vs = row.get("vs_baseline")
    if vs:
        print(f"  paired vs {vs['baseline']} over seeds {vs['seeds']}: PSNR {vs['psnr_diff_mean']:+.3f} +- "
              f"{vs['psnr_diff_std']:.3f} dB, SSIM {vs['ssim_diff_mean']:+.4f} +- {vs['ssim_diff_std']:.4f}, "
              f"speed-up {vs['speedup_mean']:.2f}x +- {vs['speedup_std']:.2f}")
EOF
}
both() {  # both "CMD0" "CMD1": the two at the same time, one per GPU
  ( eval "$1" ) & local p0=$!
  ( eval "$2" ) & local p1=$!
  wait $p0 $p1
}

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
