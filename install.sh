#!/usr/bin/env bash
# Installs bytesplat-ns and everything its tests need into the current Python environment.
#   ./install.sh            system packages (when run as root with apt) + pip install -e ".[test]"
#   ./install.sh --no-system  skip apt (you install libusb-1.0, chromium, ffmpeg and npm yourself)
# System packages: libusb-1.0-0 (open3d, which `ns-export` imports, links against it), chromium (the viewer
# tests take headless-browser screenshots), ffmpeg (`ns-render` writes videos with it) and nodejs/npm (the
# export viewer test installs a web splat viewer from the npm registry).
set -euo pipefail
cd "$(dirname "$0")"
PYTHON=${PYTHON:-python3}

if [[ "${1:-}" != "--no-system" ]] && command -v apt-get >/dev/null 2>&1 && [[ $(id -u) -eq 0 ]]; then
    echo "[install] system packages: libusb-1.0-0 chromium ffmpeg g++ nodejs npm"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends libusb-1.0-0 chromium fonts-dejavu-core ffmpeg >/dev/null
    # the JIT builds of the CUDA kernels (nvcc's host compiler) and their CPU tests need a C++ compiler
    command -v g++ >/dev/null 2>&1 || apt-get install -y -qq --no-install-recommends g++ >/dev/null
    # nodejs/npm from apt only when missing: a node installed another way keeps its own npm
    command -v npm >/dev/null 2>&1 || apt-get install -y -qq --no-install-recommends nodejs npm >/dev/null
fi

echo "[install] python packages (nerfstudio 1.1.5, gsplat 1.4.0, torch) and bytesplat-ns"
"$PYTHON" -m pip install -q --upgrade pip
"$PYTHON" -m pip install -q -e ".[test]"
command -v pyenv >/dev/null 2>&1 && pyenv rehash || true  # expose ns-train & co. through pyenv shims
"$PYTHON" -c "import bytesplat_ns, nerfstudio, gsplat, torch; print('[install] ok: torch', torch.__version__)"
