#!/usr/bin/env bash
# Is bytesplat's training quality equal to splatfacto's? One run per method cannot say (GPU atomics
# and densification make runs of one configuration differ by tenths of a dB), so: SEEDS seeds each,
# the built-in large scene, 3000 iterations, bytesplat (fused) on GPU 0 and splatfacto on GPU 1 at
# the same time (same host load), then one JSON with both and each method's mean and spread.
# Writes to $OUT: log.txt train_seeds.json.
#   device tool: kind nvidia-h200-x2, carry [".whl", ".ext"], timeout_s 600
#   SEEDS="1 2 3" METHODS0="bytesplat:fused" METHODS1="splatfacto" bash scripts/gpu_seeds_x2.sh
# TESTS=1 then spends what is left of BUDGET on the GPU tests: every one-GPU test on GPU 0 and the
# two-GPU NCCL tests after it (appends tests.log).
set -o pipefail
OUT=${OUT:-$PWD/gpu_out}; mkdir -p "$OUT"
SEEDS=${SEEDS:-1 2 3}
METHODS0=${METHODS0:-bytesplat:fused}
METHODS1=${METHODS1:-splatfacto}
BUDGET=${BUDGET:-560}
exec > >(tee -a "$OUT/log.txt") 2>&1
source scripts/gpu_setup.sh || exit 1
$PY -c "from bytesplat_ns.data.scene import SceneSpec, ensure_scene; print(ensure_scene(SceneSpec(size='large')))"  # generated before both runs start (they would wait on its lock)

run() {  # run GPU METHODS
  export CUDA_VISIBLE_DEVICES=$1
  stamp "GPU $1: $2, seeds $SEEDS (timeout $(( $(left) - 10 ))s)"
  timeout $(( $(left) - 10 )) $PY -m bytesplat_ns.bench.train --scene large --iterations 3000 --num-downscales 0 \
    --methods $2 --seeds $SEEDS --work-dir /tmp/seed_runs_$1 --out /tmp/seeds_$1.json > /tmp/seeds_$1.log 2>&1
  stamp "GPU $1: rc=$?"; grep -E "Error" /tmp/seeds_$1.log | head -3
  tail -c 6000 /tmp/seeds_$1.log > "$OUT/seeds_$1.log.tail"
}
( run 0 "$METHODS0" ) &
P0=$!
( run 1 "$METHODS1" ) &
P1=$!
wait $P0 $P1
$PY scripts/merge_train_json.py "$OUT/train_seeds.json" \
  "GPU 0: $METHODS0, GPU 1: $METHODS1, at the same time; seeds $SEEDS" /tmp/seeds_0.json /tmp/seeds_1.json
$PY - "$OUT/train_seeds.json" "${METHODS1%% *}" <<'EOF'
import json, sys
from bytesplat_ns.bench.train import summarize
d = json.load(open(sys.argv[1]))
d["summary"] = summarize(d["runs"], baseline=sys.argv[2])
json.dump(d, open(sys.argv[1], "w"), indent=1)
for method, row in d["summary"].items():
    print(f"{method}: {row['runs']} runs, PSNR {row['psnr_mean']:.3f} +- {row['psnr_std']:.3f}, "
          f"SSIM {row['ssim_mean']:.4f} +- {row['ssim_std']:.4f}, {row['ms_per_iteration_mean']:.2f} ms/it")
    vs = row.get("vs_baseline")
    if vs:
        print(f"  paired vs {vs['baseline']} over seeds {vs['seeds']}: PSNR {vs['psnr_diff_mean']:+.3f} +- "
              f"{vs['psnr_diff_std']:.3f} dB, SSIM {vs['ssim_diff_mean']:+.4f} +- {vs['ssim_diff_std']:.4f}, "
              f"speed-up {vs['speedup_mean']:.2f}x +- {vs['speedup_std']:.2f}")
EOF
if [[ -n "$TESTS" ]]; then
  export CUDA_VISIBLE_DEVICES=0
  stamp "GPU 0: one-GPU tests (timeout $(( $(left) - 75 ))s)"
  BYTESPLAT_TEST_GSPLAT_PROJECTION=1 timeout $(( $(left) - 75 )) $PY -m pytest -q -p no:cacheprovider -o addopts="" \
    tests -m gpu -k "not two_gpus and not nccl and not training_run_cross_checked" -rfE --tb=short > "$OUT/tests.log" 2>&1
  stamp "one-GPU tests rc=$? $(tail -n 1 "$OUT/tests.log")"
  unset CUDA_VISIBLE_DEVICES
  stamp "both GPUs: two-GPU NCCL tests (timeout $(( $(left) - 5 ))s)"
  timeout $(( $(left) - 5 )) $PY -m pytest -q -p no:cacheprovider -o addopts="" tests -k "two_gpus or nccl" \
    -rfEs --tb=short >> "$OUT/tests.log" 2>&1
  stamp "two-GPU tests rc=$? $(tail -n 1 "$OUT/tests.log")"
fi
stamp "done"
