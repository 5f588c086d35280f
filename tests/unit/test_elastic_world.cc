#include <doctest/doctest.h>

#include <climits>
#include <string>
#include <vector>

#include "lib/launch/planning/elastic_world.h"

namespace perseus::launch {
namespace {

std::vector<Host> hosts_of(std::vector<int> slots) {
  std::vector<Host> hosts;
  for (size_t i = 0; i < slots.size(); ++i) {
    hosts.push_back({"", "h" + std::to_string(i), slots[i], std::nullopt});
  }
  return hosts;
}

// "id@host/slot" of each new process, and per rank "id h<host> l<local>/<size> c<cross>/<size>".
std::string fresh_text(const WorldPlan &plan) {
  std::string text;
  for (const NewProcess &p : plan.fresh) {
    text += (text.empty() ? "" : " ") + std::to_string(p.id) + "@" + std::to_string(p.host) + "/" +
            std::to_string(p.slot);
  }
  return text;
}

std::string ranks_text(const WorldPlan &plan) {
  std::string text;
  for (const RankPlace &r : plan.placement.ranks) {
    text += (text.empty() ? "" : " | ") + std::to_string(plan.ids[static_cast<size_t>(r.rank)]) +
            " h" + std::to_string(r.host_index) + " l" + std::to_string(r.local_rank) + "/" +
            std::to_string(r.local_size) + " c" + std::to_string(r.cross_rank) + "/" +
            std::to_string(r.cross_size);
  }
  return text;
}

TEST_CASE("plan_world: a failed rank's slot is filled by a new process after the survivors") {
  // 4 ranks on one host; rank 1 (id 1, slot 1) died. The survivors keep their order, the new
  // process (id 4) takes slot 1 and comes last, so that rank 0 holds the committed state.
  const WorldPlan plan =
      plan_world(hosts_of({4}), {{0, 0, 0, 0}, {2, 0, 2, 2}, {3, 0, 3, 3}}, 0, LLONG_MAX, 4);
  CHECK(fresh_text(plan) == "4@0/1");
  CHECK(ranks_text(plan) == "0 h0 l0/4 c0/1 | 2 h0 l1/4 c0/1 | 3 h0 l2/4 c0/1 | 4 h0 l3/4 c0/1");
  CHECK(plan.placement.nodes == std::vector<int>{0});
}

TEST_CASE("plan_world: a lost host leaves the others' ranks in their order") {
  // 3 hosts x 2; host 2 is not usable any more (its processes are not survivors).
  const WorldPlan plan = plan_world(
      hosts_of({2, 2}), {{0, 0, 0, 0}, {1, 0, 1, 1}, {2, 1, 0, 2}, {3, 1, 1, 3}}, 0, LLONG_MAX, 6);
  CHECK(plan.fresh.empty());
  CHECK(ranks_text(plan) == "0 h0 l0/2 c0/2 | 1 h0 l1/2 c0/2 | 2 h1 l0/2 c1/2 | 3 h1 l1/2 c1/2");
}

TEST_CASE("plan_world: rank 0 is the lowest old rank even when its host comes later") {
  // The script lists a new host first and the survivors' host second; old rank 0 died, so old
  // rank 1 (id 1) becomes rank 0, and the new host's processes come after every survivor.
  const WorldPlan plan =
      plan_world(hosts_of({2, 3}), {{1, 1, 1, 1}, {2, 1, 2, 2}}, 0, LLONG_MAX, 5);
  CHECK(fresh_text(plan) == "5@0/0 6@0/1 7@1/0");
  CHECK(plan.ids == std::vector<int>{1, 2, 7, 5, 6});
  CHECK(plan.placement.ranks[0].host_index == 1);
  CHECK(plan.placement.nodes == std::vector<int>{1, 0});
  CHECK(ranks_text(plan) ==
        "1 h1 l0/3 c0/2 | 2 h1 l1/3 c0/2 | 7 h1 l2/3 c0/1 | 5 h0 l0/2 c1/2 | 6 h0 l1/2 c1/2");
}

TEST_CASE("plan_world: --max-np caps the new processes, never the survivors") {
  const WorldPlan capped = plan_world(hosts_of({2, 2}), {{0, 0, 0, 0}, {1, 0, 1, 1}}, 0, 3, 2);
  CHECK(fresh_text(capped) == "2@1/0");
  CHECK(capped.placement.size() == 3);
  const WorldPlan over = plan_world(hosts_of({2}), {{0, 0, 0, 0}, {1, 0, 1, 1}}, 0, 1, 2);
  CHECK(over.fresh.empty());
  CHECK(over.placement.size() == 2);
}

TEST_CASE("plan_world: -npernode decides the slots; survivors beyond them stay") {
  const WorldPlan plan =
      plan_world(hosts_of({8, 8}), {{0, 0, 0, 0}, {5, 1, 3, 1}}, 2, LLONG_MAX, 9);
  CHECK(fresh_text(plan) == "9@0/1 10@1/0 11@1/1");
  CHECK(plan.placement.size() == 5);
  CHECK(ranks_text(plan) ==
        "0 h0 l0/2 c0/2 | 9 h0 l1/2 c0/2 | 5 h1 l0/3 c1/2 | 10 h1 l1/3 c1/2 | 11 h1 l2/3 c0/1");
}

TEST_CASE("plan_world: processes that have not joined yet come after those that have") {
  // id 4 was started for the current world (rank 3 there) but the world broke before it joined:
  // it has no state, so it never leads.
  const WorldPlan plan = plan_world(hosts_of({3}), {{4, 0, 0, -1}, {2, 0, 2, 1}}, 0, LLONG_MAX, 5);
  CHECK(plan.ids.front() == 2);
  CHECK(fresh_text(plan) == "5@0/1");
}

TEST_CASE("plan_world: no usable host, no world") {
  const WorldPlan plan = plan_world({}, {}, 0, LLONG_MAX, 0);
  CHECK(plan.placement.size() == 0);
  CHECK(plan.fresh.empty());
}

}  // namespace
}  // namespace perseus::launch
