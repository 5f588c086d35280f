#pragma once
// How perseusrun reaches hosts other than this one.

#include <string>

namespace perseus::launch {

enum class RemoteShell { kLibssh2, kOpenSsh };

struct SshOptions {
  RemoteShell shell = RemoteShell::kLibssh2;  // --rsh libssh2|ssh
  std::string identity;                       // --ssh-identity FILE; tried first
  std::string user;                           // --ssh-user; "user@host" in a host list wins
  int port = 22;                              // --ssh-port
  bool accept_new = false;                    // --ssh-accept-new: trust and record unknown keys
  double connect_timeout_seconds = 10;        // --ssh-connect-timeout
  std::string remote_program;                 // --remote-perseusrun; default: this binary's path
  std::string address;                        // --addr: this machine's address for the hosts
  std::string interface;                      // --iface: take that address from an interface
};

}  // namespace perseus::launch
