#pragma once
// Which host names are one machine. mpirun runs one daemon per machine whatever it is called;
// perseusrun does the same: names that are this machine (localhost, 127.0.0.1, ::1, its
// hostname and addresses), or that resolve to a common address, are one host with one agent,
// one node rank and local ranks counted across all their mentions.
//
// The hostfile and -H parsers stay pure; this is the one place where names are resolved, behind
// `ResolveHost`, which the tests replace.

#include <functional>
#include <string>
#include <vector>

#include "lib/launch/planning/host_spec.h"

namespace perseus::launch {

struct HostAddresses {
  bool this_machine = false;           // the name is this machine
  std::vector<std::string> addresses;  // numeric addresses; empty when it does not resolve
};

using ResolveHost = std::function<HostAddresses(const std::string &host)>;

// This machine's answer: is_local_host() of the name or of any address getaddrinfo gives it.
HostAddresses resolve_host(const std::string &host);

// `mentions` with every host name replaced by the first-mentioned name of its machine, so that
// the rest of perseusrun (host_merge, agents, placement) sees one host. The user part is kept:
// alice@a and bob@a stay apart. Each distinct name is resolved once.
std::vector<HostSpec> unify_host_names(std::vector<HostSpec> mentions, const ResolveHost &resolve);

}  // namespace perseus::launch
