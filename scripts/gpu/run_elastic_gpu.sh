#!/usr/bin/env bash
# Issue 20 on the GPU machine, in one call of the device tool: Horovod's elastic API in place on
# CUDA tensors (NCCL). Three ranks share the one GPU as simulated hosts
# (scripts/gpu/as_simulated_host.sh; its NCCL_HOSTID follows the process's elastic id), under
# perseusrun's elastic mode; rank 1 of tests/blackbox/elastic_train.py --cuda exits at step 8,
# and the two others must go on in world 1 with a new process, in their own processes, their
# NCCL communicators made again, and finish every step with equal parameters.
# Build and pack as for run_gpu_checks.sh, then
#   run (carry [".device"]): bash scripts/gpu/run_elastic_gpu.sh
# Writes $OUT/elastic_gpu.txt (perseusrun's output and every process's events). Exit: 0 when the
# job ended well and its three final processes agree.
set -uo pipefail
source "$(dirname "$0")/device_env.sh"
export PYTHONPATH=$PWD/lib/framework_shims${PYTHONPATH:+:$PYTHONPATH}
export PERSEUS_LIBRARY=$PWD/build/lib/comm/libperseus.so
work=$(mktemp -d)
report=$work/report
mkdir -p "$report"
printf '#!/bin/sh\necho localhost:3\n' > "$work/discover.sh"
chmod +x "$work/discover.sh"
{
  echo "# $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(hostname)"
  nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader
  python3 -c 'import torch; print("# torch", torch.__version__, "CUDA", torch.version.cuda)'
  timeout 300 "$run" -np 3 --host-discovery-script "$work/discover.sh" --gpu-bind none \
    --no-preflight -x NCCL_NVLS_ENABLE=0 scripts/gpu/as_simulated_host.sh 1,1,1 \
    python3 tests/blackbox/elastic_train.py --cuda --steps 30 --step-seconds 0.1 \
    --commit-every 2 --die-at 8 --die-rank 1 --report "$report" 2>&1 | grep -v 'NCCL INFO' | tail -40
  echo "exit: ${PIPESTATUS[0]}"
  for f in "$report"/events.*; do echo "== $f"; cat "$f"; done
} 2>&1 | tee "$OUT/elastic_gpu.txt"
finals=$(cat "$report"/events.* | grep -c '"what": "final"')
sums=$(cat "$report"/events.* | grep '"what": "final"' | grep -o '"checksum": "[0-9a-f]*"' | sort -u | wc -l)
grep -q '^exit: 0$' "$OUT/elastic_gpu.txt" && [ "$finals" = 3 ] && [ "$sums" = 1 ]
