# Sourced by the GPU scripts (after gpu_setup.sh): seeds, merge, both, gpu_tests, dist_bench, capacity,
# quality, eval_at, matrix_parts, and the kernel variants (variant, built, in_variant).
# Expects OUT, PY, stamp and left.

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
gpu_tests() {  # every one-GPU test on GPU 0, then the two-GPU NCCL tests, in what is left (tests.log)
  gpu_tests_one
  gpu_tests_two
}
gpu_tests_one() {  # gpu_tests_one [GPU] [TIMEOUT]: every one-GPU test on GPU (0) (tests.log), TIMEOUT s (leaving 75 s)
  local gpu=${1:-0} t=${2:-$(( $(left) - 75 ))}
  stamp "GPU $gpu: one-GPU tests (timeout ${t}s)"
  CUDA_VISIBLE_DEVICES=$gpu BYTESPLAT_TEST_GSPLAT_PROJECTION=1 timeout $t $PY -m pytest -q -p no:cacheprovider \
    -o addopts="" tests -m gpu -k "not two_gpus and not nccl and not training_run_cross_checked" -rfE --tb=short \
    > "$OUT/tests.log" 2>&1
  stamp "one-GPU tests rc=$? $(tail -n 1 "$OUT/tests.log")"
}
gpu_tests_two() {  # the two-GPU NCCL tests, in what is left (appended to tests.log)
  stamp "both GPUs: two-GPU NCCL tests (timeout $(( $(left) - 5 ))s)"
  timeout $(( $(left) - 5 )) $PY -m pytest -q -p no:cacheprovider -o addopts="" tests -k "two_gpus or nccl" \
    -rfEs --tb=short >> "$OUT/tests.log" 2>&1
  stamp "two-GPU tests rc=$? $(tail -n 1 "$OUT/tests.log")"
}
dist_bench() {  # dist_bench NAME NPROC TIMEOUT [bench options]: bytesplat-bench distributed -> $OUT/NAME.json
  local name=$1 nproc=$2 t=$3; shift 3
  stamp "bytesplat-bench distributed on $nproc rank(s): $* (timeout ${t}s)"
  PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True timeout $t $PY -m torch.distributed.run --standalone \
    --nproc-per-node $nproc -m bytesplat_ns.bench.cli distributed --width 1920 --height 1080 "$@" \
    --out "$OUT/$name.json" > /tmp/$name.log 2>&1
  stamp "$name rc=$?"; grep -E "^ +N=|targets|out of memory|Error" /tmp/$name.log | tail -n 24 | cut -c1-300
}
capacity() {  # capacity NAME NPROC N [bench options]: N Gaussians, 4 views, a few steps, in what is left
  local name=$1 nproc=$2 n=$3; shift 3
  dist_bench $name $nproc $(( $(left) - 5 )) --num-gaussians $n --views 4 --warmup 1 --repeats 2 "$@"
}
quality() {  # quality NAME NPROC GPUS ITERS [ns-train options]: METHOD (bytesplat-distributed) on NPROC GPUs, then ns-eval
  local name=$1 nproc=$2 gpus=$3 iters=$4 method=${METHOD:-bytesplat-distributed}; shift 4
  local t=$(( $(left) - 40 ))
  stamp "GPUs $gpus: ns-train $method --machine.num-devices $nproc $* ($iters steps, timeout ${t}s)"
  CUDA_VISIBLE_DEVICES=$gpus timeout $t $PY -m nerfstudio.scripts.train $method --machine.num-devices $nproc \
    --experiment-name $name --output-dir /tmp/quality --timestamp run --vis tensorboard --max-num-iterations $iters \
    --steps-per-save $(( iters / 4 )) --steps-per-eval-image 100000 --steps-per-eval-batch 100000 \
    --steps-per-eval-all-images 100000 "$@" > /tmp/quality_$name.log 2>&1
  stamp "$name train rc=$? $(grep -E 'Error|error:' /tmp/quality_$name.log | tail -n 1 | cut -c1-200)"
  local cfg; cfg=$(find /tmp/quality/$name -name config.yml | head -1)
  [[ -n "$cfg" ]] && CUDA_VISIBLE_DEVICES=${gpus%%,*} timeout 60 $PY -m nerfstudio.scripts.eval --load-config "$cfg" \
    --output-path "$OUT/eval_$name.json" >> /tmp/quality_$name.log 2>&1
  stamp "$name eval rc=$? $(grep -o '"checkpoint": "[^"]*"\|"psnr": [0-9.]*\|"ssim": [0-9.]*' "$OUT/eval_$name.json" 2>/dev/null | tr '\n' ' ')"
}
eval_at() {  # eval_at NAME STEP: ns-eval of run NAME's checkpoint at STEP (eval_NAME_STEP.json)
  local name=$1 step=$2 cfg; cfg=$(find /tmp/quality/$name -name config.yml | head -1)
  [[ -z "$cfg" ]] && return 1
  sed "s/^load_step: null/load_step: $step/" "$cfg" > "${cfg%.yml}_$step.yml"
  timeout 60 $PY -m nerfstudio.scripts.eval --load-config "${cfg%.yml}_$step.yml" --output-path "$OUT/eval_${name}_$step.json" \
    >> /tmp/quality_$name.log 2>&1
  stamp "$name eval at step $step rc=$? $(grep -o '"psnr": [0-9.]*\|"ssim": [0-9.]*' "$OUT/eval_${name}_$step.json" 2>/dev/null | tr '\n' ' ')"
}
quickstart() {  # the README's quick start (ns-train bytesplat, 3000 iterations, built-in scene) + ns-eval -> $OUT/eval_quickstart.json
  local t=$(date +%s)
  stamp "GPU ${CUDA_VISIBLE_DEVICES:-0}: README quick start"
  timeout 240 $PY -m nerfstudio.scripts.train bytesplat --max-num-iterations 3000 --viewer.quit-on-train-completion True \
    --output-dir /tmp/quickstart --timestamp run > /tmp/quickstart.log 2>&1
  stamp "quick start rc=$? in $(( $(date +%s) - t ))s; $(grep -o 'min_train_resolution[^.]*' /tmp/quickstart.log | head -1)"
  local cfg=$(find /tmp/quickstart -name config.yml | head -1)
  [[ -n "$cfg" ]] && timeout 60 $PY -m nerfstudio.scripts.eval --load-config "$cfg" --output-path "$OUT/eval_quickstart.json" >> /tmp/quickstart.log 2>&1
  stamp "quick start eval rc=$? $(grep -o '"psnr": [0-9.]*\|"ssim": [0-9.]*' "$OUT/eval_quickstart.json" 2>/dev/null | tr '\n' ' ')"
  tail -n 5 /tmp/quickstart.log | cut -c1-300
}
dist_scaling() {  # dist_scaling VIEWS...: issue 5's scaling at 1M and 4M, dense and sparse-grad next to gsplat -> $OUT/scaling_vVIEWS.json
  local v
  for v in "$@"; do
    (( $(left) < 70 )) && break
    dist_bench scaling_v$v 2 $(( $(left) > 140 ? 110 : $(left) - 20 )) --num-gaussians 1000000 4000000 --views $v \
      --warmup 3 --repeats 10 --communicators sparse-grad dense
  done
}
raster_bench() {  # raster_bench NAME [bench options]: bytesplat-bench raster, 1M and 4M, 1080p -> $OUT/NAME.json
  local name=$1; shift
  stamp "bytesplat-bench raster $* (GPU ${CUDA_VISIBLE_DEVICES:-0})"
  timeout 200 $PY -m bytesplat_ns.bench.cli raster --num-gaussians 1000000 4000000 --width 1920 --height 1080 \
    --warmup 3 --repeats 10 "$@" --out "$OUT/$name.json" > /tmp/$name.log 2>&1
  stamp "$name rc=$?"; $PY - "$OUT/$name.json" <<'PYEOF'
import json, sys
for r in json.load(open(sys.argv[1]))["runs"]:
    g = lambda k: r.get(k, {}).get("median_ms", float("nan"))  # noqa: E731
    print(f"  N={r['num_gaussians']}: gsplat {g('raster_loss_gsplat'):.2f} ms, fused split {g('raster_loss_fused_split'):.2f} ms "
          f"({g('raster_loss_gsplat') / g('raster_loss_fused_split'):.2f}x), fwd gsplat/fused {g('raster_fwd_gsplat'):.2f}/"
          f"{g('raster_fwd_fused'):.2f}, full step {g('full_gsplat'):.2f}/{g('full_fused_split'):.2f}")
PYEOF
}
matrix_parts() {  # matrix_parts TIMEOUT: the matrix's raster and distributed parts (1M, 4M; 1 and 2 ranks) -> $OUT/matrix.tgz
  local t=$1
  stamp "bytesplat-bench matrix: raster and distributed (timeout ${t}s)"
  timeout $t $PY -m bytesplat_ns.bench.cli matrix --benchmarks raster distributed --gaussians 1000000 4000000 \
    --width 1920 --height 1080 --views 8 --ranks 1 2 --communicators dense sparse-grad pixel --warmup 3 --repeats 10 \
    --piece-timeout 100 --out-dir /tmp/matrix > /tmp/matrix.log 2>&1
  stamp "matrix rc=$?"; tail -n 30 /tmp/matrix.log | cut -c1-250
  # one archive: the device tool returns at most 8 files (the first run's matrix files did not come back)
  tar czf "$OUT/matrix.tgz" -C /tmp matrix
}
variant() {  # variant NAME EDIT: /tmp/var_NAME = a copy of the installed package with the shell code EDIT
  # run on it (from the checkout, $CUDA = the copy's cuda/), JIT-built under its own name (its sources
  # hash differently; MAX_JOBS as the caller sets it), then /tmp/var_NAME.built. Run the variant with
  # in_variant, from its own directory: from the checkout, the checkout's cuda/ would win.
  local name=$1 d=/tmp/var_$1
  mkdir -p $d && cp -r /tmp/site/bytesplat_ns $d/
  CUDA=$d/bytesplat_ns/cuda bash -c "$2" || { echo "variant $name: the edit failed"; return 1; }
  (cd $d && PYTHONPATH=$d:$PYTHONPATH timeout 300 $PY -c "
from bytesplat_ns.raster._build import cuda_source_dir, load_extension
print('$name: sources', cuda_source_dir()); load_extension()" 2>&1 | grep -v Build)
  touch $d.built
}
built() { while [[ ! -e /tmp/var_$1.built ]] && (( $(left) > 30 )); do sleep 2; done; }  # built NAME: wait for its build
in_variant() {  # in_variant NAME CMD...: CMD from the variant's directory, its package first on the path
  local d=/tmp/var_$1; shift
  (cd $d && PYTHONPATH=$d:$PYTHONPATH "$@")
}
