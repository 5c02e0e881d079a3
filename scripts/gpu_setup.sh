# The GPU machine's setup, sourced from the repository root before any benchmark:
#
#   source scripts/gpu_setup.sh && bytesplat-bench suite raster-1080p --results-dir "$OUT/results"
#   (device tool: carry [".whl", ".ext"]; SCENES="large medium" also generates those built-in scenes)
#
# 1. Environment: NVLink multicast off (NCCL_NVLS_ENABLE=0 and the torch/NVSHMEM switches: the lent
#    machines do not support it), unbuffered output, the extension and scene caches under /tmp.
#    Everything printed from here on also goes to $OUT/log.txt (OUT defaults to ./gpu_out).
# 2. Packages: with a carried .whl/ (the machine has no network), every wheel and this checkout go
#    into /tmp/site, first on PYTHONPATH and PATH (so `bytesplat-bench` is this checkout's).
# 3. gsplat's CUDA extension: a carried .ext/gsplat_cuda.so (built by an earlier run of the same
#    machine kind) is loaded as gsplat.csrc, which gsplat tries before its ~3-minute JIT build; a
#    fresh build is copied to $OUT, to be carried in .ext/ next time.
# 4. JIT builds of gsplat and of our two extensions in parallel (and the SCENES alongside).
set -o pipefail
OUT=${OUT:-$PWD/gpu_out}; mkdir -p "$OUT"
exec > >(tee -a "$OUT/log.txt") 2>&1
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 MAX_JOBS=${MAX_JOBS:-16}
export TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export TORCH_EXTENSIONS_DIR=${TORCH_EXTENSIONS_DIR:-/tmp/ext} BYTESPLAT_CACHE=${BYTESPLAT_CACHE:-/tmp/bytesplat_cache}
PY=${PYTHON:-python3}
T0=${T0:-$(date +%s)}
stamp() { echo "[gpu_setup +$(( $(date +%s) - T0 ))s] $*"; }

if [[ -d .whl ]]; then
  stamp "installing wheels"
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || return 1
  $PY -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --upgrade --target /tmp/site . || return 1
  export PYTHONPATH=/tmp/site:$PWD PATH=/tmp/site/bin:$PATH
fi
if [[ -f .ext/gsplat_cuda.so ]]; then
  GS=$($PY -c "import importlib.util as u; print(u.find_spec('gsplat').submodule_search_locations[0])")
  cat > "$GS/csrc.py" <<PYEOF
# Written by scripts/gpu_setup.sh: gsplat's CUDA extension, built on an earlier run of this machine kind.
import importlib.util, sys
import torch  # noqa: F401  (the extension links against torch's libraries)
try:
    _spec = importlib.util.spec_from_file_location("gsplat_cuda", "$PWD/.ext/gsplat_cuda.so")
    _mod = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(_mod)
except Exception as e:  # gsplat catches ImportError only: then it JIT-builds as usual
    raise ImportError(f"carried gsplat extension unusable: {e}") from e
sys.modules[__name__] = _mod
PYEOF
fi

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
stamp "JIT builds in parallel: gsplat, bytesplat's kernels and the sparse-grad kernels"
( timeout 420 $PY -c "import gsplat.cuda._backend as b; print('gsplat ext', b._C is not None, getattr(b._C, '__file__', ''))" > /tmp/gsplat_build.log 2>&1 ) &
GSPLAT_BUILD_PID=$!
( timeout 420 $PY -c "
import time; t = time.time()
from bytesplat_ns.raster._build import load_extension
ext = load_extension()
print('fused ext ok in %.0fs, capacity(2 blocks/SM)=%d' % (time.time() - t, ext.fused_capacity(2)))" > /tmp/fused_build.log 2>&1 ) &
FUSED_BUILD_PID=$!
( timeout 420 $PY -c "from bytesplat_ns.distributed.sparse_kernels import load_extension; load_extension(); print('sparse-grad ext ok')" > /tmp/sparse_build.log 2>&1 ) &
SPARSE_BUILD_PID=$!
( for size in ${SCENES:-}; do
    timeout 300 $PY -c "from bytesplat_ns.data.scene import SceneSpec, ensure_scene; print(ensure_scene(SceneSpec(size='$size')))"
  done > /tmp/scenes.log 2>&1 ) &
# wait on these only: a bare `wait` would also wait on the tee above
wait $GSPLAT_BUILD_PID $FUSED_BUILD_PID $SPARSE_BUILD_PID $!
tail -n 3 /tmp/gsplat_build.log /tmp/fused_build.log /tmp/sparse_build.log; [[ -n ${SCENES:-} ]] && tail -n 2 /tmp/scenes.log
so=$TORCH_EXTENSIONS_DIR/gsplat_cuda/gsplat_cuda.so
if [[ -f "$so" && ! -f .ext/gsplat_cuda.so ]]; then cp "$so" "$OUT/"; fi
true  # the caller's `source ... &&` sees this script's last status
