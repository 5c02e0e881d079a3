#!/usr/bin/env bash
# Two-GPU call (nvidia-h200-x2): the sharded step scores all of a rank's views in one call of the
# fused kernels (composite_views_fused_loss in bytesplat_ns/distributed/step.py: padded, binned
# together, one launch of each kernel) instead of one call per view.
# 1. GPU 1: every one-GPU test (tests.log; among them the one-call-vs-each-view test and the
#    forward's host reads, now 2); then the two-GPU NCCL tests (appended);
# 2. issue 5's scaling at 1M and 4M, 8, 4 and 16 views per step, dense and sparse-grad, next to
#    gsplat (scaling_v{8,4,16}.json), then 8 views again with the per-view step ("perview": a copy of
#    the installed package with bytesplat_ns/distributed/step.py from gpu_variants/perview/, i.e.
#    commit 796c4ad's, made for the call and not committed) -> scaling_perview_v8.json.
# Writes to $OUT: log.txt, tests.log, scaling_v{8,4,16}.json, scaling_perview_v8.json
# (kept in docs/benchmarks/kernels_1130_h200/batched_views/).
#   device tool: kind nvidia-h200-x2, carry [".whl", ".ext"], timeout_s 500
BUDGET=${BUDGET:-440}
source scripts/gpu_begin.sh || exit 1
d=/tmp/var_perview; mkdir -p $d && cp -r /tmp/site/bytesplat_ns $d/ && cp gpu_variants/perview/step.py $d/bytesplat_ns/distributed/step.py
gpu_tests_one 1 150
gpu_tests_two
dist_scaling 8 4 16
if (( $(left) > 70 )); then
  (cd $d && PYTHONPATH=$d:$PYTHONPATH dist_bench scaling_perview_v8 2 $(( $(left) - 15 )) --num-gaussians 1000000 4000000 \
    --views 8 --warmup 3 --repeats 10 --communicators sparse-grad dense)
fi
stamp "done"
