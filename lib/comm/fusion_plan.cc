#include "lib/comm/fusion_plan.h"

#include "lib/comm/op_traits.h"

namespace perseus::comm {

bool fusible(const Agreed &agreed) {
  return agreed.error.empty() && traits(agreed.per_rank[0].kind).fusible;
}

namespace {

bool fuse_together(const Descriptor &a, const Descriptor &b) {
  return a.type == b.type && a.op == b.op && a.prescale == b.prescale &&
         a.postscale == b.postscale && a.process_set == b.process_set &&
         (a.device < 0) == (b.device < 0);
}

size_t bytes_of(const Descriptor &d) { return static_cast<size_t>(d.count) * element_size(d.type); }

}  // namespace

std::vector<std::vector<size_t>> plan_fusion(const std::vector<Agreed> &ready, size_t threshold) {
  std::vector<std::vector<size_t>> groups;
  std::vector<bool> taken(ready.size(), false);
  for (size_t i = 0; i < ready.size(); ++i) {
    if (taken[i]) continue;
    taken[i] = true;
    groups.push_back({i});
    if (!fusible(ready[i])) continue;
    const Descriptor &first = ready[i].per_rank[0];
    size_t bytes = bytes_of(first);
    for (size_t j = i + 1; j < ready.size() && bytes < threshold; ++j) {
      if (taken[j] || !fusible(ready[j])) continue;
      const Descriptor &other = ready[j].per_rank[0];
      if (!fuse_together(first, other) || bytes + bytes_of(other) > threshold) continue;
      bytes += bytes_of(other);
      groups.back().push_back(j);
      taken[j] = true;
    }
  }
  return groups;
}

}  // namespace perseus::comm
