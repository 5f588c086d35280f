#!/usr/bin/env bash
# Issue 17, eleventh pass, on the GPU machine's host after the change: the shims' torch tests
# under the host's torch (2.11), then where a 4-rank step's time goes (thread_cpu.py, the
# plain optimizer and DistributedOptimizer alternating, 3 rounds).
source scripts/gpu/device_env.sh
export PYTHONPATH=$PWD/lib/framework_shims PERSEUS_LIBRARY=$PWD/build/lib/comm/libperseus.so
SHIMS_PYTHON=$(command -v python3) timeout 200 python3 -m pytest -q -p no:cacheprovider \
  tests/shims/test_torch.py > $OUT/shims_torch_h100.txt 2>&1
echo "exit: $?" >> $OUT/shims_torch_h100.txt
export OMP_NUM_THREADS=1 CUDA_VISIBLE_DEVICES=
for round in 1 2 3; do
  for v in none hvd; do
    echo "== round $round $v" >> $OUT/thread_cpu_after.txt
    timeout 60 $run -np 4 -H localhost:4 python3 bench/results/issue17_eleventh/thread_cpu.py $v 300 >> $OUT/thread_cpu_after.txt 2>&1
  done
done
tail -3 $OUT/shims_torch_h100.txt
