#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "lib/comm/host_places.h"

namespace perseus::comm {
namespace {

// Every rank's place, for comparing whole layouts at once.
std::vector<std::vector<int>> places(const std::vector<std::string> &hosts) {
  std::vector<std::vector<int>> all;
  for (size_t r = 0; r < hosts.size(); ++r) {
    const HostPlace p = place_among_hosts(hosts, static_cast<int>(r));
    all.push_back({p.local_rank, p.local_size, p.cross_rank, p.cross_size, p.node});
  }
  return all;
}

using Places = std::vector<std::vector<int>>;

TEST_CASE("host_places: one host is one local group, each rank alone across hosts") {
  CHECK(places({"a", "a", "a"}) == Places{{0, 3, 0, 1, 0}, {1, 3, 0, 1, 0}, {2, 3, 0, 1, 0}});
}

TEST_CASE("host_places: one rank per host") {
  CHECK(places({"a", "b", "c"}) == Places{{0, 1, 0, 3, 0}, {0, 1, 1, 3, 1}, {0, 1, 2, 3, 2}});
}

TEST_CASE("host_places: blocks of two on two hosts, as perseusrun -np 4 -H a:2,b:2 places them") {
  // perseusrun gives rank 3 of this layout local 1/2, cross 1/2 (lib/launch/planning/placement.cc).
  CHECK(places({"a", "a", "b", "b"}) ==
        Places{{0, 2, 0, 2, 0}, {1, 2, 0, 2, 0}, {0, 2, 1, 2, 1}, {1, 2, 1, 2, 1}});
}

TEST_CASE("host_places: round-robin placement (mpirun --map-by node)") {
  CHECK(places({"a", "b", "a", "b"}) ==
        Places{{0, 2, 0, 2, 0}, {0, 2, 1, 2, 1}, {1, 2, 0, 2, 0}, {1, 2, 1, 2, 1}});
}

TEST_CASE("host_places: uneven hosts: cross counts only the hosts with that local rank") {
  // Host a has 3 ranks, b has 1: local rank 0 is on both hosts, local ranks 1 and 2 only on a.
  CHECK(places({"a", "a", "a", "b"}) ==
        Places{{0, 3, 0, 2, 0}, {1, 3, 0, 1, 0}, {2, 3, 0, 1, 0}, {0, 1, 1, 2, 1}});
}

TEST_CASE("host_places: hosts are numbered by their first rank, not by name") {
  CHECK(places({"z", "a"}) == Places{{0, 1, 0, 2, 0}, {0, 1, 1, 2, 1}});
}

}  // namespace
}  // namespace perseus::comm
