#!/usr/bin/env bash
# Issue 7, item 3: the matrix's train part on a GPU, as a matrix run (its pieces had run on GPUs only
# through `bench train` directly): the built-in small scene, splatfacto / bytesplat:gsplat /
# bytesplat:fused, 1000 iterations at full resolution, then its PSNR and ms/iteration plot.
# Short on purpose: the session's last 260 s of device time.
# Writes to $OUT: log.txt, matrix_train.tgz.
#   device tool: kind nvidia-h200-x2, carry [".whl", ".ext"], timeout_s 230
BUDGET=${BUDGET:-215}
SCENES=small
source scripts/gpu_begin.sh || exit 1
stamp "bytesplat-bench matrix: train (timeout $(( $(left) - 8 ))s)"
CUDA_VISIBLE_DEVICES=0 timeout $(( $(left) - 8 )) $PY -m bytesplat_ns.bench.cli matrix --benchmarks train \
  --scene-sizes small --iterations 1000 --num-downscales 0 --piece-timeout 70 --out-dir /tmp/matrix_train \
  > /tmp/matrix_train.log 2>&1
stamp "matrix rc=$?"; tail -n 20 /tmp/matrix_train.log | cut -c1-250
tar czf "$OUT/matrix_train.tgz" -C /tmp matrix_train
stamp "done"
