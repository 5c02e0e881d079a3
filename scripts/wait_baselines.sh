#!/usr/bin/env bash
# Waits until the benchmark baselines' background builds started by scripts/gpu_setup.sh have ended
# (each holds a marker file in $BASELINE_BUILDS until then), for processes that did not source the
# setup themselves, e.g. a `bytesplat-bench queue` job:
#
#   scripts/wait_baselines.sh && bytesplat-bench suite raster-baselines --data /tmp/gsplat-1.5.3 ...
#
# Wall-clock jobs wait too: the builds keep the host's CPUs busy, and a training step bound by its
# host side slows down beside them (`wallclock` records host_load_max; docs/wallclock.md).
#
# Gives up after WAIT_S seconds (default 900, past the builds' own 600 s timeout) with status 1.
dir=${BASELINE_BUILDS:-/tmp/baseline-builds}
deadline=$(( $(date +%s) + ${WAIT_S:-900} ))
while compgen -G "$dir/*" > /dev/null; do
  if (( $(date +%s) >= deadline )); then
    echo "wait_baselines: still building after ${WAIT_S:-900} s: $(ls "$dir")" >&2
    exit 1
  fi
  sleep 5
done
