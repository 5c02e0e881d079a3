#!/usr/bin/env bash
# Two-GPU call (nvidia-h200-x2): the README quick start scored 22.77 dB / SSIM 0.816 (psnr_std 9.2)
# in gpu_kernels_train_x2.sh, against 27.69-27.96 dB (std 2.2-2.5) before this session's kernels.
# Which change, or a rare failure of the small scene? Five quick starts (ns-train bytesplat, 3000
# iterations, built-in scene, then ns-eval), at the same time, three on GPU 0 and two on GPU 1:
#   A1, A2: the kernels of ae87607 (cuda/common.cuh, ssim_tile.cuh, loss_grad.cu from that commit);
#   B1:     rcp_unit only (this session's common.cuh, ae87607's ssim_tile.cuh and loss_grad.cu);
#   C1, C2: the installed package (rcp_unit + the 32x32 loss regions).
# A and B are copies of the installed package with those files from gpu_variants/{A,B}/ (made from
# git for the call, not committed), each JIT-built under its own name and run from its own directory.
# Writes to $OUT: log.txt, quickstart.tgz (eval_*.json, the eval views' renders, the training logs).
#   device tool: kind nvidia-h200-x2, carry [".whl", ".ext"], timeout_s 600
BUDGET=${BUDGET:-330}
source scripts/gpu_begin.sh || exit 1
MAX_JOBS=8 variant A "cp gpu_variants/A/* \$CUDA/" > /tmp/var_A.log 2>&1 & PA=$!
MAX_JOBS=8 variant B "cp gpu_variants/B/* \$CUDA/" > /tmp/var_B.log 2>&1 & PB=$!
wait $PA $PB; cat /tmp/var_A.log /tmp/var_B.log
mkdir -p /tmp/qs
qs() {  # qs NAME GPU PORT [VARIANT]: the quick start + ns-eval -> /tmp/qs/eval_NAME.json
  local name=$1 gpu=$2 port=$3 var=${4:-} t=$(date +%s) pp=$PYTHONPATH dir=$PWD
  [[ -n $var ]] && pp=/tmp/var_$var:$PYTHONPATH && dir=/tmp/var_$var
  (cd $dir && CUDA_VISIBLE_DEVICES=$gpu PYTHONPATH=$pp timeout 200 $PY -m nerfstudio.scripts.train bytesplat \
    --max-num-iterations 3000 --viewer.quit-on-train-completion True --viewer.websocket-port $port \
    --output-dir /tmp/qs_$name --timestamp run > /tmp/qs/train_$name.log 2>&1
   cfg=$(find /tmp/qs_$name -name config.yml | head -1)
   CUDA_VISIBLE_DEVICES=$gpu PYTHONPATH=$pp timeout 90 $PY -m nerfstudio.scripts.eval --load-config "$cfg" \
     --output-path /tmp/qs/eval_$name.json --render-output-path /tmp/qs/render_$name > /tmp/qs/eval_$name.log 2>&1)
  stamp "$name (GPU $gpu${var:+, variant $var}) in $(( $(date +%s) - t ))s: $(grep -o '"psnr": [0-9.]*\|"psnr_std": [0-9.]*\|"ssim": [0-9.]*' /tmp/qs/eval_$name.json 2>/dev/null | tr '\n' ' ')"
}
qs A1 0 7101 A & qs C1 0 7102 & qs B1 0 7103 B & qs A2 1 7104 A & qs C2 1 7105 &
wait $(jobs -p)
tar czf "$OUT/quickstart.tgz" -C /tmp qs
stamp "done"
