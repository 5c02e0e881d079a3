#!/usr/bin/env bash
# Two-GPU call (nvidia-h200-x2): two backward/forward kernel changes against the committed kernels.
#   rows: warp_mask keeps, per block row, only the columns the ellipse reaches over that row's
#         pixel-centre lines (cuda/common.cuh), instead of the whole bounding box;
#   rcp:  the backward's 1/(1 - alpha) through rcp_unit (approximate reciprocal + one Newton step)
#         instead of IEEE division.
# Variants, each a copy of the installed package with cuda/common.cuh replaced by
# gpu_variants/NAME/common.cuh (JIT-built under its own name, run from its own directory, so its
# cuda/ is the one loaded): base (common.cuh at ae87607, the committed kernels), rows (the row mask
# only), rcp (the reciprocal only). The installed package itself was both ("final").
# gpu_variants/ was made for the call and not committed: base = `git show ae87607:cuda/common.cuh`,
# rows and rcp = base with docs/benchmarks/kernels_1130_h200/variants/{rows,rcp}.patch applied.
# Outcome: rcp kept, rows dropped (slower: its mask costs the forward more than it saves).
# GPU 1: every one-GPU test on the final kernels (tests.log), then ncu instruction counts and
# durations of the split schedule's three kernels at 4M for base and final (ncu_{base,final}.csv).
# GPU 0: `bytesplat-bench raster` at 1M and 4M: final, base, rows, rcp, final again
# (raster_{final,base,rows,rcp,final2}.json).
# Writes to $OUT: log.txt, tests.log, raster_*.json (5), ncu.tgz.
#   device tool: kind nvidia-h200-x2, carry [".whl", ".ext"], timeout_s 600
BUDGET=${BUDGET:-420}
source scripts/gpu_begin.sh || exit 1
VARIANTS="base rows rcp"
for v in $VARIANTS; do MAX_JOBS=5 variant $v "cp gpu_variants/$v/common.cuh \$CUDA/" > /tmp/var_$v.log 2>&1 & done
ncu_split() {  # ncu_split NAME: the split stage's kernels at 4M, one profiled step -> /tmp/ncu/NAME.csv
  mkdir -p /tmp/ncu
  timeout 120 $NCU --profile-from-start off --kernel-name regex:"render_(fwd|bwd)_kernel|loss_grad_kernel" \
    --csv --metrics gpu__time_duration.sum,smsp__inst_executed.sum,smsp__sass_inst_executed_op_local_ld.sum,smsp__sass_inst_executed_op_local_st.sum,smsp__issue_active.avg.pct_of_peak_sustained_active,smsp__thread_inst_executed_per_inst_executed.ratio \
    $PY -m bytesplat_ns.bench.dram --stage fused-split --num-gaussians 4000000 > /tmp/ncu/$1.csv 2>&1
  stamp "ncu $1 rc=$?"; grep -E "render_|loss_grad" /tmp/ncu/$1.csv | awk -F'","' '{print $5, $(NF-2), $NF}' | cut -c1-160
}
(
  gpu_tests_one 1 150
  export CUDA_VISIBLE_DEVICES=1
  NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
  ncu_split final
  built base; in_variant base ncu_split base
  tar czf "$OUT/ncu.tgz" -C /tmp ncu
) &
SIDE_PID=$!
export CUDA_VISIBLE_DEVICES=0
raster_bench raster_final --raster-only
for v in $VARIANTS; do
  built $v; tail -n 2 /tmp/var_$v.log
  (( $(left) < 60 )) && break
  in_variant $v raster_bench raster_$v --raster-only
done
(( $(left) > 40 )) && raster_bench raster_final2 --raster-only
wait $SIDE_PID
stamp "done"
