#!/usr/bin/env bash
# Two-GPU call (nvidia-h200-x2): a rank's views gathered from the received messages into the padded
# layout by one index (step._Padding), after the binning's size came with the step's gather.
# 1. GPU 1: every one-GPU test (tests.log); then the two-GPU NCCL tests (appended), among them the
#    new two-rank fused-compositor step against one process;
# 2. issue 5's scaling at 8 views, 1M and 4M, dense and sparse-grad next to gsplat (scaling_v8.json);
# 3. A/B at 1M, 8 views, dense, no gsplat: "read" (a copy of the installed package with step.py,
#    sharding.py and fused.py of 306e776 from gpu_variants/read/: the binning reads its size back,
#    views padded piece by piece) then this commit again: scaling_read_v8.json, scaling_v8b.json.
#    (gpu_variants/ is not committed; make it with: mkdir -p gpu_variants/read && for f in
#    distributed/step.py distributed/sharding.py raster/fused.py; do git show 306e776:bytesplat_ns/$f
#    > gpu_variants/read/$(basename $f); done)
# Writes to $OUT: log.txt, tests.log, scaling_v8.json, scaling_read_v8.json, scaling_v8b.json.
#   device tool: kind nvidia-h200-x2, carry [".whl", ".ext"], timeout_s 600
BUDGET=${BUDGET:-570}
source scripts/gpu_begin.sh || exit 1
d=/tmp/var_read; mkdir -p $d && cp -r /tmp/site/bytesplat_ns $d/
cp gpu_variants/read/step.py gpu_variants/read/sharding.py $d/bytesplat_ns/distributed/
cp gpu_variants/read/fused.py $d/bytesplat_ns/raster/
gpu_tests_one 1 170
stamp "both GPUs: two-GPU NCCL tests (timeout 130s)"
timeout 130 $PY -m pytest -q -p no:cacheprovider -o addopts="" tests -k "two_gpus or nccl" -rfEs --tb=short \
  >> "$OUT/tests.log" 2>&1
stamp "two-GPU tests rc=$? $(tail -n 1 "$OUT/tests.log")"
dist_bench scaling_v8 2 110 --num-gaussians 1000000 4000000 --views 8 --warmup 3 --repeats 10 \
  --communicators sparse-grad dense
in_variant read dist_bench scaling_read_v8 2 90 --num-gaussians 1000000 --views 8 --warmup 3 --repeats 10 \
  --communicators dense --skip-gsplat
(( $(left) > 60 )) && dist_bench scaling_v8b 2 $(( $(left) - 5 < 90 ? $(left) - 5 : 90 )) --num-gaussians 1000000 \
  --views 8 --warmup 3 --repeats 10 --communicators dense --skip-gsplat
stamp "done"
