#pragma once
// The value of -H / --host: "host[:slots],..." as mpirun takes it, e.g. "localhost:8",
// "alice@node1:4,node2", "[fe80::1]:2". A bare entry is exactly 1 slot (unlike a bare hostfile
// line). Errors throw InputError whose message quotes the whole value, names the bad entry and
// says what a valid one looks like; origin of every HostSpec is "-H". The message is one line:
//   -H '<value>': <what is wrong>; <how to fix it>
// with control characters of the value shown as \xNN. Counts are 1 to 65536; an IPv6 address
// must be in brackets; whitespace inside the value is an error.

#include <string_view>
#include <vector>

#include "lib/launch/planning/host_spec.h"

namespace perseus::launch {

std::vector<HostSpec> parse_host_list(std::string_view value);

}  // namespace perseus::launch
