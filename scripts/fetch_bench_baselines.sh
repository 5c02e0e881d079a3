#!/usr/bin/env bash
# The benchmark-only baselines, fetched on a machine with PyPI access into .whl_bench/ (ignored by
# git; carried to the GPU machine, where scripts/gpu_setup.sh installs them away from training):
#
#   scripts/fetch_bench_baselines.sh          # from the repository root
#
# - gsplat-1.5.3-py3-none-any.whl: gsplat 1.5.3 (its CUDA extension is JIT-built on the GPU machine
#   and can then be carried as .ext/gsplat-1.5.3_cuda.so[.xz]);
# - fussim-0.3.15.tar.xz: fussim 0.3.15's Python package from its cp312 wheel, without the wheel's
#   prebuilt extensions (they do not load against torch 2.11; scripts/build_fussim.py builds one);
# - fussim_src/: fussim's CUDA sources (csrc/ of its latest source distribution on PyPI, 0.3.1: the
#   kernels the 0.3.15 wheels are built from) for scripts/build_fussim.py.
set -euo pipefail
GSPLAT=1.5.3 FUSSIM=0.3.15 FUSSIM_SDIST=0.3.1
dest=.whl_bench; tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
mkdir -p "$dest"
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform any -d "$tmp" "gsplat==$GSPLAT" "fussim==$FUSSIM"
# The sdist's link from PyPI's simple index: `pip download` of an sdist runs its setup.py, which imports torch.
python3 - "$FUSSIM_SDIST" "$tmp" <<'PYEOF'
import re, sys, urllib.request
version, dest = sys.argv[1], sys.argv[2]
with urllib.request.urlopen("https://pypi.org/simple/fussim/", timeout=60) as r:
    page = r.read().decode()
(url,) = set(re.findall(rf'href="([^"#]*/fussim-{re.escape(version)}\.tar\.gz)', page))
urllib.request.urlretrieve(url, f"{dest}/fussim-{version}.tar.gz")
PYEOF
cp "$tmp/gsplat-$GSPLAT-py3-none-any.whl" "$dest/"
mkdir -p "$tmp/wheel" "$tmp/sdist"
python3 -m zipfile -e "$tmp"/fussim-$FUSSIM-cp312-*.whl "$tmp/wheel"
rm -f "$tmp"/wheel/fussim/_cuda_*.so
tar -cJf "$dest/fussim-$FUSSIM.tar.xz" -C "$tmp/wheel" fussim
tar -xzf "$tmp/fussim-$FUSSIM_SDIST.tar.gz" -C "$tmp/sdist"
rm -rf "$dest/fussim_src"; cp -r "$tmp/sdist/fussim-$FUSSIM_SDIST/csrc" "$dest/fussim_src"
ls -la "$dest" "$dest/fussim_src"
