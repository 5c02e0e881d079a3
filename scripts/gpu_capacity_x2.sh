#!/usr/bin/env bash
# Issue 7, item 2 on two H200s (nvidia-h200-x2): how many Gaussians train on 1 and on 2 GPUs, per
# strategy, next to gsplat 1.4.0 distributed. For each N in NS (ascending), `bytesplat-bench
# distributed` on 2 ranks (a few timed steps: forward, loss, backward, Adam; its 1-rank rows on rank 0
# alone) records peak memory per rank and status per row (an out-of-memory is a row's "error"). The per-N JSON files are merged into $OUT/capacity.json (the device tool
# returns at most 8 files), with the planner's prediction (`python -m bytesplat_ns.memory`) beside.
#   device tool: kind nvidia-h200-x2, carry [".whl", ".ext"], timeout_s 600
#   NS="25000000 50000000 100000000 150000000" BUDGET=540 bash scripts/gpu_capacity_x2.sh
#   NS="125000000 150000000" BENCH_ARGS="--skip-one-rank --skip-gsplat" bash scripts/gpu_capacity_x2.sh
set -o pipefail
OUT=${OUT:-$PWD/gpu_out}; mkdir -p "$OUT/runs"
export BYTESPLAT_DIST_TIMEOUT=${BYTESPLAT_DIST_TIMEOUT:-300}
NS=${NS:-25000000 50000000 100000000 150000000}
BUDGET=${BUDGET:-540}
VIEWS=${VIEWS:-4}
BENCH_ARGS=${BENCH_ARGS:-}  # e.g. "--skip-one-rank --skip-gsplat" past what one GPU / gsplat can hold
exec > >(tee -a "$OUT/log.txt") 2>&1
source scripts/gpu_setup.sh || exit 1
timeout 200 $PY -c "from bytesplat_ns.distributed.sparse_kernels import load_extension; load_extension(); print('sparse-grad ext ok')" 2>&1 | tail -n 1

# One 2-rank run per N measures both GPU counts: its 1-rank rows run on rank 0 alone; an
# out-of-memory inside a row becomes that row's "error" record and the run goes on.
for N in $NS; do
  t=$(( $(left) - 20 )); (( t < 60 )) && { stamp "no time left for N=$N"; break; }
  stamp "N=$N (timeout ${t}s)"
  timeout $t $PY -m torch.distributed.run --standalone --nproc-per-node 2 -m bytesplat_ns.bench.cli distributed \
    --num-gaussians $N --views $VIEWS --width 1920 --height 1080 --communicators dense sparse-grad \
    --warmup 1 --repeats 3 $BENCH_ARGS --out "$OUT/runs/n$N.json" > /tmp/cap_n$N.log 2>&1
  rc=$?
  stamp "N=$N rc=$rc"; grep -iE "out of memory|error" /tmp/cap_n$N.log | head -3
  (( rc != 0 )) && break  # a crash or the timeout: larger N will not do better
done

$PY -m bytesplat_ns.memory --memory-gib 139 --gpus 1 2 --batch $VIEWS --visible-fraction 1.0 > /tmp/plan.txt 2>&1
$PY - "$OUT" /tmp/plan.txt <<'EOF'
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
merged = {"plan": Path(sys.argv[2]).read_text(), "runs": {}}
for f in sorted((out / "runs").glob("*.json")):
    merged["runs"][f.stem] = json.loads(f.read_text())
    for x in merged["runs"][f.stem].get("results", []):
        peak = max(m or 0 for m in x.get("peak_memory_mb", [0])) / 1024
        print(f"{f.stem:>16} {x['impl']:<9} {x['communicator']:<34} R={x.get('ranks')} {x['status']:<8} "
              f"peak {peak:7.1f} GiB  {x.get('views_per_second') or 0:8.2f} views/s")
(out / "capacity.json").write_text(json.dumps(merged, indent=1))
EOF
rm -rf "$OUT/runs"
stamp "done"
