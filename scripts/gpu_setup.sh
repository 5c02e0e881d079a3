# The GPU machine's setup, sourced from the repository root before any benchmark:
#
#   source scripts/gpu_setup.sh && bytesplat-bench suite raster-1080p --results-dir "$OUT/results"
#   (device tool: carry [".whl", ".ext"] and, for the baselines, ".whl_bench"; SCENES="large medium" also
#   generates those built-in scenes; `wait_baselines` before timing the baselines or a wall clock, or from a
#   `bytesplat-bench queue` job, which does not source this script, scripts/wait_baselines.sh)
#
# 1. Environment: NVLink multicast off (NCCL_NVLS_ENABLE=0 and the torch/NVSHMEM switches: the lent
#    machines do not support it), unbuffered output, the extension and scene caches under /tmp.
#    Everything printed from here on also goes to $OUT/log.txt (OUT defaults to ./gpu_out).
# 2. Packages: with a carried .whl/ (the machine has no network), every wheel and this checkout go
#    into /tmp/site, first on PYTHONPATH and PATH (so `bytesplat-bench` is this checkout's).
# 3. gsplat's CUDA extension: a carried .ext/gsplat_cuda.so (built by an earlier run of the same
#    machine kind) is loaded as gsplat.csrc, which gsplat tries before its ~3-minute JIT build; a
#    fresh build is copied to $OUT, to be carried in .ext/ next time.
# 4. JIT builds of gsplat and of our two extensions in parallel (and the SCENES alongside). Our two
#    load from a carried .ext/bytesplat_jit.tar.xz (their .so files, unpacked into the cache, imported
#    by their hashed names: raster/_build.py) when the sources, flags and torch are the same; modules
#    built here go to $OUT/bytesplat_jit.tar.xz, to be carried in .ext/ next time.
# 5. Benchmark-only baselines from a carried .whl_bench/ (never on PYTHONPATH for training): each
#    gsplat-X.Y.Z wheel into /tmp/gsplat-X.Y.Z (`bytesplat-bench raster --gsplat-site /tmp/gsplat-X.Y.Z`
#    puts it first in a child process), its extension from .ext/gsplat-X.Y.Z_cuda.so[.xz] or built in
#    the background (copied to $OUT); fussim into /tmp/site, its extension from .ext/fussim_cuda.so or
#    built from .whl_bench/fussim_src by scripts/build_fussim.py (copied to $OUT): its wheel's
#    prebuilt ones do not load against torch 2.11. scripts/fetch_bench_baselines.sh fills .whl_bench/.
# 6. Compiled bytecode, as a pip install leaves it: the machine's own environment ships without
#    .pyc files (every process compiled ~4,000 modules, ~10 s of each ns-train's start-up, both
#    methods alike), so bytecode goes to PYTHONPYCACHEPREFIX and one warm-up import (alongside the
#    builds) writes it before anything is timed. The same process runs one cuDNN convolution, so cuDNN's
#    libraries are in the page cache as on a machine that has trained before: on a fresh machine the first
#    ns-train of a call waited 0.9-2.0 s for its eval-image metrics, the later ones 0.02 s (2026-12-07);
#    the suspect, not yet confirmed, is their SSIM, a run's first cuDNN call under bytesplat.
# Carried extensions may be xz-compressed (.so.xz), to fit the device's transfer limit.
set -o pipefail
OUT=${OUT:-$PWD/gpu_out}; mkdir -p "$OUT"
exec > >(tee -a "$OUT/log.txt") 2>&1
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 MAX_JOBS=${MAX_JOBS:-16}
export TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export TORCH_EXTENSIONS_DIR=${TORCH_EXTENSIONS_DIR:-/tmp/ext} BYTESPLAT_CACHE=${BYTESPLAT_CACHE:-/tmp/bytesplat_cache}
export PYTHONPYCACHEPREFIX=${PYTHONPYCACHEPREFIX:-/tmp/pycache}; unset PYTHONDONTWRITEBYTECODE
PY=${PYTHON:-python3}
T0=${T0:-$(date +%s)}
stamp() { echo "[gpu_setup +$(( $(date +%s) - T0 ))s] $*"; }

if [[ -d .whl ]]; then
  stamp "installing wheels"
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || return 1
  $PY -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --upgrade --target /tmp/site . || return 1
  export PYTHONPATH=/tmp/site:$PWD PATH=/tmp/site/bin:$PATH
fi
carried_so() {  # carried_so NAME: the path of .ext/NAME (decompressed from .ext/NAME.xz), or nothing
  if [[ -f .ext/$1 ]]; then echo "$PWD/.ext/$1"
  elif [[ -f .ext/$1.xz ]]; then mkdir -p /tmp/carried_ext; xz -dc ".ext/$1.xz" > "/tmp/carried_ext/$1" && echo "/tmp/carried_ext/$1"
  fi
}
gsplat_shim() {  # gsplat_shim PACKAGE_DIR SO: gsplat loads SO as gsplat.csrc, which it tries before its JIT build
  cat > "$1/csrc.py" <<PYEOF
# Written by scripts/gpu_setup.sh: gsplat's CUDA extension, built on an earlier run of this machine kind.
import importlib.util, sys
import torch  # noqa: F401  (the extension links against torch's libraries)
try:
    _spec = importlib.util.spec_from_file_location("gsplat_cuda", "$2")
    _mod = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(_mod)
except Exception as e:  # gsplat catches ImportError only: then it JIT-builds as usual
    raise ImportError(f"carried gsplat extension unusable: {e}") from e
sys.modules[__name__] = _mod
PYEOF
}
SO=$(carried_so gsplat_cuda.so)
if [[ -n "$SO" ]]; then
  gsplat_shim "$($PY -c "import importlib.util as u; print(u.find_spec('gsplat').submodule_search_locations[0])")" "$SO"
fi
BASELINE_PIDS=""
# Waits for the baselines' background builds; a bare `wait` (no builds running) would also wait for
# the tee of this script's log, which never ends. A process that did not source this script (a
# `bytesplat-bench queue` job) runs scripts/wait_baselines.sh instead: each build holds a marker in
# $BASELINE_BUILDS until it ends.
wait_baselines() { [[ -z "$BASELINE_PIDS" ]] || wait $BASELINE_PIDS; }
export BASELINE_BUILDS=${BASELINE_BUILDS:-/tmp/baseline-builds}
mkdir -p "$BASELINE_BUILDS"
for whl in .whl_bench/gsplat-*.whl; do
  [[ -f $whl ]] || continue
  v=$(basename "$whl" | cut -d- -f2); site=/tmp/gsplat-$v
  $PY -m pip install -q --no-index --no-deps --no-compile --target "$site" "$whl" || return 1
  SO=$(carried_so "gsplat-${v}_cuda.so")
  if [[ -n "$SO" ]]; then gsplat_shim "$site/gsplat" "$SO"
  else
    stamp "gsplat $v: building its extension in the background (copied to \$OUT/gsplat-${v}_cuda.so)"
    touch "$BASELINE_BUILDS/gsplat-$v"
    ( nice -n 10 env PYTHONPATH=$site:$PYTHONPATH TORCH_EXTENSIONS_DIR=/tmp/ext-gsplat-$v timeout 600 \
        $PY -c "import gsplat.cuda._backend as b; assert b._C is not None" > "/tmp/gsplat-$v.log" 2>&1 \
      && cp "/tmp/ext-gsplat-$v/gsplat_cuda/gsplat_cuda.so" "$OUT/gsplat-${v}_cuda.so"; rm -f "$BASELINE_BUILDS/gsplat-$v" ) &
    BASELINE_PIDS="$BASELINE_PIDS $!"
  fi
done
if compgen -G ".whl_bench/fussim-*.tar.xz" > /dev/null; then
  tar xJf .whl_bench/fussim-*.tar.xz -C /tmp/site
  SO=$(carried_so fussim_cuda.so)
  FUSSIM_SO=$($PY scripts/build_fussim.py --target /tmp/site)
  if [[ -n "$SO" ]]; then cp "$SO" "$FUSSIM_SO"
  elif [[ -d .whl_bench/fussim_src ]]; then
    stamp "fussim: building its extension from its CUDA sources in the background (copied to \$OUT/fussim_cuda.so)"
    touch "$BASELINE_BUILDS/fussim"
    ( timeout 600 $PY scripts/build_fussim.py .whl_bench/fussim_src /tmp/site > /tmp/fussim_build.log 2>&1 \
      && cp "$FUSSIM_SO" "$OUT/fussim_cuda.so"; rm -f "$BASELINE_BUILDS/fussim" ) &
    BASELINE_PIDS="$BASELINE_PIDS $!"
  fi
fi

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
if [[ -f .ext/bytesplat_jit.tar.xz ]]; then
  mkdir -p "$TORCH_EXTENSIONS_DIR" && tar -C "$TORCH_EXTENSIONS_DIR" -xJf .ext/bytesplat_jit.tar.xz \
    && stamp "unpacked the carried builds of our kernels: $(tar -tJf .ext/bytesplat_jit.tar.xz | grep -c '\.so$') module(s)"
fi
stamp "JIT builds in parallel: gsplat, bytesplat's kernels and the sparse-grad kernels"
touch /tmp/jit_builds_began
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
SCENES_PID=$!
( $PY -c "import nerfstudio.scripts.train, nerfstudio.scripts.eval, bytesplat_ns.launcher, bytesplat_ns.bench.wallclock, bytesplat_ns.raster.fused, torchmetrics.image.lpip, sklearn.neighbors, matplotlib.font_manager
import torch
if torch.cuda.is_available():  # cuDNN's libraries into the page cache: one convolution, as the eval's SSIM runs
    torch.nn.functional.conv2d(torch.zeros(1, 3, 16, 16, device='cuda'), torch.zeros(3, 1, 3, 3, device='cuda'), groups=3)
    torch.cuda.synchronize()" > /tmp/warmup.log 2>&1 ) &
# wait on these only: a bare `wait` would also wait on the tee above
wait $GSPLAT_BUILD_PID $FUSED_BUILD_PID $SPARSE_BUILD_PID $SCENES_PID $!
tail -n 3 /tmp/gsplat_build.log /tmp/fused_build.log /tmp/sparse_build.log; [[ -n ${SCENES:-} ]] && tail -n 2 /tmp/scenes.log
if grep -qs "^Building" /tmp/fused_build.log /tmp/sparse_build.log; then  # built here, not unpacked
  # the modules built since the builds began (not older ones unpacked from a carry)
  ( cd "$TORCH_EXTENSIONS_DIR" && find . -path './bytesplat_*/bytesplat_*.so' -newer /tmp/jit_builds_began -print0 \
      | tar --null -T - -cJf "$OUT/bytesplat_jit.tar.xz.tmp" \
    && mv "$OUT/bytesplat_jit.tar.xz.tmp" "$OUT/bytesplat_jit.tar.xz" ) &
fi
so=$TORCH_EXTENSIONS_DIR/gsplat_cuda/gsplat_cuda.so
if [[ -f "$so" && -z "$(carried_so gsplat_cuda.so)" ]]; then cp "$so" "$OUT/"; fi
true  # the caller's `source ... &&` sees this script's last status
