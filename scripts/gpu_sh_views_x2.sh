#!/usr/bin/env bash
# Two-GPU call (nvidia-h200-x2): SH colors of several cameras in one launch each way
# (cuda/sh_views.cu, used by fused.project for the sharded step's C views).
# 1. GPU 1: every one-GPU test (tests.log: the kernel against its twin and against gsplat per
#    camera among them); then the two-GPU NCCL tests (appended);
# 2. A/B at 1M, 8 views, dense, no gsplat: this commit (scaling_sh_v8.json), "loop" (a copy of the
#    installed package with fused.py of the commit before, gpu_variants/loop/: gsplat's SH once per
#    camera; scaling_loop_v8.json), this commit again (scaling_sh_v8b.json);
# 3. issue 5's scaling at 8 views, 1M and 4M, dense and sparse-grad next to gsplat (scaling_v8.json).
#    (gpu_variants/ is not committed; make it with: mkdir -p gpu_variants/loop &&
#    git show 8f8b5ca~1:bytesplat_ns/raster/fused.py > gpu_variants/loop/fused.py)
# Writes to $OUT: log.txt, tests.log and the four JSON files.
#   device tool: kind nvidia-h200-x2, carry [".whl", ".ext"], timeout_s 600
BUDGET=${BUDGET:-560}
source scripts/gpu_begin.sh || exit 1
d=/tmp/var_loop; mkdir -p $d && cp -r /tmp/site/bytesplat_ns $d/ && cp gpu_variants/loop/fused.py $d/bytesplat_ns/raster/
gpu_tests_one 1 170
stamp "both GPUs: two-GPU NCCL tests (timeout 130s)"
timeout 130 $PY -m pytest -q -p no:cacheprovider -o addopts="" tests -k "two_gpus or nccl" -rfEs --tb=short \
  >> "$OUT/tests.log" 2>&1
stamp "two-GPU tests rc=$? $(tail -n 1 "$OUT/tests.log")"
ab() { dist_bench $1 2 80 --num-gaussians 1000000 --views 8 --warmup 3 --repeats 10 --communicators dense --skip-gsplat; }
ab scaling_sh_v8
in_variant loop ab scaling_loop_v8
ab scaling_sh_v8b
(( $(left) > 90 )) && dist_bench scaling_v8 2 $(( $(left) - 5 < 110 ? $(left) - 5 : 110 )) \
  --num-gaussians 1000000 4000000 --views 8 --warmup 3 --repeats 10 --communicators sparse-grad dense
stamp "done"
