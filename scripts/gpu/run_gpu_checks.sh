#!/usr/bin/env bash
# The GPU checks of libperseus's NCCL path (issue 6), in one call of the device tool.
# Build and pack here first (/work/shared/device/README.md):
#   cmake --build build -j2
#   ../shared/device/pack .device build/apps/perseusrun/perseusrun build/lib/comm/libperseus.so \
#       build/bench/nccl/nccl_raw_allreduce
#   run (carry [".device"]): bash scripts/gpu/run_gpu_checks.sh
# Runs tests/gpu/gpu_ops_test.py and tests/gpu/gpu_conformance_test.py (one rank under
# perseusrun) and bench/gpu_allreduce.py, and
# writes $OUT/gpu_ops_h200.txt, $OUT/gpu_conformance_h200.txt, $OUT/gpu_allreduce_h200.txt
# (+ .json) and $OUT/versions.txt.
# Exit: 0 when both passed, else 1.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-$PWD/gpu_out}
mkdir -p "$OUT"
export LD_LIBRARY_PATH=$PWD/.device/lib:${LD_LIBRARY_PATH:-}
export NCCL_NVLS_ENABLE=0  # NVLink multicast stays off on the lent machines
# The packed binaries stand where the scripts look for them (build/...).
if [ -d .device/bin ]; then
  mkdir -p build/apps/perseusrun build/lib/comm build/bench/nccl
  [ -x build/apps/perseusrun/perseusrun ] || cp .device/bin/perseusrun build/apps/perseusrun/
  [ -e build/lib/comm/libperseus.so ] || cp .device/lib/libperseus.so build/lib/comm/
  [ -x build/bench/nccl/nccl_raw_allreduce ] || cp .device/bin/nccl_raw_allreduce build/bench/nccl/
fi
{
  echo "# $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(hostname)"
  nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader
  nvidia-smi | grep -m1 'CUDA Version' | sed 's/^/# /'
  ldconfig -p | grep -E 'libcudart\.so\.|libnccl\.so\.' | sed 's/^/# /'
  python3 -c 'import torch; print("# torch", torch.__version__, "CUDA", torch.version.cuda, "NCCL", ".".join(map(str, torch.cuda.nccl.version())))'
} > "$OUT/versions.txt" 2>&1
cat "$OUT/versions.txt"
status=0
{
  cat "$OUT/versions.txt"
  echo "## perseusrun -np 1 -H localhost:1 python3 tests/gpu/gpu_ops_test.py"
  timeout 180 build/apps/perseusrun/perseusrun -np 1 -H localhost:1 -x NCCL_NVLS_ENABLE=0 \
    python3 tests/gpu/gpu_ops_test.py --json "$OUT/gpu_ops_h200.json" 2>&1
  echo "exit: $?"
} 2>&1 | tee "$OUT/gpu_ops_h200.txt"
grep -q '^exit: 0$' "$OUT/gpu_ops_h200.txt" || status=1
{
  echo "## the same with PERSEUS_ALLREDUCE_STREAMS=4 and 64 KB fusion buffers (fused all-reduces"
  echo "## spread over 4 streams and communicators)"
  timeout 180 build/apps/perseusrun/perseusrun -np 1 -H localhost:1 -x NCCL_NVLS_ENABLE=0 \
    -x PERSEUS_ALLREDUCE_STREAMS=4 -x PERSEUS_FUSION_THRESHOLD=65536 \
    python3 tests/gpu/gpu_ops_test.py 2>&1
  echo "exit: $?"
} 2>&1 | tee "$OUT/gpu_ops_streams4_h200.txt"
grep -q '^exit: 0$' "$OUT/gpu_ops_streams4_h200.txt" || status=1
{
  echo "## perseusrun -np 1 python3 tests/gpu/gpu_conformance_test.py (every op x dtype x size"
  echo "## 1 .. 2^20+3 x 1-3 dimensions against torch, through perseus.torch.horovod)"
  timeout 300 build/apps/perseusrun/perseusrun -np 1 -H localhost:1 -x NCCL_NVLS_ENABLE=0 \
    python3 tests/gpu/gpu_conformance_test.py 2>&1
  echo "exit: $?"
} 2>&1 | tee "$OUT/gpu_conformance_h200.txt"
grep -q '^exit: 0$' "$OUT/gpu_conformance_h200.txt" || status=1
{
  cat "$OUT/versions.txt"
  echo "## python3 bench/gpu_allreduce.py ${GPU_BENCH_ARGS:-}"
  timeout 330 python3 bench/gpu_allreduce.py --json "$OUT/gpu_allreduce_h200.json" ${GPU_BENCH_ARGS:-} 2>&1
  echo "exit: $?"
} 2>&1 | tee "$OUT/gpu_allreduce_h200.txt"
grep -q '^exit: 0$' "$OUT/gpu_allreduce_h200.txt" || status=1
exit $status
