#pragma once
// Turns host mentions into the list of distinct hosts with their slot counts, in order of
// first mention. The key of a host is user@host as written.
//  - Explicit slots add up over repeated mentions ("a slots=2" and "a slots=3": 5 slots).
//  - A bare mention (slots unset) counts 1, except that a host mentioned exactly once, and
//    only bare, gets `bare_slots(host)` when that returns a value (its GPU count), else 1. A
//    value below 1 counts as none; the value is lowered to the host's max_slots, if given.
//    An empty `bare_slots` is the same as one that returns nullopt.
//  - max_slots: the smallest one given for the host, if any; a host whose merged slots exceed
//    it throws InputError naming the origins. So do merged slots over 65536.

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "lib/launch/planning/host_spec.h"

namespace perseus::launch {

struct Host {
  std::string user;
  std::string host;
  int slots = 1;
  std::optional<int> max_slots;

  bool operator==(const Host &) const = default;
};

using BareSlots = std::function<std::optional<int>(const HostSpec &)>;

std::vector<Host> merge_hosts(const std::vector<HostSpec> &mentions, const BareSlots &bare_slots);

}  // namespace perseus::launch
