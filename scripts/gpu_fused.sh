#!/usr/bin/env bash
# Fused backend on a CUDA machine, everything in one go: JIT build, GPU tests, benchmark.
# Logs and JSON go to $OUT (default ./gpu_out).
#   scripts/gpu_fused.sh            build + tests + benchmark (1M and 4M Gaussians, 1920x1080)
#   BENCH=0 scripts/gpu_fused.sh    build + tests only
# gsplat's own CUDA extension (needed by the gsplat-projection tests and the baseline) is
# JIT-built in the background while our kernels build and the torch-projection tests run.
set -o pipefail
OUT=${OUT:-$PWD/gpu_out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
export TORCH_EXTENSIONS_DIR=${TORCH_EXTENSIONS_DIR:-/tmp/ext} MAX_JOBS=${MAX_JOBS:-16}
PY=${PYTHON:-python3}
BENCH=${BENCH:-1}
TEST_K=${TEST_K:-}            # pytest -k expression for the torch-projection tests (default: all)
GSPLAT_TESTS=${GSPLAT_TESTS:-1}  # also run the tests with gsplat's CUDA projection
BENCH_ON_FAIL=${BENCH_ON_FAIL:-0}  # still time the kernels when a test failed
GSPLAT_BUILD=${GSPLAT_BUILD:-1}  # 0: no gsplat CUDA build (then set GSPLAT_TESTS=0 and a --skip-gsplat BENCH_ARGS)
BENCH_ARGS=${BENCH_ARGS:---num-gaussians 1000000 4000000 --width 1920 --height 1080}
TEST_TIMEOUT=${TEST_TIMEOUT:-1200}
T0=$(date +%s)
stamp() { echo "[gpu_fused +$(( $(date +%s) - T0 ))s] $*"; }

{
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  $PY -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name(0))"
} 2>&1 | tee "$OUT/env.log"

GSPLAT_PID=
if [[ "$GSPLAT_BUILD" == "1" ]]; then
  stamp "gsplat JIT build (background)"
  ( MAX_JOBS=10 $PY -c "import gsplat.cuda._backend as b; print('gsplat ext', b._C is not None)" >"$OUT/gsplat_build.log" 2>&1 ) &
  GSPLAT_PID=$!
fi

stamp "bytesplat build"
$PY -c "
import time; t=time.time()
from bytesplat_ns.raster._build import load_extension
ext = load_extension()
print('built/loaded in %.1fs; capacity(2 blocks/SM)=%d capacity(1)=%d' % (time.time()-t, ext.fused_capacity(2), ext.fused_capacity(1)))
" 2>&1 | tee "$OUT/build.log" || { stamp "build failed"; [[ -n "$GSPLAT_PID" ]] && kill $GSPLAT_PID 2>/dev/null; exit 1; }

stamp "tests (torch projection)"
timeout $TEST_TIMEOUT $PY -m pytest -q -p no:cacheprovider -o addopts="" tests/test_fused_gpu.py ${TEST_K:+-k "$TEST_K"} -rA --tb=short \
  --durations=8 2>&1 | tee "$OUT/tests.log"
TEST_RC=$?
stamp "tests rc=$TEST_RC"
if [[ $TEST_RC -ne 0 && "$BENCH_ON_FAIL" != "1" ]]; then [[ -n "$GSPLAT_PID" ]] && kill $GSPLAT_PID 2>/dev/null; exit $TEST_RC; fi

if [[ -n "$GSPLAT_PID" ]]; then
  stamp "waiting for gsplat build"
  wait $GSPLAT_PID; tail -3 "$OUT/gsplat_build.log"
fi
if [[ "$GSPLAT_TESTS" == "1" ]]; then
  stamp "tests (gsplat projection)"
  BYTESPLAT_TEST_GSPLAT_PROJECTION=1 $PY -m pytest -q -p no:cacheprovider -o addopts="" tests/test_fused_gpu.py \
    -k gsplat -rA --tb=short 2>&1 | tee "$OUT/tests_gsplat.log"
  stamp "gsplat-projection tests rc=$?"
fi

if [[ "$BENCH" == "1" ]]; then
  stamp "benchmark"
  $PY -m bytesplat_ns.bench.cli raster $BENCH_ARGS --out "$OUT/raster.json" 2>&1 | tee "$OUT/bench.log"
  stamp "benchmark rc=$?"
fi
stamp "done"
