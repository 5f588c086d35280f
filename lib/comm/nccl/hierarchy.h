#pragma once
// Hierarchical all-reduce on device memory (PERSEUS_HIERARCHICAL_ALLREDUCE=1), for jobs over
// several hosts whose GPUs talk faster inside a host (NVLink) than across hosts (the network):
// the data crosses the network once per host instead of once per GPU.
//
// Two schemes, chosen from where the ranks are (plan_hierarchy), the same on every rank:
// - every host has the same number of ranks L (kScatterGather, Horovod's hierarchical
//   all-reduce): a reduce-scatter inside each host leaves each local rank 1/L of the host's sum;
//   the ranks with the same local rank all-reduce their part across hosts (L communicators, so
//   every GPU's network link works at once); an all-gather inside each host brings the parts
//   together. Elements past the last multiple of L (fewer than L) go through the flat
//   communicator. Averages of floating types average in both steps (equal to the job's average
//   up to rounding); integer averages take the flat path (truncation would not add up).
// - hosts with different numbers of ranks (kReduceBroadcast): a reduce inside each host to its
//   first rank; those ranks, one per host, all-reduce across hosts; a broadcast inside each host
//   from its first rank. Averages take the flat path here (a host's average is not the job's).
// A job on one host, or with one rank per host, has nothing to gain: kFlat, one communicator.

#include <cstddef>
#include <string>
#include <vector>

#include "lib/comm/nccl/communicator.h"
#include "lib/comm/types.h"

namespace perseus::comm::nccl {

enum class Scheme { kFlat, kScatterGather, kReduceBroadcast };

struct HostLayout {
  Scheme scheme = Scheme::kFlat;
  int hosts = 1;
  int host_index = 0;  // this rank's host, numbered in the order of each host's first rank
  int local_rank = 0;  // among the ranks of this host, in rank order
  int local_size = 1;
  // The cross-host communicator this rank is in: the ranks with its local rank, one per host
  // (kScatterGather), or the first rank of every host (kReduceBroadcast: local rank 0 only).
  bool in_cross = false;
  int cross_rank = 0;  // = host_index for both schemes
  int cross_size = 1;

  // "2 hosts x 4 ranks: reduce-scatter, all-reduce across hosts, all-gather"
  std::string describe() const;
};

// hosts[r] names rank r's host (any text that is equal for the ranks of one host). Local ranks
// are counted in rank order within each host. Requires 0 <= rank < hosts.size().
HostLayout plan_hierarchy(const std::vector<std::string> &hosts, int rank);

// One all-reduce of `count` elements by layout's scheme; every rank of the job calls it with the
// same count, type and op, in the same order as its other operations on these communicators.
// flat: all ranks; local: this host's ranks (null for kFlat); cross: the layout's cross-host
// communicator (null when !layout.in_cross). Queued on `stream`, as Communicator's calls.
void hierarchical_allreduce(const HostLayout &layout, Communicator &flat, Communicator *local,
                            Communicator *cross, const void *send, void *recv, size_t count,
                            DataType type, ReduceOp op, CudaStream stream);

}  // namespace perseus::comm::nccl
