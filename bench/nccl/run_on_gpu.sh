#!/usr/bin/env bash
# Runs lib/comm/nccl's checks and the raw NCCL all-reduce benchmark on the GPU machine (the
# device tool), from binaries built here and packed into .device (../shared/device/pack):
#   ../shared/device/pack .device <build>/nccl_unit_tests <build>/bench/nccl/nccl_raw_allreduce
#   run (carry .device): bash bench/nccl/run_on_gpu.sh
# Writes everything to $OUT/nccl_raw_h200.txt (and prints it).
set -uo pipefail
out=${OUT:-.}/nccl_raw_h200.txt
export LD_LIBRARY_PATH=$PWD/.device/lib:${LD_LIBRARY_PATH:-}
export NCCL_NVLS_ENABLE=0  # NVLink multicast stays off on the lent machines
{
  echo "# $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(hostname)"
  nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader
  ldconfig -p | grep -E 'libcudart\.so|libnccl\.so' | sed 's/^/# /'
  echo "## unit tests (tests/unit/test_comm_nccl_{api,communicator}.cc)"
  timeout 120 .device/bin/nccl_unit_tests --success=false 2>&1
  echo "unit tests exit: $?"
  echo "## raw NCCL all-reduce, out of place"
  timeout 240 .device/bin/nccl_raw_allreduce 2>&1
  echo "benchmark exit: $?"
  echo "## raw NCCL all-reduce, in place"
  echo "# (with one GPU, NCCL's in-place all-reduce moves no data: these times are the launch only)"
  timeout 120 .device/bin/nccl_raw_allreduce --in-place 2>&1
  echo "benchmark exit: $?"
} 2>&1 | tee "$out"
