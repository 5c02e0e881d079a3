#!/usr/bin/env bash
# One-GPU call (nvidia-h200): is there a cost cliff at the fused kernel's per-tile capacity (1,728
# Gaussians at 2 blocks per SM) for the default split schedule, as there is for the schedules that
# keep a tile's list on chip? Issue 4's premise. Raster + loss at 1M, 2M, 4M and 8M random Gaussians,
# 1920x1080, gsplat skipped; every schedule the raster benchmark times (split, one launch, two
# launches, their blocks-per-SM variants) with the tile statistics (raster_cliff.json).
#   device tool: kind nvidia-h200, carry [".whl", ".ext"], timeout_s 300
BUDGET=${BUDGET:-290}
source scripts/gpu_begin.sh || exit 1
stamp "bytesplat-bench raster 1M 2M 4M 8M"
timeout $(( $(left) - 10 )) $PY -m bytesplat_ns.bench.cli raster --num-gaussians 1000000 2000000 4000000 8000000 \
  --width 1920 --height 1080 --warmup 2 --repeats 5 --skip-gsplat --out "$OUT/raster_cliff.json" > "$OUT/raster_cliff.log" 2>&1
stamp "raster rc=$?"; tail -n 40 "$OUT/raster_cliff.log" | cut -c1-220
stamp "done"
