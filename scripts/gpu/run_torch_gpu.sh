#!/usr/bin/env bash
# perseus.torch on the GPU machine (issue 7), in one call of the device tool.
# Build and pack here first (/work/shared/device/README.md):
#   cmake --build build -j2
#   ../shared/device/pack .device build/apps/perseusrun/perseusrun build/lib/comm/libperseus.so
#   run (carry [".device"]): bash scripts/gpu/run_torch_gpu.sh
# Runs tests/gpu/torch_gpu_test.py (the Horovod API, DistributedOptimizer, SyncBatchNorm,
# compression, NaN checks and `import perseus` DDP on CUDA, one rank under perseusrun) and
# examples/pytorch_mnist.py on the GPU, then bench/ddp_throughput.py (images/s of DDP with and
# without `import perseus`, and of the Horovod-style benchmark). Writes $OUT/torch_gpu_h200.txt,
# $OUT/ddp_throughput_h200.txt (+ .json) and $OUT/versions.txt. DDP_BENCH_ARGS adds arguments
# to the benchmark. Exit: 0 when all passed, else 1.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-$PWD/gpu_out}
mkdir -p "$OUT"
export LD_LIBRARY_PATH=$PWD/.device/lib:${LD_LIBRARY_PATH:-}
export NCCL_NVLS_ENABLE=0  # NVLink multicast stays off on the lent machines
if [ -d .device/bin ]; then
  mkdir -p build/apps/perseusrun build/lib/comm
  [ -x build/apps/perseusrun/perseusrun ] || cp .device/bin/perseusrun build/apps/perseusrun/
  [ -e build/lib/comm/libperseus.so ] || cp .device/lib/libperseus.so build/lib/comm/
fi
export PYTHONPATH=$PWD/lib/framework_shims${PYTHONPATH:+:$PYTHONPATH}
export PERSEUS_LIBRARY=$PWD/build/lib/comm/libperseus.so
RUN="build/apps/perseusrun/perseusrun -np 1 -H localhost:1 -x NCCL_NVLS_ENABLE=0"
{
  echo "# $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(hostname)"
  nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader
  nvidia-smi | grep -m1 'CUDA Version' | sed 's/^/# /'
  python3 -c 'import torch, sys; print("# python", sys.version.split()[0], "torch", torch.__version__, "CUDA", torch.version.cuda, "cuDNN", torch.backends.cudnn.version(), "NCCL", ".".join(map(str, torch.cuda.nccl.version())))'
  python3 -c 'import torchvision; print("# torchvision", torchvision.__version__)' 2>/dev/null || echo "# torchvision: none (resnet50 from examples/_models.py)"
  build/apps/perseusrun/perseusrun --version 2>&1 | head -1 | sed 's/^/# /'
  git log -1 --format='# commit %H %s' 2>/dev/null || true
} > "$OUT/versions.txt" 2>&1
cat "$OUT/versions.txt"
status=0
{
  cat "$OUT/versions.txt"
  echo "## $RUN python3 tests/gpu/torch_gpu_test.py"
  timeout 240 $RUN python3 tests/gpu/torch_gpu_test.py 2>&1
  echo "exit: $?"
  echo "## $RUN python3 examples/pytorch_mnist.py"
  timeout 120 $RUN python3 examples/pytorch_mnist.py 2>&1
  echo "exit: $?"
  echo "## $RUN python3 examples/pytorch_mnist.py --fp16-allreduce (+ PERSEUS_ALLREDUCE_NANCHECK=1)"
  timeout 120 $RUN -x PERSEUS_ALLREDUCE_NANCHECK=1 python3 examples/pytorch_mnist.py --fp16-allreduce --epochs 1 2>&1
  echo "exit: $?"
} 2>&1 | tee "$OUT/torch_gpu_h200.txt"
[ "$(grep -c '^exit: 0$' "$OUT/torch_gpu_h200.txt")" = 3 ] || status=1
{
  cat "$OUT/versions.txt"
  echo "## python3 bench/ddp_throughput.py ${DDP_BENCH_ARGS:-}"
  timeout 400 python3 bench/ddp_throughput.py --json "$OUT/ddp_throughput_h200.json" ${DDP_BENCH_ARGS:-} 2>&1
  echo "exit: $?"
} 2>&1 | tee "$OUT/ddp_throughput_h200.txt"
grep -q '^exit: 0$' "$OUT/ddp_throughput_h200.txt" || status=1
exit $status
