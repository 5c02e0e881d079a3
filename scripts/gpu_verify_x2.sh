#!/usr/bin/env bash
# One call on two H200s (nvidia-h200-x2): verify what changed since the last GPU run, then measure
# what the open issues still need. Each stage is bounded; the two GPUs work in parallel first:
#   GPU 0: the one-GPU test files (fused kernels incl. the contribution score, binning, sharded
#          compositor, sparse-grad kernels, pixel on one GPU, pruning); Nsight Compute DRAM bytes of
#          the split schedule (the default) at 1M and 4M; `bytesplat-bench profile` (where a
#          training iteration's time goes) splatfacto vs bytesplat on the large scene; then, once
#          GPU 1 has a trained run, `bytesplat-bench raster --trained` on it;
#   GPU 1: training side by side on the large built-in scene, same seed and iterations:
#          bytesplat (fused, default split) first, then splatfacto, then bytesplat with pruning on;
#   both:  the two-GPU NCCL tests, then `bytesplat-bench distributed` (1 vs 2 ranks; dense,
#          sparse-grad, pixel; gsplat distributed) at 1M and 4M, and on the trained run.
# Writes at most 8 files to $OUT: tests.log dram.json profile.json train_large.json
# raster_trained.json distributed.json distributed_trained.json log.txt.
#   device tool: kind nvidia-h200-x2, carry [".whl", ".ext"], timeout_s 600
set -o pipefail
OUT=${OUT:-$PWD/gpu_out}; mkdir -p "$OUT"
export BYTESPLAT_DIST_TIMEOUT=${BYTESPLAT_DIST_TIMEOUT:-200}
BUDGET=${BUDGET:-560}
ITERS=${ITERS:-3000}
TRAIN_METHODS=${TRAIN_METHODS:-bytesplat:fused splatfacto bytesplat:fused@hw_prune=on}
exec > >(tee -a "$OUT/log.txt") 2>&1
source scripts/gpu_setup.sh || exit 1
RUNS=/tmp/train_runs
TRAINED=$RUNS/bytesplat-fused/bytesplat/bench  # the first training run's directory

gpu0() {
  export CUDA_VISIBLE_DEVICES=0
  timeout 200 $PY -c "from bytesplat_ns.distributed.sparse_kernels import load_extension; load_extension(); print('sparse-grad ext ok')" 2>&1 | tail -n 1
  stamp "GPU 0: tests"
  BYTESPLAT_TEST_GSPLAT_PROJECTION=1 timeout 200 $PY -m pytest -q -p no:cacheprovider -o addopts="" \
    tests/test_fused_gpu.py tests/test_binning_gpu.py tests/test_distributed_gpu.py tests/test_sparse_kernels_gpu.py \
    tests/test_pixel_gpu.py tests/test_pruning.py tests/test_backends_gpu.py \
    -m gpu -k "not training_run_cross_checked" -rfEs --tb=short --durations=5 > "$OUT/tests.log" 2>&1
  stamp "GPU 0: tests rc=$? $(tail -n 1 "$OUT/tests.log")"
  if command -v ncu >/dev/null || [[ -x /usr/local/cuda/bin/ncu ]]; then
    NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
    echo "{" > "$OUT/dram.json"
    for n in 1000000 4000000; do
      timeout 60 $NCU --profile-from-start off --metrics dram__bytes_read.sum,dram__bytes_write.sum --csv \
        --print-units base $PY -m bytesplat_ns.bench.dram --stage fused-split --num-gaussians $n > /tmp/ncu_split_$n.csv 2>/tmp/ncu_err.log
      r=$($PY -m bytesplat_ns.bench.dram --parse /tmp/ncu_split_$n.csv 2>&1 | tail -1)
      stamp "ncu fused-split N=$n: $r"
      echo "\"fused-split_$n\": $( [[ "$r" == \{* ]] && echo "$r" || echo '{"error": "see log.txt"}' )," >> "$OUT/dram.json"
    done
    echo "\"command\": \"ncu --profile-from-start off --metrics dram__bytes_read.sum,dram__bytes_write.sum --csv --print-units base python -m bytesplat_ns.bench.dram --stage fused-split --num-gaussians N\"}" >> "$OUT/dram.json"
  fi
  stamp "GPU 0: profile of a training iteration, large scene"
  timeout 150 $PY -m bytesplat_ns.bench.cli profile --scene large --warmup-iters 1000 --profile-iters 30 \
    --methods splatfacto bytesplat:fused --work-dir /tmp/profile_runs --out "$OUT/profile.json" > /tmp/profile.log 2>&1
  stamp "GPU 0: profile rc=$?"; grep -E "Gaussians, wall|^ +(host|dev) " /tmp/profile.log | head -60
  while [[ ! -f $TRAINED/done ]] && (( $(left) > 200 )); do sleep 5; done
  if [[ -f $TRAINED/done ]]; then
    stamp "GPU 0: raster benchmark on the trained run"
    timeout 90 $PY -m bytesplat_ns.bench.cli raster --trained $TRAINED --trained-scale 2.4 --warmup 3 --repeats 10 \
      --out "$OUT/raster_trained.json" > /tmp/raster_trained.log 2>&1
    stamp "GPU 0: raster trained rc=$?"; tail -n 4 /tmp/raster_trained.log | cut -c1-1500
  fi
}

gpu1() {
  export CUDA_VISIBLE_DEVICES=1
  for m in $TRAIN_METHODS; do
    t=$(( $(left) - 190 )); (( t < 60 )) && { stamp "GPU 1: no time left for $m"; break; }
    stamp "GPU 1: training $m, large scene, $ITERS iterations (timeout ${t}s)"
    timeout $t $PY -m bytesplat_ns.bench.train --scene large --iterations $ITERS --num-downscales 0 --tile-stats-every 100 \
      --methods $m --work-dir $RUNS --out /tmp/train_$(echo $m | tr ':@=,' '----').json > /tmp/train.log 2>&1
    rc=$?; stamp "GPU 1: $m rc=$rc"; grep -E "Error" /tmp/train.log | head -3
    [[ $m == bytesplat:fused && $rc == 0 ]] && touch $TRAINED/done
  done
  $PY scripts/merge_train_json.py "$OUT/train_large.json" \
    "one bench.train process per method, same scene/seed/iterations, one after the other on GPU 1" /tmp/train_*.json
}

( gpu0 ) > /tmp/gpu0.log 2>&1 &
P0=$!
( gpu1 ) > /tmp/gpu1.log 2>&1 &
P1=$!
wait $P0 $P1
cat /tmp/gpu0.log /tmp/gpu1.log

stamp "both GPUs: two-GPU NCCL tests"
timeout 120 $PY -m pytest -q -p no:cacheprovider -o addopts="" tests/test_pixel_gpu.py -k "two_gpus or nccl" -rfEs --tb=short \
  >> "$OUT/tests.log" 2>&1
stamp "two-GPU tests rc=$? $(tail -n 1 "$OUT/tests.log")"
TB=$(( $(left) - 50 )); (( TB > 150 )) && TB=150
if (( TB > 40 )); then
  stamp "both GPUs: distributed benchmark (timeout ${TB}s)"
  timeout $TB $PY -m torch.distributed.run --standalone --nproc-per-node 2 -m bytesplat_ns.bench.cli distributed \
    --num-gaussians 1000000 4000000 --views 8 --width 1920 --height 1080 --warmup 3 --repeats 10 \
    --communicators dense sparse-grad pixel --out "$OUT/distributed.json" > /tmp/dist.log 2>&1
  stamp "distributed rc=$?"; grep -E "^ +N=|targets" /tmp/dist.log | tail -n 24 | cut -c1-300
fi
TB=$(( $(left) - 5 ))
if [[ -f $TRAINED/done ]] && (( TB > 30 )); then
  stamp "both GPUs: distributed benchmark on the trained run (timeout ${TB}s)"
  timeout $TB $PY -m torch.distributed.run --standalone --nproc-per-node 2 -m bytesplat_ns.bench.cli distributed \
    --trained $TRAINED --trained-scale 2.4 --views 8 --warmup 3 --repeats 10 --communicators dense sparse-grad pixel \
    --out "$OUT/distributed_trained.json" > /tmp/dist_t.log 2>&1
  stamp "distributed trained rc=$?"; grep -E "^ +N=|targets" /tmp/dist_t.log | tail -n 16 | cut -c1-300
fi
stamp "done"
