#!/usr/bin/env bash
# Issue 22 on the GPU machine, in one call of the device tool: Horovod's own test_torch.py
# (scripts/horovod_suite.py) and tests/gpu/gpu_conformance_test.py with 1, 2 and 3 ranks on
# CUDA tensors. With one GPU lent, several ranks share it as simulated hosts
# (scripts/gpu/as_simulated_host.sh: a host each, NCCL between them over its socket transport).
# Build and pack as for run_gpu_checks.sh; put a checkout of horovod/horovod's test/ folder
# (test/parallel/test_torch.py, test/utils/common.py) at .horovod/ (git-ignored), then
#   run (carry [".device", ".horovod"]): bash scripts/gpu/run_horovod_suite.sh
# Variables: PARTS (default "syncbn conformance suite"; syncbn is
# tests/gpu/sync_batch_norm_test.py on 1-3 ranks, and on 3 with the last rank's batch empty), SUITE_NP (default "1 2 3"), CONFORMANCE_NP
# (default "2 3"), SUITE_JOBS (jobs at once, default 6), SUITE_K (a -k pattern), SUITE_TIMEOUT
# (seconds a test, default 150).
# Writes $OUT/conformance_npN.txt, $OUT/horovod_torch_gpu.{txt,json} and the logs of the tests
# that did not pass under $OUT/suite_logs/. Exit: 0 when every part passed.
set -uo pipefail
source "$(dirname "$0")/device_env.sh"
status=0
parts=${PARTS:-syncbn conformance suite}
{
  echo "# $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(hostname)"
  nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader
  python3 -c 'import torch; print("# torch", torch.__version__, "CUDA", torch.version.cuda)'
  ldconfig -p | grep -E 'libnccl\.so\.' | sed 's/^/# /'
} > "$OUT/versions.txt" 2>&1
cat "$OUT/versions.txt"
if [[ " $parts " == *" syncbn "* ]]; then
  export PYTHONPATH=$PWD/lib/framework_shims${PYTHONPATH:+:$PYTHONPATH}
  export PERSEUS_LIBRARY=$PWD/build/lib/comm/libperseus.so
  for case in 1 2 3 3-empty; do
    n=${case%-empty}
    extra=()
    [ "$case" != "$n" ] && extra=(--empty-rank)
    sizes=$(printf '1,%.0s' $(seq "$n")); sizes=${sizes%,}
    {
      echo "## perseusrun -np $n (simulated hosts $sizes) tests/gpu/sync_batch_norm_test.py ${extra[*]}"
      timeout 200 "$run" -np "$n" -H "localhost:$n" --gpu-bind none --timeout 180 \
        -x NCCL_NVLS_ENABLE=0 scripts/gpu/as_simulated_host.sh "$sizes" \
        python3 tests/gpu/sync_batch_norm_test.py "${extra[@]}" 2>&1 | grep -v 'NCCL INFO' | tail -30
      echo "exit: ${PIPESTATUS[0]}"
    } 2>&1 | tee -a "$OUT/sync_batch_norm.txt"
  done
  [ "$(grep -c '^exit: 0$' "$OUT/sync_batch_norm.txt")" = 4 ] || status=1
fi
if [[ " $parts " == *" conformance "* ]]; then
  for n in ${CONFORMANCE_NP:-2 3}; do
    sizes=$(printf '1,%.0s' $(seq "$n")); sizes=${sizes%,}
    {
      echo "## perseusrun -np $n (simulated hosts $sizes) tests/gpu/gpu_conformance_test.py"
      timeout 400 "$run" -np "$n" -H "localhost:$n" --gpu-bind none --timeout 380 \
        -x NCCL_NVLS_ENABLE=0 scripts/gpu/as_simulated_host.sh "$sizes" \
        python3 tests/gpu/gpu_conformance_test.py 2>&1 | grep -v 'NCCL INFO' | tail -40
      echo "exit: ${PIPESTATUS[0]}"
    } 2>&1 | tee "$OUT/conformance_np$n.txt"
    grep -q '^exit: 0$' "$OUT/conformance_np$n.txt" || status=1
  done
fi
if [[ " $parts " == *" suite "* ]]; then
  k=()
  [ -n "${SUITE_K:-}" ] && k=(-k "$SUITE_K")
  for n in ${SUITE_NP:-1 2 3}; do
    # Jobs share the one GPU: no preflight (it would see the other jobs' ranks as a busy GPU).
    sim=(--perseusrun-arg=--no-preflight)
    [ "$n" -gt 1 ] && sim+=(--simulate-hosts)
    python3 scripts/horovod_suite.py --horovod .horovod --suite torch --np "$n" "${sim[@]}" \
      --jobs "${SUITE_JOBS:-6}" --timeout "${SUITE_TIMEOUT:-150}" "${k[@]}" \
      --logs "$OUT/suite_logs" --json "$OUT/horovod_torch_gpu_np$n.json" 2>&1 |
      tee -a "$OUT/horovod_torch_gpu.txt"
    [ "${PIPESTATUS[0]}" = 0 ] || status=1
  done
fi
# The device tool brings back a limited number of files: the logs travel as one archive.
if [ -d "$OUT/suite_logs" ]; then
  tar -C "$OUT" -czf "$OUT/suite_logs.tgz" suite_logs && rm -rf "$OUT/suite_logs"
fi
exit $status
