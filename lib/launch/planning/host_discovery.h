#pragma once
// The output of --host-discovery-script (horovodrun's elastic mode): one host a line,
// "host:slots", or "host" for one slot (the -H grammar, so "user@host:4" and "[fe80::1]:2" too);
// blank lines and lines that start with '#' are skipped. A bad line throws InputError naming
// the script, the line's number and what -H's parser found wrong with it.

#include <string>
#include <string_view>
#include <vector>

#include "lib/launch/planning/host_spec.h"

namespace perseus::launch {

std::vector<HostSpec> parse_discovered_hosts(std::string_view output, const std::string &script);

}  // namespace perseus::launch
