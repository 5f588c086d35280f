#pragma once
// The next world of an elastic job made in place (Horovod's elastic model; launcher.cc's
// Launcher::regroup does the rest): who is in it and where, from the processes still running on
// the usable hosts and the free slots of those hosts. Pure: tested as tables
// (tests/unit/test_elastic_world.cc).

#include <string>
#include <vector>

#include "lib/launch/planning/host_merge.h"
#include "lib/launch/planning/placement.h"

namespace perseus::launch {

// A process still running on one of the usable hosts.
struct WorldSurvivor {
  int id = 0;         // its id for the job (PERSEUS_ELASTIC_WORKER)
  size_t host = 0;    // index into the hosts
  int slot = 0;       // its local rank when it started (which chose its GPU)
  int old_rank = -1;  // its rank in the current world; -1: none yet (started for it, not joined)
};

struct NewProcess {
  int id = 0;
  size_t host = 0;
  int slot = 0;
};

struct WorldPlan {
  Placement placement;            // host_index into the hosts given
  std::vector<int> ids;           // the process id of each rank
  std::vector<NewProcess> fresh;  // the processes to start (ids from first_new_id on)
};

// Survivors keep their slots; each host's free slots (its slots, or npernode) get new processes,
// hosts in the given order, until the world has `cap` ranks. Rank 0 must hold the committed state
// that every rank takes at the next sync, so the survivors keep their order (hosts by their
// lowest old rank, each host's processes by old rank) and the new processes come after them (on
// their hosts by slot; hosts without survivors in the given order). Local ranks count each
// host's processes in that order; cross ranks as placement.h counts them.
WorldPlan plan_world(const std::vector<Host> &hosts, const std::vector<WorldSurvivor> &survivors,
                     int npernode, long long cap, int first_new_id);

}  // namespace perseus::launch
