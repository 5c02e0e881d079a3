#!/usr/bin/env bash
# Two-GPU call (nvidia-h200-x2): does the host-bound two-rank step at 1M gain when each rank is
# pinned to its own physical cores (scripts/pin_rank.py)? The host's topology, then issue 5's 1M,
# 8-view dense figure (1 rank and 2 ranks, gsplat skipped) alternately plain and pinned, twice each:
# plain_{1,2}.json, pinned_{1,2}.json.
#   device tool: kind nvidia-h200-x2, carry [".whl", ".ext"], timeout_s 330
BUDGET=${BUDGET:-320}
source scripts/gpu_begin.sh || exit 1
nvidia-smi topo -m; lscpu | grep -E "^CPU\(s\)|Thread|Core|Socket|NUMA"
B="distributed --width 1920 --height 1080 --num-gaussians 1000000 --views 8 --warmup 3 --repeats 10 --communicators dense --skip-gsplat"
run() {  # run NAME LAUNCH...
  local name=$1; shift
  stamp "$name"
  timeout 100 "$@" $B --out "$OUT/$name.json" > /tmp/$name.log 2>&1
  stamp "$name rc=$?"; grep -E "^ +N=|pin_rank" /tmp/$name.log | cut -c1-200
}
for i in 1 2; do
  (( $(left) < 70 )) && break
  run plain_$i $PY -m torch.distributed.run --standalone --nproc-per-node 2 -m bytesplat_ns.bench.cli
  (( $(left) < 70 )) && break
  run pinned_$i $PY -m torch.distributed.run --standalone --nproc-per-node 2 scripts/pin_rank.py bytesplat_ns.bench.cli
done
stamp "done"
