#!/usr/bin/env bash
# Foundation checks on a CUDA machine in one go: reference-vs-gsplat GPU tests, the side-by-side
# training benchmark (splatfacto vs bytesplat on the built-in scene), and ns-train/ns-eval through
# the CLI. Logs and JSON go to $OUT (default ./gpu_out).
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
T0=$(date +%s)
stamp() { echo "[gpu_foundation +$(( $(date +%s) - T0 ))s] $*"; }

if [[ -d .whl ]]; then  # device machine: no network, packages travel as wheels
  stamp "installing wheels"
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  $PY -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --upgrade --target /tmp/site . || exit 1
  export PYTHONPATH=/tmp/site:$PWD PATH=/tmp/site/bin:$PATH
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/env.log"

stamp "gsplat JIT build + GPU backend tests"
$PY -m pytest -q -p no:cacheprovider tests/test_backends_gpu.py -rA --tb=short 2>&1 | tee "$OUT/tests_backends.log"
stamp "backend tests rc=$?"

stamp "side-by-side training: splatfacto vs bytesplat ($SCENE, $ITERS iterations)"
$PY -m bytesplat_ns.bench.train --scene "$SCENE" --iterations "$ITERS" --methods ${METHODS:-splatfacto bytesplat:gsplat bytesplat:fused} --num-downscales 0 \
  --work-dir /tmp/bench_outputs --out "$OUT/train_builtin.json" 2>&1 | tail -60 | tee "$OUT/train.log"
stamp "training benchmark rc=$?"

stamp "CLI: ns-train bytesplat (auto backend) + ns-eval"
ns-train bytesplat --output-dir /tmp/cli_out --timestamp run --vis tensorboard --max-num-iterations 300 \
  --steps-per-eval-all-images 100000 > "$OUT/cli_train.log" 2>&1
stamp "ns-train rc=$?"; grep -E "rasterizer backend|Training Finished" "$OUT/cli_train.log"
ns-eval --load-config /tmp/cli_out/bytesplat-scene/bytesplat/run/config.yml --output-path "$OUT/cli_eval.json" > "$OUT/cli_eval.log" 2>&1
stamp "ns-eval rc=$?"; cat "$OUT/cli_eval.json"
stamp "done"
