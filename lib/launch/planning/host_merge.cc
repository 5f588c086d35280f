#include "lib/launch/planning/host_merge.h"

#include <algorithm>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "lib/launch/errors.h"

namespace perseus::launch {
namespace {

constexpr long long kMaxSlots = 65536;
constexpr size_t kOriginsShown = 4;

// The mentions of one host seen so far.
struct Mentions {
  Host host;
  const HostSpec *first = nullptr;
  long long count = 0;
  long long bare = 0;
  long long explicit_slots = 0;
  std::string max_origin;            // where the smallest max_slots was given
  std::vector<std::string> origins;  // distinct, in order of mention
  std::unordered_set<std::string> origin_set;
};

std::string key_of(const HostSpec &spec) {
  return spec.user.empty() ? spec.host : spec.user + "@" + spec.host;
}

void add(Mentions &mentions, const HostSpec &spec) {
  ++mentions.count;
  if (spec.slots) {
    mentions.explicit_slots += *spec.slots;
  } else {
    ++mentions.bare;
  }
  std::optional<int> &max = mentions.host.max_slots;
  if (spec.max_slots && (!max || *spec.max_slots < *max)) {
    max = spec.max_slots;
    mentions.max_origin = spec.origin;
  }
  if (mentions.origin_set.insert(spec.origin).second) mentions.origins.push_back(spec.origin);
}

std::string describe_origins(const Mentions &mentions) {
  const std::vector<std::string> &origins = mentions.origins;
  std::string text;
  for (size_t i = 0; i < origins.size() && i < kOriginsShown; ++i) {
    text += (i == 0 ? "" : ", ") + origins[i];
  }
  if (origins.size() > kOriginsShown) {
    text += " and " + std::to_string(origins.size() - kOriginsShown) + " more";
  }
  return text;
}

// A host mentioned once, bare: its GPU count when known (never above its max_slots), else 1.
int bare_host_slots(const Mentions &mentions, const BareSlots &bare_slots) {
  std::optional<int> found = bare_slots ? bare_slots(*mentions.first) : std::nullopt;
  long long slots = found && *found >= 1 ? *found : 1;
  if (mentions.host.max_slots) slots = std::min<long long>(slots, *mentions.host.max_slots);
  return static_cast<int>(std::min(slots, kMaxSlots));
}

Host finish(const Mentions &mentions, const BareSlots &bare_slots) {
  Host host = mentions.host;
  if (mentions.count == 1 && mentions.bare == 1) {
    host.slots = bare_host_slots(mentions, bare_slots);
    return host;
  }
  long long slots = mentions.explicit_slots + mentions.bare;
  std::string name = key_of(*mentions.first);
  if (host.max_slots && slots > *host.max_slots) {
    throw InputError("host '" + name + "' gets " + std::to_string(slots) + " slots (from " +
                     describe_origins(mentions) + ") but its max_slots is " +
                     std::to_string(*host.max_slots) + " (" + mentions.max_origin +
                     "); lower its slots or raise max_slots");
  }
  if (slots > kMaxSlots) {
    throw InputError("host '" + name + "' gets " + std::to_string(slots) + " slots (from " +
                     describe_origins(mentions) + "), more than the limit of " +
                     std::to_string(kMaxSlots) + "; lower its slots");
  }
  host.slots = static_cast<int>(slots);
  return host;
}

}  // namespace

std::vector<Host> merge_hosts(const std::vector<HostSpec> &mentions, const BareSlots &bare_slots) {
  std::vector<Mentions> merged;
  std::unordered_map<std::string, size_t> index_of;
  for (const HostSpec &spec : mentions) {
    auto [it, inserted] = index_of.try_emplace(key_of(spec), merged.size());
    if (inserted) {
      Mentions &added = merged.emplace_back();
      added.host.user = spec.user;
      added.host.host = spec.host;
      added.first = &spec;
    }
    add(merged[it->second], spec);
  }
  std::vector<Host> hosts;
  hosts.reserve(merged.size());
  for (const Mentions &host_mentions : merged) hosts.push_back(finish(host_mentions, bare_slots));
  return hosts;
}

}  // namespace perseus::launch
