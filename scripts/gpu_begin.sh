# Sourced first by a GPU script, after it sets BUDGET (and SCENES, and its own settings): pipefail;
# OUT (default ./gpu_out); everything printed from here on also goes to $OUT/log.txt; then
# gpu_setup.sh (packages, JIT builds, scenes) and gpu_train_lib.sh (the shared run functions).
set -o pipefail
OUT=${OUT:-$PWD/gpu_out}; mkdir -p "$OUT"
exec > >(tee -a "$OUT/log.txt") 2>&1
source scripts/gpu_setup.sh || return 1
source scripts/gpu_train_lib.sh
