#!/usr/bin/env bash
# Two-GPU call (nvidia-h200-x2): per-warp culling (runtime switch BYTESPLAT_WARP_CULL) and the plain
# backward reducing a whole 256-Gaussian batch between two barriers (was 32).
# 1. GPU 0: every one-GPU test (the culled kernels against the unculled ones, bit for bit);
#    meanwhile GPU 1: `bytesplat-bench raster` at 1M and 4M, 1920x1080 (raster.json: culling on and,
#    in the same run, off), then Nsight Compute on the split stage at 4M: render_bwd's and
#    render_fwd's warp stalls, occupancy and throughput (ncu_split_4m.txt), and which atomics the
#    backward compiles to (sass_atomics.txt);
# 2. the two-GPU NCCL tests.
# Writes to $OUT: log.txt, tests.log, raster.json, ncu_split_4m.txt, sass_atomics.txt.
#   device tool: kind nvidia-h200-x2, carry [".whl", ".ext"], timeout_s 600
BUDGET=${BUDGET:-450}
source scripts/gpu_begin.sh || exit 1
(
  export CUDA_VISIBLE_DEVICES=1
  raster_bench raster
  NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
  stamp "ncu: render_fwd / render_bwd at 4M (split stage)"
  timeout 150 $NCU --profile-from-start off --kernel-name regex:"render_(fwd|bwd)_kernel" --launch-count 2 \
    --section LaunchStats --section Occupancy --section SpeedOfLight --section WarpStateStats \
    --section SchedulerStats --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \
    --section SourceCounters $PY -m bytesplat_ns.bench.dram --stage fused-split --num-gaussians 4000000 \
    > "$OUT/ncu_split_4m.txt" 2>&1
  stamp "ncu rc=$? $(grep -c "render_" "$OUT/ncu_split_4m.txt") lines naming the kernels"
  so=$(ls /tmp/ext/bytesplat_cuda_*/*.so | head -1)
  CUOBJ=$(command -v cuobjdump || echo /usr/local/cuda/bin/cuobjdump)
  $CUOBJ -sass "$so" 2>&1 | awk '/Function :/{f=$3} match($0, /(ATOMS|ATOMG|ATOM|RED)\.[A-Z0-9_.]+/) \
    {print f, substr($0, RSTART, RLENGTH)}' | sort | uniq -c > "$OUT/sass_atomics.txt"
  stamp "sass atomics: $(wc -l < "$OUT/sass_atomics.txt") kinds"
) &
SIDE_PID=$!
gpu_tests_one
wait $SIDE_PID
gpu_tests_two
stamp "done"
