#include "lib/launch/planning/elastic_world.h"

#include <algorithm>
#include <climits>
#include <set>

namespace perseus::launch {

namespace {

struct Member {
  int id;
  int slot;
  long long order;  // the old rank; LLONG_MAX for a new process or one that has not joined
};

}  // namespace

WorldPlan plan_world(const std::vector<Host> &hosts, const std::vector<WorldSurvivor> &survivors,
                     int npernode, long long cap, int first_new_id) {
  WorldPlan plan;
  std::vector<std::vector<Member>> on_host(hosts.size());
  long long size = 0;
  for (const WorldSurvivor &s : survivors) {
    if (s.host >= hosts.size()) continue;
    on_host[s.host].push_back({s.id, s.slot, s.old_rank < 0 ? LLONG_MAX : s.old_rank});
    size += 1;
  }
  int next_id = first_new_id;
  for (size_t h = 0; h < hosts.size(); ++h) {
    const int slots = npernode ? npernode : hosts[h].slots;
    std::set<int> taken;
    for (const Member &m : on_host[h]) taken.insert(m.slot);
    for (int slot = 0; slot < slots && size < cap; ++slot) {
      if (taken.count(slot)) continue;
      plan.fresh.push_back({next_id, h, slot});
      on_host[h].push_back({next_id, slot, LLONG_MAX});
      next_id += 1;
      size += 1;
    }
  }
  std::vector<size_t> host_order(hosts.size());
  std::vector<long long> first(hosts.size(), LLONG_MAX);
  for (size_t h = 0; h < hosts.size(); ++h) {
    host_order[h] = h;
    std::stable_sort(on_host[h].begin(), on_host[h].end(), [](const Member &a, const Member &b) {
      return a.order != b.order ? a.order < b.order : a.slot < b.slot;
    });
    if (!on_host[h].empty()) first[h] = on_host[h].front().order;
  }
  std::stable_sort(host_order.begin(), host_order.end(),
                   [&](size_t a, size_t b) { return first[a] < first[b]; });
  int node = 0;
  for (size_t h : host_order) {
    const std::vector<Member> &members = on_host[h];
    if (members.empty()) continue;
    plan.placement.nodes.push_back(static_cast<int>(h));
    for (size_t i = 0; i < members.size(); ++i) {
      RankPlace place;
      place.rank = plan.placement.size();
      place.host_index = static_cast<int>(h);
      place.node_rank = node;
      place.local_rank = static_cast<int>(i);
      place.local_size = static_cast<int>(members.size());
      plan.placement.ranks.push_back(place);
      plan.ids.push_back(members[i].id);
    }
    node += 1;
  }
  number_cross_ranks(plan.placement);
  return plan;
}

}  // namespace perseus::launch
