# Sourced by the GPU scripts: packages from .whl (device machine, no network) into /tmp/site, and
# gsplat's CUDA extension from .ext/gsplat_cuda.so when a run carries one (built by an earlier run
# of the same machine kind and returned through $OUT): it is loaded as gsplat.csrc, which gsplat
# tries before its ~3-minute JIT build. Expects PY and stamp().
if [[ -d .whl ]]; then
  stamp "installing wheels"
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  $PY -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --upgrade --target /tmp/site . || exit 1
  export PYTHONPATH=/tmp/site:$PWD PATH=/tmp/site/bin:$PATH
fi
if [[ -f .ext/gsplat_cuda.so ]]; then
  GS=$($PY -c "import importlib.util as u; print(u.find_spec('gsplat').submodule_search_locations[0])")
  cat > "$GS/csrc.py" <<EOF
# Written by scripts/gpu_packages.sh: gsplat's CUDA extension, built on an earlier run of this machine kind.
import importlib.util, sys
import torch  # noqa: F401  (the extension links against torch's libraries)
try:
    _spec = importlib.util.spec_from_file_location("gsplat_cuda", "$PWD/.ext/gsplat_cuda.so")
    _mod = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(_mod)
except Exception as e:  # gsplat catches ImportError only: then it JIT-builds as usual
    raise ImportError(f"carried gsplat extension unusable: {e}") from e
sys.modules[__name__] = _mod
EOF
fi
