#!/usr/bin/env bash
# Issue 17, eleventh pass, on the GPU machine's host: the 4-rank CPU step before and after the
# last bucket lost its hooks, each job interleaving the step with and without communication
# (bench/submission_path.py --interleave), the two trees alternating. The "before" tree's shims
# are in ab_before/ (git archive c10a7bf lib/framework_shims, with today's submission_path.py),
# made here and carried over uncommitted. Then the shims' torch tests under the host's torch.
source scripts/gpu/device_env.sh
export PERSEUS_LIBRARY=$PWD/build/lib/comm/libperseus.so
{ date; python3 -c 'import torch, sys; print(sys.version.split()[0], torch.__version__)'; } > $OUT/versions.txt 2>&1
for i in 1 2 3 4 5; do
  for tree in ab_before .; do
    echo -n "$tree " >> $OUT/ab_np4.txt
    timeout 60 python3 $tree/bench/submission_path.py --perseusrun $PWD/$run --ranks 4 \
      --repeats 1 --steps 20 --interleave 30 2>&1 | grep -E 'job 0|failed' >> $OUT/ab_np4.txt
  done
done
timeout 240 python3 -m pytest -q -p no:cacheprovider tests/shims/test_torch.py > $OUT/shims_torch.txt 2>&1
echo "exit: $?" >> $OUT/shims_torch.txt
cat $OUT/ab_np4.txt; tail -3 $OUT/shims_torch.txt
