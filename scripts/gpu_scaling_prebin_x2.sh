#!/usr/bin/env bash
# Two-GPU call (nvidia-h200-x2) made at commit 46edde2, where the sharded forward binned every
# view's records before rendering any (so the binning's host reads would not wait on the previous
# view's render). It measured no gain (docs/benchmarks.md, "Where the 1M two-GPU step loses"), and
# that change was reverted; the script stays as the record of the run. The
# one-GPU tests of the sharded step (test_distributed_gpu.py) and the two-GPU NCCL tests, then
# issue 5's scaling exactly as in gpu_scaling_x2.sh (1M and 4M, 8 and 4 views per step).
# Writes to $OUT: log.txt, tests.log, scaling_v4.json, scaling_v8.json.
#   device tool: kind nvidia-h200-x2, carry [".whl", ".ext"], timeout_s 400
BUDGET=${BUDGET:-330}
source scripts/gpu_begin.sh || exit 1
CUDA_VISIBLE_DEVICES=0 timeout 90 $PY -m pytest -q -s -p no:cacheprovider -o addopts="" tests/test_distributed_gpu.py \
  -rfE --tb=short > "$OUT/tests.log" 2>&1
stamp "sharded-step GPU tests rc=$? $(tail -n 1 "$OUT/tests.log")"; grep -o "[0-9]* host reads in the forward.*" "$OUT/tests.log" | cut -c1-300
timeout 100 $PY -m pytest -q -p no:cacheprovider -o addopts="" tests -k "two_gpus or nccl" -rfEs --tb=short >> "$OUT/tests.log" 2>&1
stamp "two-GPU tests rc=$? $(tail -n 1 "$OUT/tests.log")"
for v in 8 4; do
  dist_bench scaling_v$v 2 $(( $(left) > 130 ? 110 : $(left) - 10 )) --num-gaussians 1000000 4000000 --views $v \
    --warmup 3 --repeats 10 --communicators sparse-grad dense
done
stamp "done"
