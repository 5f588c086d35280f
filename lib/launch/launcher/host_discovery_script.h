#pragma once
// Runs --host-discovery-script (horovodrun's elastic mode) and reads the hosts it prints
// (planning/host_discovery.h). The script runs through /bin/sh -c, in its own process group,
// with stdin from /dev/null; it gets kDiscoveryTimeoutMs, then it and its children are killed.

#include <string>
#include <vector>

#include "lib/launch/planning/host_spec.h"

namespace perseus::launch {

inline constexpr int kDiscoveryTimeoutMs = 10000;

// The hosts the script prints, with the names of one machine unified as in -H. Throws
// LaunchError when it cannot be run, exits non-zero (naming its code and the last line of its
// stderr) or runs past the timeout, and InputError for a line it printed that is no host.
std::vector<HostSpec> discover_hosts(const std::string &script,
                                     int timeout_ms = kDiscoveryTimeoutMs);

}  // namespace perseus::launch
