#pragma once
// Which of this host's addresses the others can reach it on.

#include <string>

namespace perseus::comm {

// The local address this host uses to reach host:port (the job's rendezvous store), as text.
// Found with a UDP connect, which sends nothing but makes the kernel pick the route and the
// source address; getsockname then reads it. That is the interface the launcher's host is
// reachable through, and so, on the usual one-network cluster, the one the other ranks can
// reach this rank through too: on one host it is loopback, across hosts the cluster network.
// Throws Error(kRendezvous) naming the call that failed.
std::string address_toward(const std::string &host, int port);

}  // namespace perseus::comm
