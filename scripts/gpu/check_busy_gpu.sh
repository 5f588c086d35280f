#!/usr/bin/env bash
# On a machine with an NVIDIA GPU: shows that `perseusrun --check` names a process that holds
# GPU memory (pid, user, command, MiB) and that a launch avoids or refuses that GPU.
#   scripts/gpu/check_busy_gpu.sh [OUTPUT_FILE]
# Needs python3 with torch (CUDA) to hold the memory. PERSEUSRUN overrides the binary.
set -u
perseusrun=${PERSEUSRUN:-build/apps/perseusrun/perseusrun}
out=${1:-/dev/stdout}
exec >"$out" 2>&1
step() { printf '\n== %s\n$ %s\n' "$1" "${*:2}"; "${@:2}"; echo "exit code: $?"; }

echo "date: $(date -u +%FT%TZ)"
nvidia-smi --query-gpu=index,uuid,name,driver_version,memory.used,memory.total --format=csv
step "version" "$perseusrun" --version
step "check with every GPU idle" "$perseusrun" --check

# A process of another "job" that holds 8 GiB on GPU 0 until we end it.
python3 -c '
import sys, time, torch
block = torch.empty(8 << 30, dtype=torch.uint8, device="cuda:0")
print("holder ready", flush=True)
time.sleep(600)
' >/tmp/holder.log 2>&1 &
holder=$!
for _ in $(seq 1 120); do grep -q "holder ready" /tmp/holder.log && break; sleep 0.5; done
echo "holder pid: $holder"
nvidia-smi --query-compute-apps=pid,used_memory,name --format=csv

step "check names the holder (pid, memory) and blocks a 1-rank job" "$perseusrun" --check
step "the same as JSON" "$perseusrun" --check --json
step "a launch refuses the busy GPU and starts nothing" \
  "$perseusrun" -np 1 sh -c 'echo rank $RANK started on CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES'
step "with a higher --gpu-busy-threshold the GPU counts as free" \
  "$perseusrun" --gpu-busy-threshold 16384 -np 1 sh -c 'echo rank $RANK on CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES'
step "CPU ranks that need no GPU of their own run beside it (--gpu-bind none)" \
  "$perseusrun" --gpu-bind none -np 2 -H localhost:2 sh -c 'echo rank $RANK, CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES-unset}'
step "two ranks on the one GPU are refused" "$perseusrun" -np 2 -H localhost:2 true

kill "$holder"; wait "$holder" 2>/dev/null
sleep 2
step "after the holder ended the job can start" "$perseusrun" --check
step "and runs" "$perseusrun" -np 1 sh -c 'echo rank $RANK on CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES; nvidia-smi -L'
