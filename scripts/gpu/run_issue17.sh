#!/usr/bin/env bash
# Issue 17's rows on the GPU machine, in one call of the device tool per part (each part fits
# the tool's 600 s limit). Build and pack here first (/work/shared/device/README.md):
#   cmake --build build -j2
#   ../shared/device/pack .device build/apps/perseusrun/perseusrun build/lib/comm/libperseus.so \
#       build/bench/cpu_allreduce_perseus
#   run (carry [".device"]): bash scripts/gpu/run_issue17.sh ddp|optimizer|cpu
# ddp:       bench/ddp_throughput.py, DDP with and without `import perseus` (fp32 and
#            PERSEUS_ALLREDUCE_DTYPE=fp16), ResNet-50 batch 64, DDP_REPEATS repeats (default 8).
# optimizer: bench/ddp_throughput.py's DistributedOptimizer runs against no communication
#            (ResNet-50, Compression none and fp16, OPT_REPEATS repeats, default 6); the
#            200-tensor step on the GPU (bench/submission_path.py --device cuda, one rank,
#            with and without Compression.fp16) and on CPU tensors at 4 ranks (the machine's
#            16 cores); tests/gpu/torch_gpu_test.py.
# cpu:       tests/gpu/torch_gpu_test.py, then bench/submission_path.py on CPU tensors at 4 and
#            2 ranks with the small case (1000 x 4 KB, one blocking call).
# Writes $OUT/issue17_<part>.txt (+ .json) and $OUT/versions.txt. Exit: 0 when all passed.
set -uo pipefail
part=${1:?"usage: run_issue17.sh ddp|optimizer|cpu"}
source "$(dirname "$0")/device_env.sh"
if [ -x .device/bin/cpu_allreduce_perseus ]; then
  mkdir -p build/bench
  cp .device/bin/cpu_allreduce_perseus build/bench/
fi
export PYTHONPATH=$PWD/lib/framework_shims${PYTHONPATH:+:$PYTHONPATH}
export PERSEUS_LIBRARY=$PWD/build/lib/comm/libperseus.so
{
  echo "# $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(hostname), $(nproc) cores"
  nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader
  python3 -c 'import torch, sys; print("# python", sys.version.split()[0], "torch", torch.__version__, "NCCL", ".".join(map(str, torch.cuda.nccl.version())))'
  git log -1 --format='# commit %H %s' 2>/dev/null || true
} > "$OUT/versions.txt" 2>&1
status=0
log=$OUT/issue17_$part.txt
# bench/ddp_throughput.py on ResNet-50, batch 64, 15 warm-up batches, Compression none and fp16:
# resnet50 SECONDS JSON-NAME [its other arguments]
resnet50() {
  local limit=$1 json=$2
  shift 2
  echo "## bench/ddp_throughput.py --fp16 $*"
  timeout "$limit" python3 bench/ddp_throughput.py --fp16 --batch-size 64 \
    --num-warmup-batches 15 --json "$OUT/$json" "$@"
  echo "exit: $?"
}
case $part in
  ddp)
    {
      cat "$OUT/versions.txt"
      resnet50 420 issue17_ddp.json --no-synthetic --repeats "${DDP_REPEATS:-8}"
    } 2>&1 | tee "$log"
    ;;
  optimizer)
    {
      cat "$OUT/versions.txt"
      resnet50 320 issue17_opt.json --no-ddp --repeats "${OPT_REPEATS:-6}"
      echo "## bench/submission_path.py --device cuda --ranks 1 --fp16 --no-small --repeats 5"
      timeout 100 python3 bench/submission_path.py --device cuda --ranks 1 --fp16 --no-small \
        --repeats 5 --steps 200
      echo "exit: $?"
      echo "## bench/submission_path.py --ranks 4 --no-small --repeats 5 (CPU tensors)"
      timeout 80 python3 bench/submission_path.py --ranks 4 --no-small --repeats 5
      echo "exit: $?"
      echo "## tests/gpu/torch_gpu_test.py"
      timeout 60 "$run" -np 1 -H localhost:1 -x NCCL_NVLS_ENABLE=0 python3 \
        tests/gpu/torch_gpu_test.py
      echo "exit: $?"
    } 2>&1 | tee "$log"
    ;;
  cpu)
    {
      cat "$OUT/versions.txt"
      echo "## tests/gpu/torch_gpu_test.py"
      timeout 60 "$run" -np 1 -H localhost:1 -x NCCL_NVLS_ENABLE=0 python3 \
        tests/gpu/torch_gpu_test.py
      echo "exit: $?"
      for ranks in 4 2; do
        echo "## bench/submission_path.py --ranks $ranks --repeats 5 (CPU tensors)"
        timeout 100 python3 bench/submission_path.py --ranks $ranks --repeats 5
        echo "exit: $?"
      done
    } 2>&1 | tee "$log"
    ;;
  *)
    echo "run_issue17.sh: unknown part '$part' (ddp, optimizer or cpu)" >&2
    exit 2
    ;;
esac
grep -q '^exit: [1-9]' "$log" && status=1
exit $status
