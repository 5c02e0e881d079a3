#!/usr/bin/env bash
# Foundation checks on a CUDA machine in one go: reference-vs-gsplat GPU tests, the side-by-side
# training benchmark (splatfacto vs bytesplat on the built-in scene), and ns-train/ns-eval through
# the CLI. Logs and JSON go to $OUT (default ./gpu_out); at most 7 files, since the device tool
# returns only 8.
#   ITERS=3000 SCENE=medium scripts/gpu_foundation.sh
# Expects nerfstudio & co. importable (on the device machine: the wheels in .whl, see below).
set -o pipefail
OUT=${OUT:-$PWD/gpu_out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 MAX_JOBS=${MAX_JOBS:-16}
export TORCH_EXTENSIONS_DIR=${TORCH_EXTENSIONS_DIR:-/tmp/ext} BYTESPLAT_CACHE=${BYTESPLAT_CACHE:-/tmp/bytesplat_cache}
PY=${PYTHON:-python3}
ITERS=${ITERS:-5000}
SCENE=${SCENE:-medium}
METHODS=${METHODS:-splatfacto bytesplat:gsplat bytesplat:fused}
T0=$(date +%s)
stamp() { echo "[gpu_foundation +$(( $(date +%s) - T0 ))s] $*"; }

if [[ -d .whl ]]; then  # device machine: no network, packages travel as wheels
  stamp "installing wheels"
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  $PY -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --upgrade --target /tmp/site . || exit 1
  export PYTHONPATH=/tmp/site:$PWD PATH=/tmp/site/bin:$PATH
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 

stamp "JIT builds in parallel: gsplat and bytesplat's fused kernels"
( $PY -c "import gsplat.cuda._backend as b; print('gsplat ext', b._C is not None)" > /tmp/gsplat_build.log 2>&1 ) &
( $PY -c "from bytesplat_ns.raster._build import load_extension; load_extension(); print('fused ext ok')" > /tmp/fused_build.log 2>&1 ) &
wait; tail -n 2 /tmp/gsplat_build.log /tmp/fused_build.log

stamp "GPU backend tests (background) + side-by-side training: $METHODS ($SCENE, $ITERS iterations)"
( timeout 400 $PY -m pytest -q -p no:cacheprovider tests/test_backends_gpu.py -rA -s --tb=short > "$OUT/tests_backends.log" 2>&1; echo "backend tests rc=$?" >> "$OUT/tests_backends.log" ) &
TESTS_PID=$!
timeout ${TRAIN_TIMEOUT:-330} $PY -m bytesplat_ns.bench.train --scene "$SCENE" --iterations "$ITERS" --methods $METHODS --num-downscales 0 \
  --work-dir /tmp/bench_outputs --out "$OUT/train_builtin.json" > "$OUT/train.log" 2>&1
stamp "training benchmark rc=$?"; grep -A12 '"label"' "$OUT/train.log" | grep -E 'label|ms_per|psnr|ssim"|num_gauss'
wait $TESTS_PID; grep -E "passed|failed|error|rc=|max |relative" "$OUT/tests_backends.log" | tail -30

stamp "CLI: ns-train bytesplat (auto backend) + ns-eval"
$PY -m nerfstudio.scripts.train bytesplat --output-dir /tmp/cli_out --timestamp run --vis tensorboard --max-num-iterations ${CLI_ITERS:-200} \
  --steps-per-eval-all-images 100000 > "$OUT/cli_train.log" 2>&1
stamp "ns-train rc=$?"; grep -E "rasterizer backend|Training Finished" "$OUT/cli_train.log"
$PY -m nerfstudio.scripts.eval --load-config /tmp/cli_out/bytesplat-scene/bytesplat/run/config.yml --output-path "$OUT/cli_eval.json" > "$OUT/cli_eval.log" 2>&1
stamp "ns-eval rc=$?"; cat "$OUT/cli_eval.json"
stamp "done"
