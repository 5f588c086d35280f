#!/usr/bin/env bash
# libperseus on GPUs with several ranks (issue 6), in one call of the device tool, with the
# hosts simulated on one GPU (scripts/gpu/as_simulated_host.sh: every rank on GPU 0, NCCL's
# socket transport between them). Build and pack as for run_gpu_checks.sh, then
#   run (carry [".device"]): bash scripts/gpu/run_multirank_checks.sh
# Runs tests/gpu/gpu_multirank_test.py (every operation on CUDA tensors with several ranks) on
# 2 hosts x 2 ranks with hierarchical all-reduce (scatter-gather; also with
# PERSEUS_ALLREDUCE_STREAMS=2), on hosts of 3 and 1 ranks (reduce-broadcast) and, as a control,
# 2 x 2 without it (flat); then, unless SKIP_BENCH=1, bench/gpu_allreduce.py on 2 simulated
# hosts x 1 rank against torch.distributed.
# Writes $OUT/multirank_h200.txt and $OUT/sim_allreduce_2x1.txt (+ .json). Exit: 0 when every
# check passed.
set -uo pipefail
source "$(dirname "$0")/device_env.sh"
status=0
check() {  # check SIZES EXPECT ANNOUNCEMENT [VAR=value...]
  local sizes=$1 expect=$2 announcement=$3
  shift 3
  local n=$(( ${sizes//,/+} ))
  local flags=(-np "$n" -H "localhost:$n" --gpu-bind none --timeout 300 -x NCCL_NVLS_ENABLE=0)
  for v in "$@"; do flags+=(-x "$v"); done
  echo "## $sizes ($expect): perseusrun ${flags[*]} scripts/gpu/as_simulated_host.sh $sizes python3 tests/gpu/gpu_multirank_test.py --expect $expect"
  local log
  log=$(timeout 400 "$run" "${flags[@]}" scripts/gpu/as_simulated_host.sh "$sizes" \
    python3 tests/gpu/gpu_multirank_test.py --expect "$expect" 2>&1)
  local rc=$?
  echo "$log" | grep -v '^\[.*NCCL INFO' | tail -60
  if [ -n "$announcement" ] && ! echo "$log" | grep -qF "hierarchical all-reduce on GPUs: $announcement"; then
    echo "MISSING announcement: hierarchical all-reduce on GPUs: $announcement"
    rc=1
  fi
  if [ -z "$announcement" ] && echo "$log" | grep -qF "hierarchical all-reduce on GPUs"; then
    echo "UNEXPECTED announcement of a hierarchical all-reduce"
    rc=1
  fi
  echo "exit: $rc"
  [ $rc = 0 ] || status=1
}
{
  echo "# $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(hostname)"
  nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader
  ldconfig -p | grep -E 'libnccl\.so\.' | sed 's/^/# /'
  check 2,2 scatter-gather "2 hosts x 2 ranks" PERSEUS_HIERARCHICAL_ALLREDUCE=1
  check 2,2 scatter-gather "2 hosts x 2 ranks" PERSEUS_HIERARCHICAL_ALLREDUCE=1 PERSEUS_ALLREDUCE_STREAMS=2
  check 3,1 reduce-broadcast "2 hosts with unequal numbers of ranks" HOROVOD_HIERARCHICAL_ALLREDUCE=1
  check 2,2 flat "" PERSEUS_HIERARCHICAL_ALLREDUCE=0
} 2>&1 | tee "$OUT/multirank_h200.txt"
grep -q '^exit: [^0]' "$OUT/multirank_h200.txt" && status=1
bench() {  # bench NAME SIZES HIERARCHICAL
  echo "## PERSEUS_HIERARCHICAL_ALLREDUCE=$3 python3 bench/gpu_allreduce.py --simulate-hosts $2 --max-bytes ${SIM_MAX_BYTES:-67108864}"
  PERSEUS_HIERARCHICAL_ALLREDUCE=$3 timeout 300 python3 bench/gpu_allreduce.py --simulate-hosts "$2" \
    --max-bytes "${SIM_MAX_BYTES:-67108864}" --json "$OUT/sim_allreduce_$1.json" 2>&1
  echo "exit: $?"
}
if [ "${SKIP_BENCH:-0}" != 1 ]; then
  bench 2x1 1,1 0 2>&1 | tee "$OUT/sim_allreduce_2x1.txt"
fi
exit $status
