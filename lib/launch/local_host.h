#pragma once
// Facts about the machine perseusrun runs on.

#include <string>

namespace perseus::launch {

// True for "localhost", loopback addresses, this machine's hostname and any address of its
// network interfaces: such hosts get a local agent, not an SSH session.
bool is_local_host(const std::string &host);

std::string local_hostname();

// CPUs this process may run on (its affinity mask), at least 1.
int usable_cpu_count();

}  // namespace perseus::launch
