#include <doctest/doctest.h>

#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "lib/launch/errors.h"
#include "lib/launch/planning/placement.h"

namespace perseus::launch {
namespace {

// One row of the table. `layout` is the host_index of each rank in rank order, "HxK" standing
// for K ranks on host H ("0x2 1" is "0 0 1"); `nodes` the host_index of each node; `detail`,
// when not empty, "n<node_rank> l<local_rank>/<local_size> c<cross_rank>/<cross_size>" for
// each rank, joined by " | ". With `error` set, place_ranks must throw InputError containing it.
struct Case {
  std::string name;
  std::vector<PlacementHost> hosts;
  PlacementRequest request;
  std::string layout;
  std::string nodes;
  std::string detail;
  std::string error;
};

std::vector<PlacementHost> slots(std::vector<int> counts) {
  std::vector<PlacementHost> hosts;
  for (int count : counts) hosts.push_back({count, std::nullopt});
  return hosts;
}

PlacementRequest by_slot(int np, int npernode = 0, bool oversubscribe = false) {
  return {np, npernode, MapBy::kSlot, oversubscribe};
}

PlacementRequest by_node(int np, int npernode = 0, bool oversubscribe = false) {
  return {np, npernode, MapBy::kNode, oversubscribe};
}

std::string expand(const std::string &layout) {
  std::istringstream in(layout);
  std::string word;
  std::string out;
  while (in >> word) {
    size_t times = word.find('x');
    int count = times == std::string::npos ? 1 : std::stoi(word.substr(times + 1));
    for (int i = 0; i < count; ++i) out += (out.empty() ? "" : " ") + word.substr(0, times);
  }
  return out;
}

std::string layout_of(const Placement &placement) {
  std::string out;
  for (const RankPlace &place : placement.ranks) {
    out += (out.empty() ? "" : " ") + std::to_string(place.host_index);
  }
  return out;
}

std::string nodes_of(const Placement &placement) {
  std::string out;
  for (int host : placement.nodes) out += (out.empty() ? "" : " ") + std::to_string(host);
  return out;
}

std::string detail_of(const Placement &placement) {
  std::string out;
  for (const RankPlace &p : placement.ranks) {
    out += (out.empty() ? "" : " | ") + ("n" + std::to_string(p.node_rank)) + " l" +
           std::to_string(p.local_rank) + "/" + std::to_string(p.local_size) + " c" +
           std::to_string(p.cross_rank) + "/" + std::to_string(p.cross_size);
  }
  return out;
}

// What holds for every placement, whatever the table says.
void check_invariants(const Placement &placement, size_t host_count) {
  std::map<int, int> ranks_on_host;
  for (int i = 0; i < placement.size(); ++i) {
    const RankPlace &place = placement.ranks[i];
    CHECK(place.rank == i);
    REQUIRE(place.host_index >= 0);
    REQUIRE(place.host_index < static_cast<int>(host_count));
    CHECK(place.local_rank == ranks_on_host[place.host_index]++);
    REQUIRE(place.node_rank < static_cast<int>(placement.nodes.size()));
    CHECK(placement.nodes[place.node_rank] == place.host_index);
    CHECK(place.cross_rank < place.cross_size);
  }
  CHECK(ranks_on_host.size() == placement.nodes.size());
  for (const RankPlace &place : placement.ranks) {
    CHECK(place.local_size == ranks_on_host[place.host_index]);
  }
  for (size_t i = 1; i < placement.nodes.size(); ++i) {
    CHECK(placement.nodes[i - 1] < placement.nodes[i]);
  }
}

const std::vector<Case> &cases() {
  static const std::vector<Case> kCases = {
      {"seed command: 4 bare hosts, -np 32 -npernode 8", slots({1, 1, 1, 1}), by_slot(32, 8),
       "0x8 1x8 2x8 3x8", "0 1 2 3", "", ""},
      {"map-by slot fills each host in turn", slots({2, 3}), by_slot(4), "0x2 1x2", "0 1",
       "n0 l0/2 c0/2 | n0 l1/2 c0/2 | n1 l0/2 c1/2 | n1 l1/2 c1/2", ""},
      {"map-by node deals one per host", slots({2, 3}), by_node(4), "0 1 0 1", "0 1", "", ""},
      {"map-by node skips full hosts", slots({1, 3}), by_node(4), "0 1 1 1", "0 1", "", ""},
      {"np 0 takes every slot", slots({2, 3}), by_slot(0), "0x2 1x3", "0 1", "", ""},
      {"np 0 with npernode takes hosts*npernode", slots({1, 1, 1}), by_slot(0, 2), "0x2 1x2 2x2",
       "0 1 2", "", ""},
      {"npernode below slots", slots({4, 4}), by_slot(0, 1), "0 1", "0 1", "", ""},
      {"npernode by node", slots({1, 1}), by_node(3, 2), "0 1 0", "0 1", "", ""},
      {"npernode is capped by max_slots",
       {{1, 2}, {1, 2}},
       by_slot(0, 4),
       "0x2 1x2",
       "0 1",
       "",
       ""},
      {"uneven by node: slots 3,1,2, np 6", slots({3, 1, 2}), by_node(6), "0 1 2 0 2 0", "0 1 2",
       "n0 l0/3 c0/3 | n1 l0/1 c1/3 | n2 l0/2 c2/3 | n0 l1/3 c0/2 | n2 l1/2 c1/2 | n0 l2/3 c0/1",
       ""},
      {"uneven by slot: slots 3,1,2, np 6", slots({3, 1, 2}), by_slot(6), "0x3 1 2x2", "0 1 2",
       "n0 l0/3 c0/3 | n0 l1/3 c0/2 | n0 l2/3 c0/1 | n1 l0/1 c1/3 | n2 l0/2 c2/3 | n2 l1/2 c1/2",
       ""},
      {"a host without ranks is not a node", slots({2, 2, 2}), by_slot(3), "0x2 1", "0 1", "", ""},
      {"a host with no slots in the middle", slots({2, 0, 2}), by_slot(4), "0x2 2x2", "0 2",
       "n0 l0/2 c0/2 | n0 l1/2 c0/2 | n1 l0/2 c1/2 | n1 l1/2 c1/2", ""},
      {"one rank", slots({4, 4}), by_node(1), "0", "0", "n0 l0/1 c0/1", ""},
      {"oversubscribe by slot deals the extra ranks", slots({2, 1}), by_slot(5, 0, true), "0x3 1x2",
       "0 1", "", ""},
      {"oversubscribe by node", slots({2, 1}), by_node(5, 0, true), "0 1 0 1 0", "0 1", "", ""},
      {"oversubscribe stops at max_slots",
       {{2, 2}, {1, 4}},
       by_slot(6, 0, true),
       "0x2 1x4",
       "0 1",
       "",
       ""},
      {"oversubscribe skips a host at max_slots",
       {{1, 1}, {1, std::nullopt}},
       by_node(4, 0, true),
       "0 1 1 1",
       "0 1",
       "",
       ""},
      {"np over the slots without --oversubscribe", slots({8, 8, 8, 8}), by_slot(40), "", "", "",
       "-np 40 is more than the 32 slots on 4 hosts; add --oversubscribe to run more ranks than "
       "slots, give more slots (slots=N in the hostfile, host:N in -H), or lower -np"},
      {"one over by node", slots({1}), by_node(2), "", "", "",
       "-np 2 is more than the 1 slots on 1 host; add --oversubscribe"},
      {"every host at max_slots",
       {{2, 2}, {1, 2}},
       by_slot(5, 0, true),
       "",
       "",
       "",
       "-np 5 is more than the 4 ranks that max_slots allows on 2 hosts; lower -np or raise "
       "max_slots"},
      {"npernode caps np even with oversubscribe", slots({1, 1, 1, 1}), by_slot(40, 8, true), "",
       "", "",
       "-np 40 is more than -npernode 8 on 4 hosts (32 ranks); lower -np, raise -npernode or add "
       "hosts (--oversubscribe does not go past -npernode)"},
      {"npernode and max_slots",
       {{1, 2}, {1, 2}},
       by_slot(6, 4, true),
       "",
       "",
       "",
       "-np 6 is more than the 4 ranks that max_slots allows on 2 hosts"},
      {"np < 0", slots({1}), by_slot(-1), "", "", "",
       "-np -1 is negative; give the number of ranks, or leave -np out to use every slot"},
      {"npernode < 0", slots({1}), by_slot(1, -2), "", "", "", "-npernode -2 is negative"},
      {"no hosts",
       {},
       by_slot(1),
       "",
       "",
       "",
       "no hosts to run on; give --hostfile FILE or -H host[:slots],..."},
      {"no slots", slots({0, 0}), by_node(0), "", "", "", "the 2 hosts have no slots to run on"},
      {"np over the limit", slots({1}), by_slot(2000000, 0, true), "", "", "",
       "-np 2000000 is over the limit of 1048576 ranks"},
  };
  return kCases;
}

TEST_CASE("placement table") {
  for (const Case &c : cases()) {
    SUBCASE(c.name.c_str()) {
      INFO("case: ", c.name);
      if (!c.error.empty()) {
        std::string message;
        try {
          place_ranks(c.hosts, c.request);
        } catch (const InputError &error) {
          message = error.what();
        }
        CAPTURE(message);
        CHECK(message.find(c.error) != std::string::npos);
        continue;
      }
      Placement placement = place_ranks(c.hosts, c.request);
      CHECK(layout_of(placement) == expand(c.layout));
      CHECK(nodes_of(placement) == c.nodes);
      if (!c.detail.empty()) CHECK(detail_of(placement) == c.detail);
      check_invariants(placement, c.hosts.size());
    }
  }
}

TEST_CASE("placement: invariants over many layouts") {
  for (int a = 0; a <= 3; ++a) {
    for (int b = 1; b <= 3; ++b) {
      for (int c = 0; c <= 2; ++c) {
        for (MapBy map_by : {MapBy::kSlot, MapBy::kNode}) {
          for (int np = 1; np <= a + b + c + 2; ++np) {
            CAPTURE(a);
            CAPTURE(b);
            CAPTURE(c);
            CAPTURE(np);
            PlacementRequest request{np, 0, map_by, true};
            Placement placement = place_ranks(slots({a, b, c}), request);
            REQUIRE(placement.size() == np);
            check_invariants(placement, 3);
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace perseus::launch
