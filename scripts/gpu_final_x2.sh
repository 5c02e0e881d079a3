#!/usr/bin/env bash
# Two-GPU call (nvidia-h200-x2), the session's last: the SH kernel's tests after the degree-0 test
# fix (tests.log), then issue 5's figures at 16M Gaussians, 8 views, with this commit's code
# (scaling_16m_v8.json; the first call measured them before the SH kernel).
#   device tool: kind nvidia-h200-x2, carry [".whl", ".ext"], timeout_s 330
BUDGET=${BUDGET:-320}
source scripts/gpu_begin.sh || exit 1
stamp "GPU 1: the SH kernel's tests"
CUDA_VISIBLE_DEVICES=1 timeout 60 $PY -m pytest -q -p no:cacheprovider -o addopts="" tests/test_sh_views_gpu.py \
  -rfE --tb=short > "$OUT/tests.log" 2>&1
stamp "SH tests rc=$? $(tail -n 1 "$OUT/tests.log")"
dist_bench scaling_16m_v8 2 $(( $(left) - 5 )) --num-gaussians 16000000 --views 8 --warmup 2 --repeats 5 \
  --communicators sparse-grad dense
stamp "done"
