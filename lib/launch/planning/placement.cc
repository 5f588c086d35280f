#include "lib/launch/planning/placement.h"

#include <algorithm>
#include <climits>
#include <string>
#include <vector>

#include "lib/launch/errors.h"

namespace perseus::launch {
namespace {

constexpr long long kMaxRanks = 1 << 20;
constexpr int kNoLimit = INT_MAX;

std::string hosts_text(size_t count) {
  return std::to_string(count) + (count == 1 ? " host" : " hosts");
}

void check_request(const std::vector<PlacementHost> &hosts, const PlacementRequest &request) {
  if (hosts.empty()) {
    throw InputError("no hosts to run on; give --hostfile FILE or -H host[:slots],...");
  }
  if (request.np < 0) {
    throw InputError("-np " + std::to_string(request.np) +
                     " is negative; give the number of ranks, or leave -np out to use every slot");
  }
  if (request.npernode < 0) {
    throw InputError("-npernode " + std::to_string(request.npernode) +
                     " is negative; give the ranks per host, or leave -npernode out to use the "
                     "slots");
  }
  if (request.np > kMaxRanks) {
    throw InputError("-np " + std::to_string(request.np) + " is over the limit of " +
                     std::to_string(kMaxRanks) + " ranks; lower -np");
  }
}

// Ranks each host takes before oversubscribing: its slots, or npernode when set; never above
// its max_slots.
std::vector<int> capacities(const std::vector<PlacementHost> &hosts,
                            const PlacementRequest &request) {
  std::vector<int> capacity;
  capacity.reserve(hosts.size());
  for (const PlacementHost &host : hosts) {
    int ranks = request.npernode > 0 ? request.npernode : std::max(host.slots, 0);
    if (host.max_slots) ranks = std::min(ranks, std::max(*host.max_slots, 0));
    capacity.push_back(ranks);
  }
  return capacity;
}

long long sum(const std::vector<int> &values) {
  long long total = 0;
  for (int value : values) total += value;
  return total;
}

// The ranks the hosts can take with --oversubscribe: unlimited unless every host has max_slots
// or npernode is set (then oversubscribing adds nothing, as capacity is already npernode).
long long oversubscribed_limit(const std::vector<PlacementHost> &hosts,
                               const PlacementRequest &request, long long total) {
  if (request.npernode > 0) return total;
  long long limit = 0;
  for (const PlacementHost &host : hosts) {
    if (!host.max_slots) return LLONG_MAX;
    limit += std::max(*host.max_slots, 0);
  }
  return limit;
}

// Throws unless np ranks fit on the hosts, whose capacity is `total` without oversubscribing.
void check_capacity(const std::vector<PlacementHost> &hosts, const PlacementRequest &request,
                    long long np, long long total) {
  std::string asked = "-np " + std::to_string(np);
  long long per_node_limit = static_cast<long long>(hosts.size()) * request.npernode;
  if (request.npernode > 0 && np > per_node_limit) {
    throw InputError(asked + " is more than -npernode " + std::to_string(request.npernode) +
                     " on " + hosts_text(hosts.size()) + " (" + std::to_string(per_node_limit) +
                     " ranks); lower -np, raise -npernode or add hosts (--oversubscribe does "
                     "not go past -npernode)");
  }
  long long limit = oversubscribed_limit(hosts, request, total);
  if (np > limit) {
    throw InputError(asked + " is more than the " + std::to_string(limit) +
                     " ranks that max_slots allows on " + hosts_text(hosts.size()) +
                     "; lower -np or raise max_slots");
  }
  if (!request.oversubscribe) {
    throw InputError(asked + " is more than the " + std::to_string(total) + " slots on " +
                     hosts_text(hosts.size()) +
                     "; add --oversubscribe to run more ranks than slots, give more slots "
                     "(slots=N in the hostfile, host:N in -H), or lower -np");
  }
}

// Deals `n` ranks one per host in turn, skipping hosts that have reached `limits`; appends the
// host of each rank to `order` when given.
void deal(const std::vector<int> &limits, long long n, std::vector<int> &counts,
          std::vector<int> *order) {
  std::vector<size_t> active;
  for (size_t i = 0; i < limits.size(); ++i) {
    if (counts[i] < limits[i]) active.push_back(i);
  }
  while (n > 0 && !active.empty()) {
    std::vector<size_t> next;
    for (size_t i : active) {
      if (n == 0) break;
      ++counts[i];
      --n;
      if (order) order->push_back(static_cast<int>(i));
      if (counts[i] < limits[i]) next.push_back(i);
    }
    active = std::move(next);
  }
}

// How many ranks each host gets.
std::vector<int> count_ranks(const std::vector<PlacementHost> &hosts,
                             const std::vector<int> &capacity, MapBy map_by, long long np) {
  std::vector<int> counts(hosts.size(), 0);
  long long left = np;
  if (map_by == MapBy::kSlot) {
    for (size_t i = 0; i < hosts.size(); ++i) {
      counts[i] = static_cast<int>(std::min<long long>(capacity[i], left));
      left -= counts[i];
    }
  } else {
    deal(capacity, left, counts, nullptr);
    left = np - sum(counts);
  }
  if (left > 0) {
    std::vector<int> limits;
    for (const PlacementHost &host : hosts) limits.push_back(host.max_slots.value_or(kNoLimit));
    deal(limits, left, counts, nullptr);
  }
  return counts;
}

// The host of each rank, in rank order.
std::vector<int> rank_hosts(const std::vector<int> &counts, MapBy map_by, long long np) {
  std::vector<int> order;
  order.reserve(static_cast<size_t>(np));
  if (map_by == MapBy::kNode) {
    std::vector<int> dealt(counts.size(), 0);
    deal(counts, np, dealt, &order);
    return order;
  }
  for (size_t i = 0; i < counts.size(); ++i)
    order.insert(order.end(), counts[i], static_cast<int>(i));
  return order;
}

// Numbers the hosts that got ranks and computes the per-host and cross-host ranks.
Placement number_ranks(const std::vector<int> &counts, const std::vector<int> &order) {
  Placement placement;
  std::vector<int> node_of(counts.size(), -1);
  for (size_t i = 0; i < counts.size(); ++i) {
    if (counts[i] == 0) continue;
    node_of[i] = static_cast<int>(placement.nodes.size());
    placement.nodes.push_back(static_cast<int>(i));
  }
  std::vector<int> placed(counts.size(), 0);  // ranks given to each host so far
  placement.ranks.reserve(order.size());
  for (int host : order) {
    placement.ranks.push_back(RankPlace{.rank = placement.size(),
                                        .host_index = host,
                                        .node_rank = node_of[host],
                                        .local_rank = placed[host]++,
                                        .local_size = counts[host]});
  }
  number_cross_ranks(placement);
  return placement;
}

}  // namespace

void number_cross_ranks(Placement &placement) {
  // For each node in turn (node_rank order) and each local_rank: how many nodes so far have it.
  std::vector<std::vector<RankPlace *>> on_node(placement.nodes.size());
  for (RankPlace &place : placement.ranks) {
    on_node.at(static_cast<size_t>(place.node_rank)).push_back(&place);
  }
  std::vector<int> seen;
  for (const std::vector<RankPlace *> &ranks : on_node) {
    for (RankPlace *place : ranks) {
      const auto local = static_cast<size_t>(place->local_rank);
      if (seen.size() <= local) seen.resize(local + 1, 0);
      place->cross_rank = seen[local]++;
    }
  }
  for (RankPlace &place : placement.ranks) {
    place.cross_size = seen[static_cast<size_t>(place.local_rank)];
  }
}

Placement place_ranks(const std::vector<PlacementHost> &hosts, const PlacementRequest &request) {
  check_request(hosts, request);
  std::vector<int> capacity = capacities(hosts, request);
  long long total = sum(capacity);
  long long np = request.np > 0 ? request.np : total;
  if (np == 0) {
    throw InputError("the " + hosts_text(hosts.size()) +
                     " have no slots to run on; give slots=N in the hostfile or host:N in -H");
  }
  if (np > kMaxRanks) {
    throw InputError("the " + hosts_text(hosts.size()) + " have " + std::to_string(total) +
                     " slots, over the limit of " + std::to_string(kMaxRanks) +
                     " ranks; give a smaller -np");
  }
  if (np > total) check_capacity(hosts, request, np, total);
  std::vector<int> counts = count_ranks(hosts, capacity, request.map_by, np);
  return number_ranks(counts, rank_hosts(counts, request.map_by, np));
}

}  // namespace perseus::launch
