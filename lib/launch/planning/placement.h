#pragma once
// Where each rank runs: a pure function of the hosts and the mapping options, so that it can be
// tested as a table.
//
// Rules:
//  - Capacity of a host is its slots, or `npernode` when that is set (npernode overrides
//    slots: "-npernode 8" on a bare hostfile runs 8 per host); never above its max_slots.
//    A host with 0 slots takes no rank unless oversubscribed.
//  - np == 0 means the total capacity.
//  - MapBy::kSlot fills host 0 up to its capacity, then host 1, ...; MapBy::kNode deals ranks
//    one per host in turn, skipping hosts that are full.
//  - np above the total capacity is an InputError naming np, the capacity and the fixes
//    (--oversubscribe, more slots); with oversubscribe the extra ranks are dealt one per host in
//    turn, never beyond a host's max_slots (all hosts at max_slots is an InputError). With
//    npernode set, np above hosts*npernode is an InputError even with oversubscribe.
//  - np < 0, npernode < 0, or no hosts: InputError. So is np (given, or the total capacity when
//    np == 0) above 1048576 ranks, and np == 0 with no capacity at all.
//  - Hosts that get no rank are left out of the node numbering.
//  - local_rank orders a host's ranks by global rank. node_rank is the index of the rank's host
//    among the hosts that got ranks. cross_rank is the index of the rank's host among the hosts
//    that have a rank with the same local_rank; cross_size is the number of those hosts
//    (Horovod's definition).

#include <optional>
#include <vector>

namespace perseus::launch {

enum class MapBy { kSlot, kNode };

struct PlacementHost {
  int slots = 1;
  std::optional<int> max_slots;
};

struct PlacementRequest {
  int np = 0;
  int npernode = 0;  // 0: not set
  MapBy map_by = MapBy::kSlot;
  bool oversubscribe = false;
};

struct RankPlace {
  int rank = 0;
  int host_index = 0;  // index into the hosts given to place_ranks
  int node_rank = 0;
  int local_rank = 0;
  int local_size = 0;
  int cross_rank = 0;
  int cross_size = 0;

  bool operator==(const RankPlace &) const = default;
};

struct Placement {
  std::vector<RankPlace> ranks;  // ranks[i].rank == i
  std::vector<int> nodes;        // host_index of each node, in node_rank order

  int size() const { return static_cast<int>(ranks.size()); }
};

Placement place_ranks(const std::vector<PlacementHost> &hosts, const PlacementRequest &request);

// Sets every rank's cross_rank and cross_size from its node_rank and local_rank (the rule above);
// place_ranks and the elastic worlds of planning/elastic_world number theirs with it.
void number_cross_ranks(Placement &placement);

}  // namespace perseus::launch
