#pragma once
// One mention of a host, as written in a hostfile line or a -H entry, before repeated mentions
// are merged (see host_merge.h).

#include <optional>
#include <string>

namespace perseus::launch {

struct HostSpec {
  std::string user;              // from "user@host"; empty means the default user
  std::string host;              // name or address; IPv6 without the brackets
  std::optional<int> slots;      // nullopt: a bare entry, slots decided when merging
  std::optional<int> max_slots;  // nullopt: no limit given
  std::string origin;            // where it was written, for messages: "file:line" or "-H"

  bool operator==(const HostSpec &) const = default;
};

}  // namespace perseus::launch
