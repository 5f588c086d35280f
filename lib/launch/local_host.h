#pragma once
// Facts about the machine perseusrun runs on.

#include <string>

namespace perseus::launch {

// True for "localhost", loopback addresses, this machine's hostname and any address of its
// network interfaces: such hosts get a local agent, not an SSH session.
bool is_local_host(const std::string &host);

std::string local_hostname();

// The first IPv4 address (else IPv6) of network interface `name`; "" if it has none.
std::string interface_address(const std::string &name);

// The source address this machine would use to reach `host` (a UDP "connect", which sends
// nothing); "" when there is no route or the name does not resolve.
std::string route_source_address(const std::string &host);

// A TCP port that is free on this host now (bound to port 0 and released, as torchrun does).
int free_tcp_port();

// The user perseusrun runs as, and that user's home (for ~/.ssh).
std::string current_user();
std::string home_directory();

// CPUs this process may run on (its affinity mask), at least 1.
int usable_cpu_count();

}  // namespace perseus::launch
