#!/usr/bin/env bash
# Two-GPU call (nvidia-h200-x2). Issue 6, item 7 as one job: pixel vs sparse-grad vs dense vs gsplat
# distributed at growing Gaussian counts, 1M to the largest that fits, same settings for every count
# (1920x1080, 4 views per step, SH 3, 1 warm-up + 3 steps), one `bytesplat-bench distributed` run per
# count so an out-of-memory ends only that configuration (the benchmark records it and goes on).
# The counts do not fit one 600 s call: the same script in two calls,
#   TESTS=1 COUNTS="1000000 4000000 16000000 50000000" bash scripts/gpu_growing_counts_x2.sh
#   COUNTS="100000000 140000000 125000000" bash scripts/gpu_growing_counts_x2.sh
# The one-GPU rows run up to 62.5M (75M does not fit one H200: capacity_1gpu_75m_h200.json);
# gsplat up to 100M (it ran out of memory there on 2026-11-29). At 140M dense and sparse-grad are
# expected to run out of memory: pixel runs first.
# TESTS=1 first runs every GPU test (gpu_tests), and alongside on GPU 1 the README's quick start
# (`ns-train bytesplat --max-num-iterations 3000`, the built-in scene) and ns-eval of it.
# Then: bytesplat-bench plots --inputs <every counts_*.json> (the growing-counts figure).
# Writes to $OUT: log.txt, tests.log, eval_quickstart.json, counts.tgz (counts_N.json per count and
# their logs).
#   device tool: kind nvidia-h200-x2, carry [".whl", ".ext"], timeout_s 600
BUDGET=${BUDGET:-570}
COUNTS=${COUNTS:-1000000 4000000 16000000 50000000}
export BYTESPLAT_DIST_TIMEOUT=${BYTESPLAT_DIST_TIMEOUT:-300}
source scripts/gpu_begin.sh || exit 1
if [[ -n "$TESTS" ]]; then
  ( export CUDA_VISIBLE_DEVICES=1; sleep 2; quickstart ) &
  QS=$!
  gpu_tests
  wait $QS
fi
mkdir -p /tmp/counts
for n in $COUNTS; do
  (( $(left) < 60 )) && { stamp "stopping before N=$n: $(left)s left"; break; }
  opts=(--num-gaussians $n --views 4 --warmup 1 --repeats 3 --communicators pixel sparse-grad dense)
  (( n > 62500000 )) && opts+=(--skip-one-rank)
  (( n > 100000000 )) && opts+=(--skip-gsplat)
  OUT=/tmp/counts dist_bench counts_$n 2 $(( $(left) - 20 )) "${opts[@]}"
  cp /tmp/counts_$n.log /tmp/counts/ 2>/dev/null
done
tar czf "$OUT/counts.tgz" -C /tmp counts
stamp "done"
