#!/usr/bin/env bash
# Issue 17, eleventh pass: where a 4-rank CPU step's time goes on the GPU machine's host. Run
# there from the repository root (after ../shared/device/pack): writes $OUT/diag.txt.
source scripts/gpu/device_env.sh
export PYTHONPATH=$PWD/lib/framework_shims PERSEUS_LIBRARY=$PWD/build/lib/comm/libperseus.so
export OMP_NUM_THREADS=1 CUDA_VISIBLE_DEVICES=
d=bench/results/issue17_eleventh
{
  date; uptime; nproc; lscpu | grep -E 'Model name|Thread|Core|Socket|NUMA node|MHz'
  lscpu -e | head -20
  cat /sys/devices/system/cpu/cpu0/cpufreq/scaling_governor 2>/dev/null
  python3 -c 'import torch; print(torch.__version__)'
  git rev-parse HEAD 2>/dev/null
  python3 $d/hook_cost.py 20
} > $OUT/diag.txt 2>&1
pin='exec taskset -c $((2*PERSEUS_LOCAL_RANK)),$((2*PERSEUS_LOCAL_RANK+1)) "$@"'
for round in 1 2 3 4 5; do
  for v in none hvd hvd10; do
    mode=${v%10}; ct=1; [ $v = hvd10 ] && ct=10
    echo "== round $round $v" >> $OUT/diag.txt
    PERSEUS_CYCLE_TIME=$ct timeout 120 $run -np 4 -H localhost:4 python3 $d/thread_cpu.py $mode 300 >> $OUT/diag.txt 2>&1
  done
done
for round in 1 2 3 4; do
  for v in none hvd; do
    echo "== pinned round $round $v" >> $OUT/diag.txt
    timeout 120 $run -np 4 -H localhost:4 sh -c "$pin" sh python3 $d/thread_cpu.py $v 300 >> $OUT/diag.txt 2>&1
  done
done
uptime >> $OUT/diag.txt
