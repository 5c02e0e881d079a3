#!/usr/bin/env bash
# Two-GPU call (nvidia-h200-x2), after the sharded step's host reads were cut (one gather of shard
# sizes and records per view instead of the layout gather, the per-destination nonzero, the size
# round and the per-source count reads; no gid-order check per view on the GPU).
# 1. every GPU test (gpu_tests): the communicators changed; test_distributed_gpu.py counts the
#    forward's host reads;
# 2. issue 5's scaling, side by side with gsplat, at 1M and 4M Gaussians, 1920x1080, SH 3, with 4 and
#    with 8 views per step (the matrix's setting: 3 warm-ups, 10 steps), dense and sparse-grad;
# 3. torch.profiler of the 1M dense step on 1 and 2 ranks (scripts/profile_dist_step.py), as before.
# Writes to $OUT: log.txt, tests.log, scaling_v4.json, scaling_v8.json, profile.tgz.
#   device tool: kind nvidia-h200-x2, carry [".whl", ".ext"], timeout_s 600
BUDGET=${BUDGET:-570}
source scripts/gpu_begin.sh || exit 1
gpu_tests
grep -o "[0-9]* host reads in the forward[^]]*]" "$OUT/tests.log" | head -2
for v in 8 4; do
  dist_bench scaling_v$v 2 $(( $(left) > 200 ? 150 : $(left) - 30 )) --num-gaussians 1000000 4000000 --views $v \
    --warmup 3 --repeats 10 --communicators sparse-grad dense
done
mkdir -p /tmp/prof
for R in 1 2; do
  (( $(left) < 40 )) && break
  timeout 60 $PY -m torch.distributed.run --standalone --nproc-per-node $R scripts/profile_dist_step.py /tmp/prof 1000000 4 dense 2>&1 | grep "rank"
done
tar czf "$OUT/profile.tgz" -C /tmp prof
stamp "done"
