#!/usr/bin/env bash
# Runs one rank of a perseusrun job as if the job's ranks were spread over several hosts, on a
# machine with one GPU: a way to exercise multi-host code paths (hierarchical all-reduce, NCCL's
# network transport) where only one GPU is lent.
#
#   perseusrun -np 4 -H localhost:4 --gpu-bind none -x NCCL_NVLS_ENABLE=0 \
#       scripts/gpu/as_simulated_host.sh 2,2 python3 train.py
#
# SIZES (2,2 above) is the number of ranks on each simulated host, in rank order; they must add
# up to the job's size. For this rank (PERSEUS_RANK) it sets the place variables perseusrun
# would set on such a layout (PERSEUS_/HOROVOD_/OMPI_ local and cross ranks, node rank,
# LOCAL_RANK, GROUP_RANK), and tells NCCL that each rank is on a host of its own
# (NCCL_HOSTID), which is what lets several ranks share GPU 0 (NCCL refuses two ranks of one
# host on one GPU): NCCL then connects every pair through its socket transport over loopback
# (NCCL_SOCKET_IFNAME=lo), so the figures are a network's, not NVLink's.
set -euo pipefail
if [ $# -lt 2 ]; then
  echo "usage: $0 SIZES COMMAND [ARG...]   (SIZES: ranks per simulated host, e.g. 2,2)" >&2
  exit 2
fi
IFS=, read -ra per_host <<< "$1"
shift
rank=${PERSEUS_RANK:?"not under perseusrun (PERSEUS_RANK is not set)"}
total=0
for n in "${per_host[@]}"; do
  [[ $n =~ ^[1-9][0-9]*$ ]] || { echo "$0: '$n' in SIZES is not a positive number" >&2; exit 2; }
  total=$((total + n))
done
if [ "$total" != "${PERSEUS_SIZE:?}" ]; then
  echo "$0: SIZES adds up to $total ranks but the job has $PERSEUS_SIZE" >&2
  exit 2
fi
node=0
first=0
while ((rank >= first + per_host[node])); do
  first=$((first + per_host[node]))
  node=$((node + 1))
done
local_rank=$((rank - first))
local_size=${per_host[node]}
cross_rank=0
cross_size=0
for ((h = 0; h < ${#per_host[@]}; h++)); do
  if ((per_host[h] > local_rank)); then
    cross_size=$((cross_size + 1))
    ((h < node)) && cross_rank=$((cross_rank + 1))
  fi
done
for prefix in PERSEUS HOROVOD; do
  export "${prefix}_LOCAL_RANK=$local_rank" "${prefix}_LOCAL_SIZE=$local_size"
  export "${prefix}_CROSS_RANK=$cross_rank" "${prefix}_CROSS_SIZE=$cross_size"
done
export PERSEUS_NODE_RANK=$node PERSEUS_NUM_NODES=${#per_host[@]}
export OMPI_COMM_WORLD_LOCAL_RANK=$local_rank OMPI_COMM_WORLD_LOCAL_SIZE=$local_size
export LOCAL_RANK=$local_rank LOCAL_WORLD_SIZE=$local_size GROUP_RANK=$node NODE_RANK=$node
# A process of an elastic job keeps its id while its rank changes: one host per process.
export NCCL_HOSTID="perseus-simulated-rank-${PERSEUS_ELASTIC_WORKER:-$rank}"
export NCCL_SOCKET_IFNAME=${NCCL_SOCKET_IFNAME:-lo}
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
export NCCL_NVLS_ENABLE=0
exec "$@"
