#!/usr/bin/env bash
# Two-GPU call (nvidia-h200-x2): the sharded step's binning size comes with the step's one gather
# (tile_intersections / bin_tiles known_total), so the forward reads the device once, not twice.
# 1. GPU 1: every one-GPU test (tests.log; the binning's known-total test, the forward's one read)
#    while GPU 0 profiles the one-rank step; then the two-rank profile (1M, 8 views, dense, with
#    Python frames: profile.tgz, scripts/trace_gaps.py reads the traces);
# 2. A/B at 8 views: this commit (scaling_v8.json: 1M and 4M, dense and sparse-grad, next to gsplat)
#    and "read" (a copy of the installed package with step.py, sharding.py and fused.py of 306e776
#    from gpu_variants/read/, i.e. the binning reads its size back; 1M only, no gsplat:
#    scaling_read_v8.json), then this commit at 1M again (scaling_v8b.json);
# 3. 16M Gaussians, 8 views: every issue-5 figure on one scene (scaling_16m_v8.json);
# 4. the two-GPU NCCL tests (appended to tests.log).
#    (gpu_variants/ is not committed; make it with: mkdir -p gpu_variants/read && for f in
#    distributed/step.py distributed/sharding.py raster/fused.py; do git show 306e776:bytesplat_ns/$f
#    > gpu_variants/read/$(basename $f); done)
# Writes to $OUT: log.txt, tests.log, profile.tgz, scaling_v8.json, scaling_read_v8.json,
# scaling_v8b.json, scaling_16m_v8.json.
#   device tool: kind nvidia-h200-x2, carry [".whl", ".ext"], timeout_s 600
BUDGET=${BUDGET:-570}
source scripts/gpu_begin.sh || exit 1
d=/tmp/var_read; mkdir -p $d && cp -r /tmp/site/bytesplat_ns $d/
cp gpu_variants/read/step.py gpu_variants/read/sharding.py $d/bytesplat_ns/distributed/
cp gpu_variants/read/fused.py $d/bytesplat_ns/raster/
mkdir -p /tmp/prof
gpu_tests_one 1 170 &
TESTS_PID=$!
stamp "profile, 1 rank (GPU 0)"
CUDA_VISIBLE_DEVICES=0 timeout 120 $PY -m torch.distributed.run --standalone --nproc-per-node 1 \
  scripts/profile_dist_step.py /tmp/prof 1000000 8 dense 2>&1 | grep -E "rank|Error" | tail -n 3
wait $TESTS_PID
stamp "profile, 2 ranks"
timeout 120 $PY -m torch.distributed.run --standalone --nproc-per-node 2 \
  scripts/profile_dist_step.py /tmp/prof 1000000 8 dense 2>&1 | grep -E "rank|Error" | tail -n 3
tar czf "$OUT/profile.tgz" -C /tmp prof
dist_bench scaling_v8 2 110 --num-gaussians 1000000 4000000 --views 8 --warmup 3 --repeats 10 \
  --communicators sparse-grad dense
in_variant read dist_bench scaling_read_v8 2 60 --num-gaussians 1000000 --views 8 --warmup 3 --repeats 10 \
  --communicators dense --skip-gsplat
dist_bench scaling_v8b 2 60 --num-gaussians 1000000 --views 8 --warmup 3 --repeats 10 --communicators dense \
  --skip-gsplat
(( $(left) > 150 )) && dist_bench scaling_16m_v8 2 $(( $(left) - 60 )) --num-gaussians 16000000 --views 8 \
  --warmup 2 --repeats 5 --communicators sparse-grad dense
gpu_tests_two
stamp "done"
