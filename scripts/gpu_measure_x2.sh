#!/usr/bin/env bash
# The session's GPU measurements in one call on two H200s (nvidia-h200-x2) or, one stage after
# the other and without the multi-GPU benchmark, on one (nvidia-h200); each stage bounded:
#   GPU 0: the GPU tests (fused kernels incl. CUDA binning and both backward reductions, sharded
#          step's fused loss compositor, sparse-grad kernels, pruning), then `bytesplat-bench raster`
#          (1M and 4M Gaussians, 1920x1080, SH 3), then Nsight Compute DRAM bytes of the
#          raster+loss stage, fused vs gsplat (when ncu is installed);
#   GPU 1: GPU1=train (default): full training side by side, splatfacto vs bytesplat (fused, gsplat
#          backends), same seed and iterations, on the built-in large scene, then medium while time
#          remains; GPU1=prune: hardware-aware pruning off vs on (fused, tile occupancy every 100
#          steps) on the medium scene, then the large one;
#   both:  `bytesplat-bench distributed` under torchrun (1 vs 2 ranks, dense / sparse-grad / pixel,
#          gsplat distributed).
# DRAM=0 skips the Nsight Compute stage. Writes at most 8 files to $OUT: tests.log raster.json
# dram.json {train,prune}_{large,medium}.json distributed.json log.txt (+ gsplat_cuda.so when none
# was carried).
#   device tool: kind nvidia-h200-x2 (or nvidia-h200), carry [".whl", ".ext"], timeout_s 540
set -o pipefail
OUT=${OUT:-$PWD/gpu_out}; mkdir -p "$OUT"
export BYTESPLAT_DIST_TIMEOUT=${BYTESPLAT_DIST_TIMEOUT:-200}
BUDGET=${BUDGET:-420}
ITERS=${ITERS:-3000}
exec > >(tee -a "$OUT/log.txt") 2>&1
source scripts/gpu_setup.sh || exit 1

gpu0() {
  export CUDA_VISIBLE_DEVICES=0
  timeout 200 $PY -c "from bytesplat_ns.distributed.sparse_kernels import load_extension; load_extension(); print('sparse-grad ext ok')" 2>&1 | tail -n 1
  stamp "GPU 0: tests"
  BYTESPLAT_TEST_GSPLAT_PROJECTION=1 timeout 200 $PY -m pytest -q -p no:cacheprovider -o addopts="" \
    tests/test_fused_gpu.py tests/test_binning_gpu.py tests/test_distributed_gpu.py tests/test_sparse_kernels_gpu.py tests/test_pixel_gpu.py tests/test_pruning.py \
    -m gpu -k "not training_run_cross_checked" -rfE --tb=short --durations=5 > "$OUT/tests.log" 2>&1
  stamp "GPU 0: tests rc=$? $(tail -n 1 "$OUT/tests.log")"
  stamp "GPU 0: raster benchmark"
  timeout 150 $PY -m bytesplat_ns.bench.cli raster --num-gaussians 1000000 4000000 --width 1920 --height 1080 \
    --warmup 3 --repeats 10 --out "$OUT/raster.json" > /tmp/raster.log 2>&1
  stamp "GPU 0: raster rc=$?"; tail -n 3 /tmp/raster.log | cut -c1-3000
}

dram() {
  if command -v ncu >/dev/null || [[ -x /usr/local/cuda/bin/ncu ]]; then
    NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
    echo "{" > "$OUT/dram.json"
    for n in 1000000 4000000; do for st in fused gsplat; do
      (( $(left) < 45 )) && break 2
      timeout 60 $NCU --profile-from-start off --metrics dram__bytes_read.sum,dram__bytes_write.sum --csv \
        --print-units base $PY -m bytesplat_ns.bench.dram --stage $st --num-gaussians $n > /tmp/ncu_${st}_$n.csv 2>/tmp/ncu_err.log
      r=$($PY -m bytesplat_ns.bench.dram --parse /tmp/ncu_${st}_$n.csv 2>&1 | tail -1)
      stamp "ncu $st N=$n: $r"; tail -n 2 /tmp/ncu_err.log
      echo "\"${st}_$n\": $( [[ "$r" == \{* ]] && echo "$r" || echo '{"error": "see log.txt"}'  )," >> "$OUT/dram.json"
    done; done
    echo "\"command\": \"ncu --profile-from-start off --metrics dram__bytes_read.sum,dram__bytes_write.sum --csv --print-units base python -m bytesplat_ns.bench.dram --stage STAGE --num-gaussians N\"}" >> "$OUT/dram.json"
  else
    stamp "no ncu on this machine: DRAM bytes not measured"
  fi
}

prune() {  # prune SCENES...
  for scene in "$@"; do
    t=$(( $(left) - ${PRUNE_RESERVE:-110} )); (( t < 60 )) && { stamp "no time left for the $scene scene"; break; }
    stamp "pruning off vs on, $scene scene, $ITERS iterations (timeout ${t}s)"
    timeout $t $PY -m bytesplat_ns.bench.train --scene $scene --iterations $ITERS --num-downscales 0 --tile-stats-every 100 \
      --methods bytesplat:fused@hw_prune=off bytesplat:fused@hw_prune=on --work-dir /tmp/prune_runs \
      --out "$OUT/prune_$scene.json" > /tmp/prune_$scene.log 2>&1
    stamp "pruning $scene rc=$?"; grep -E "hardware-aware|Error" /tmp/prune_$scene.log | head -5
  done
}

train() {  # train SCENES...: the full-iteration comparison against splatfacto (issue 3)
  for scene in "$@"; do
    t=$(( $(left) - ${PRUNE_RESERVE:-110} )); (( t < 60 )) && { stamp "no time left for the $scene scene"; break; }
    stamp "splatfacto vs bytesplat, $scene scene, $ITERS iterations (timeout ${t}s)"
    timeout $t $PY -m bytesplat_ns.bench.train --scene $scene --iterations $ITERS --num-downscales 0 \
      --methods splatfacto bytesplat:fused bytesplat:gsplat --work-dir /tmp/train_runs \
      --out "$OUT/train_$scene.json" > /tmp/train_$scene.log 2>&1
    stamp "training $scene rc=$?"; grep -E "Error" /tmp/train_$scene.log | head -5
  done
}
GPU1=${GPU1:-train}
gpu1() { if [[ $GPU1 == prune ]]; then prune medium large; else train large medium; fi; }
(( ${DRAM:-1} )) || dram() { stamp "DRAM stage skipped (DRAM=0)"; }

NGPU=$(nvidia-smi -L | wc -l)
if (( NGPU >= 2 )); then
  ( gpu0; dram ) > /tmp/gpu0.log 2>&1 &
  P0=$!
  ( export CUDA_VISIBLE_DEVICES=1; gpu1 ) > /tmp/gpu1.log 2>&1 &
  P1=$!
  wait $P0 $P1
  cat /tmp/gpu0.log /tmp/gpu1.log
else  # one GPU: one stage at a time (the timings must not share the GPU), most needed first
  gpu0; gpu1; dram
fi

TB=$(( $(left) - 10 )); (( TB > 240 )) && TB=240
if (( NGPU >= 2 && TB > 40 )); then
  stamp "both GPUs: distributed benchmark (timeout ${TB}s)"
  timeout $TB $PY -m torch.distributed.run --standalone --nproc-per-node 2 -m bytesplat_ns.bench.cli distributed \
    --num-gaussians 1000000 4000000 --views 8 --width 1920 --height 1080 --warmup 3 --repeats 10 \
    --communicators dense sparse-grad pixel --out "$OUT/distributed.json" > /tmp/dist.log 2>&1
  stamp "distributed rc=$?"; grep -vE "^\s*$" /tmp/dist.log | tail -n 16 | cut -c1-400
fi
$PY - "$OUT" <<'EOF'
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
for f in sorted(out.glob("prune_*.json")) + sorted(out.glob("train_*.json")):
    for r in json.loads(f.read_text())["runs"]:
        occ = r.get("tile_occupancy", [])
        late = [e["over_capacity_share"] for e in occ if e["step"] >= 600]
        print(f.name, r["label"], "ms/it %.2f" % r["ms_per_iteration"], "psnr %.3f ssim %.4f" % (r["eval"]["psnr"], r["eval"]["ssim"]),
              "N", r["num_gaussians"], "over-capacity after warm-up: max %.4f last %.4f" % (max(late, default=0), late[-1] if late else 0))
f = out / "raster.json"
if f.exists():
    for r in json.loads(f.read_text())["runs"]:
        print({k: (v.get("median_ms") if isinstance(v, dict) and "median_ms" in v else v) for k, v in r.items() if not k.startswith("fused_kernel")})
EOF
stamp "done"
