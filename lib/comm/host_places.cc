#include "lib/comm/host_places.h"

#include <map>

namespace perseus::comm {

HostPlace place_among_hosts(const std::vector<std::string> &hosts, int rank) {
  // For every rank: its host's number (by first appearance) and its local rank there.
  std::map<std::string, int> host_number;
  std::vector<int> ranks_on;  // by host number
  std::vector<int> number(hosts.size()), local(hosts.size());
  for (size_t r = 0; r < hosts.size(); ++r) {
    const auto [at, added] = host_number.emplace(hosts[r], static_cast<int>(ranks_on.size()));
    if (added) ranks_on.push_back(0);
    number[r] = at->second;
    local[r] = ranks_on[at->second]++;
  }
  const auto me = static_cast<size_t>(rank);
  HostPlace place{local[me], ranks_on[number[me]], 0, 0, number[me]};
  for (size_t r = 0; r < hosts.size(); ++r) {
    if (local[r] != local[me]) continue;
    ++place.cross_size;
    if (number[r] < number[me]) ++place.cross_rank;
  }
  return place;
}

}  // namespace perseus::comm
