#!/usr/bin/env bash
# Issue 17, eleventh pass, on the GPU machine's host: the 4-rank CPU step with and without
# DistributedOptimizer interleaved inside each job (bench/submission_path.py --interleave), with
# the default bucket and with 256 KiB buckets, then the separate-runs rows as before.
source scripts/gpu/device_env.sh
export PYTHONPATH=$PWD/lib/framework_shims PERSEUS_LIBRARY=$PWD/build/lib/comm/libperseus.so
d=bench/results/issue17_eleventh
{ date; python3 -c 'import torch, sys; print(sys.version.split()[0], torch.__version__)'; git rev-parse HEAD; } > $OUT/versions.txt 2>&1
timeout 200 python3 bench/submission_path.py --ranks 4 --repeats 6 --steps 20 --interleave 40 \
  --json $OUT/interleave_np4.json > $OUT/interleave_np4.txt 2>&1
PERSEUS_GRADIENT_BUCKET_BYTES=262144 timeout 120 python3 bench/submission_path.py --ranks 4 \
  --repeats 4 --steps 20 --interleave 40 --json $OUT/interleave_np4_256k.json \
  > $OUT/interleave_np4_256k.txt 2>&1
timeout 150 python3 bench/submission_path.py --ranks 4 --no-small --repeats 5 \
  --json $OUT/separate_np4.json > $OUT/separate_np4.txt 2>&1
timeout 100 python3 bench/submission_path.py --ranks 8 --repeats 3 --steps 20 --interleave 40 \
  --json $OUT/interleave_np8.json > $OUT/interleave_np8.txt 2>&1
tail -n 4 $OUT/*.txt
