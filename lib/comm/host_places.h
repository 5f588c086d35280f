#pragma once
// A rank's place on its host and across hosts, computed from every rank's host name: what a job
// started by mpirun or srun has to work out itself, since only perseusrun hands it out.

#include <string>
#include <vector>

namespace perseus::comm {

struct HostPlace {
  int local_rank = 0;  // index among the ranks on this host, in rank order
  int local_size = 1;  // ranks on this host
  int cross_rank = 0;  // index among the ranks with this local rank (one per host), host order
  int cross_size = 1;  // hosts that have a rank with this local rank
  int node = 0;        // this rank's host's number, in the order of each host's first rank
};

// `hosts[r]` names rank r's host; hosts are numbered in the order their first rank appears, as
// perseusrun numbers them in host-list order (lib/launch/planning/placement.cc), so both give the
// same places for the same layout. Horovod's meaning of cross: the ranks that share a local rank.
// Requires 0 <= rank < hosts.size().
HostPlace place_among_hosts(const std::vector<std::string> &hosts, int rank);

}  // namespace perseus::comm
