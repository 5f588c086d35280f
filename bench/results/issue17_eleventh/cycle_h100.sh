#!/usr/bin/env bash
# Issue 17, eleventh pass: PERSEUS_CYCLE_TIME 1 (default) against 5 on the GPU machine's host, 4
# ranks, interleaved jobs of 20 blocks, alternating (the lead of RESULTS.md's eleventh pass).
source scripts/gpu/device_env.sh
export PERSEUS_LIBRARY=$PWD/build/lib/comm/libperseus.so
for i in 1 2 3; do
  for ct in 1 5; do
    echo -n "ct=$ct " >> $OUT/cycle_h100_np4.txt
    PERSEUS_CYCLE_TIME=$ct timeout 40 python3 bench/submission_path.py --ranks 4 --repeats 1 \
      --steps 20 --interleave 20 2>&1 | grep -E 'job 0|failed' >> $OUT/cycle_h100_np4.txt
  done
done
cat $OUT/cycle_h100_np4.txt
