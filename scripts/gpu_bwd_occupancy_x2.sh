#!/usr/bin/env bash
# Two-GPU call (nvidia-h200-x2): does the plain backward gain from more resident blocks? Nsight
# Compute (gpu_bwd_profile_x2.sh) found render_bwd issue-bound at 50% occupancy (61 registers: 4
# blocks of 256 threads per SM, 21% of cycles with no eligible warp). Variants are copies of the
# installed package with one edit of cuda/render.cu, each JIT-built under its own name:
#   base: as committed;
#   bwd5: render_bwd_kernel __launch_bounds__(kBlock, 5) (48 registers, 4 bytes of spill in one instance);
#   bwd6: __launch_bounds__(kBlock, 6) (40 registers, 32-64 bytes of spill);
#   bwd5_fwd8: bwd5 and render_fwd_kernel __launch_bounds__(kBlock, 8) (32 registers).
# GPU 1: `bytesplat-bench raster` at 1M and 4M with each (raster_<variant>.json); GPU 0 meanwhile:
# every one-GPU test with bwd5 (tests.log), so that the variant can be kept if it wins.
# Writes to $OUT: log.txt, tests.log, raster_{base,bwd5,bwd6,bwd5_fwd8}.json.
# FLAWED, kept as the record of what ran (2026-11-30 06:27 UTC): the variants ran from the checkout,
# where `python -m` puts the checkout first on sys.path and its ../cuda sources win, so every
# variant (and the tests) used the committed kernels. Its four raster files are four repeats of one
# build (docs/benchmarks/warp_cull_h200/raster_same_kernels_{1..4}.json: the run-to-run spread).
# gpu_culling_train_x2.sh runs each variant from its own directory.
#   device tool: kind nvidia-h200-x2, carry [".whl", ".ext"], timeout_s 600
BUDGET=${BUDGET:-420}
source scripts/gpu_begin.sh || exit 1
BWD='s/__global__ void __launch_bounds__(kBlock) render_bwd_kernel/__global__ void __launch_bounds__(kBlock, MINB) render_bwd_kernel/'
FWD='s/__global__ void __launch_bounds__(kBlock) render_fwd_kernel/__global__ void __launch_bounds__(kBlock, 8) render_fwd_kernel/'
variant() {  # variant NAME SED...: /tmp/var_NAME = the installed package with cuda/render.cu edited, built
  local d=/tmp/var_$1 f; shift
  mkdir -p $d && cp -r /tmp/site/bytesplat_ns $d/ && f=$d/bytesplat_ns/cuda/render.cu
  for e in "$@"; do sed -i "$e" $f; done
  echo "$d: $(grep -c "__launch_bounds__(kBlock, [0-9])" $f) edited kernel(s)"
  PYTHONPATH=$d:$PYTHONPATH timeout 300 $PY -c "from bytesplat_ns.raster._build import load_extension; load_extension()" 2>&1 | tail -n 1
}
stamp "building the variants"
variant bwd5 "${BWD/MINB/5}" & P1=$!
variant bwd6 "${BWD/MINB/6}" & P2=$!
variant bwd5_fwd8 "${BWD/MINB/5}" "$FWD" & P3=$!
wait $P1 $P2 $P3  # not a bare wait: that would also wait on gpu_begin.sh's tee
stamp "built"
(
  export CUDA_VISIBLE_DEVICES=1
  raster_bench raster_base
  for v in bwd5 bwd6 bwd5_fwd8; do PYTHONPATH=/tmp/var_$v:$PYTHONPATH raster_bench raster_$v; done
) &
SIDE_PID=$!
PYTHONPATH=/tmp/var_bwd5:$PYTHONPATH gpu_tests_one
wait $SIDE_PID
stamp "done"
