#!/usr/bin/env bash
# Two-GPU call (nvidia-h200-x2): the sharded step builds a group's padded fields straight from the
# received record tables (step._PaddedViewFields: ~25 fewer launches between the step's host read and
# its first render). GPU tests of the distributed step (test_distributed_gpu.py, both GPUs: its NCCL
# test compares the two-rank fused step with one process), the other two-GPU tests, then an A/B at
# 1M Gaussians, 8 views, dense, against the step before it (gpu_variants/step_before.py, uncommitted:
# `git show bfbceb6:bytesplat_ns/distributed/step.py > gpu_variants/step_before.py`): new_1, before_1,
# new_2, before_2.
#   device tool: kind nvidia-h200-x2, carry [".whl", ".ext"], timeout_s 400
BUDGET=${BUDGET:-390}
source scripts/gpu_begin.sh || exit 1
variant before "cp gpu_variants/step_before.py \$CUDA/../distributed/step.py" > /tmp/variant.log 2>&1 &
stamp "distributed GPU tests"
timeout 120 $PY -m pytest -q -p no:cacheprovider -o addopts="" tests/test_distributed_gpu.py -rfEs --tb=short > "$OUT/tests.log" 2>&1
stamp "test_distributed_gpu.py rc=$? $(tail -n 1 "$OUT/tests.log")"
timeout 150 $PY -m pytest -q -p no:cacheprovider -o addopts="" tests -k "(two_gpus or nccl) and not test_distributed_gpu" \
  -rfEs --tb=short >> "$OUT/tests.log" 2>&1
stamp "other two-GPU tests rc=$? $(tail -n 1 "$OUT/tests.log")"
built before; cat /tmp/variant.log
B="distributed --width 1920 --height 1080 --num-gaussians 1000000 --views 8 --warmup 3 --repeats 10 --communicators dense --skip-gsplat"
for i in 1 2; do
  (( $(left) < 45 )) && break
  stamp "new_$i"; timeout 60 $PY -m torch.distributed.run --standalone --nproc-per-node 2 -m bytesplat_ns.bench.cli $B \
    --out "$OUT/new_$i.json" > /tmp/new_$i.log 2>&1; grep -E "^ +N=" /tmp/new_$i.log | cut -c1-160
  (( $(left) < 45 )) && break
  stamp "before_$i"; in_variant before timeout 60 $PY -m torch.distributed.run --standalone --nproc-per-node 2 \
    -m bytesplat_ns.bench.cli $B --out "$OUT/before_$i.json" > /tmp/before_$i.log 2>&1; grep -E "^ +N=" /tmp/before_$i.log | cut -c1-160
done
stamp "done"
