# Sourced by every GPU script (after it sets OUT and BUDGET): environment, stamp, left, packages
# (gpu_packages.sh), then JIT builds of gsplat and of our two extensions in parallel, and with
# SCENES="large medium ..." the built-in scenes of those sizes generated alongside.
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 MAX_JOBS=${MAX_JOBS:-16}
export TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1  # NVLink multicast stays off
export TORCH_EXTENSIONS_DIR=${TORCH_EXTENSIONS_DIR:-/tmp/ext} BYTESPLAT_CACHE=${BYTESPLAT_CACHE:-/tmp/bytesplat_cache}
PY=${PYTHON:-python3}
T0=${T0:-$(date +%s)}
stamp() { echo "[$(basename "$0") +$(( $(date +%s) - T0 ))s] $*"; }
left() { echo $(( ${BUDGET:-600} - $(date +%s) + T0 )); }  # seconds left of the caller's BUDGET

source scripts/gpu_packages.sh || exit 1
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
# wait on these only: a bare `wait` would also wait on the caller's process substitutions
wait $GSPLAT_BUILD_PID $FUSED_BUILD_PID $SPARSE_BUILD_PID $!
tail -n 3 /tmp/gsplat_build.log /tmp/fused_build.log /tmp/sparse_build.log; [[ -n ${SCENES:-} ]] && tail -n 2 /tmp/scenes.log
# A fresh gsplat build goes back through $OUT, for later runs to carry in .ext/ (gpu_packages.sh).
so=$TORCH_EXTENSIONS_DIR/gsplat_cuda/gsplat_cuda.so
if [[ -n "$OUT" && -f "$so" && ! -f .ext/gsplat_cuda.so ]]; then cp "$so" "$OUT/"; fi
true  # the caller's `source ... || exit 1` sees this script's last status
