#pragma once
// How perseusrun reaches hosts other than this one.

#include <string>
#include <vector>

namespace perseus::launch {

// --rsh: libssh2 (built in), ssh (the OpenSSH client), or a program of the user's that takes
// HOST COMMAND as mpirun's rsh agents do (Kubeflow's kubexec.sh); OMPI_MCA_plm_rsh_agent sets
// it when --rsh is not given.
enum class RemoteShell { kLibssh2, kOpenSsh, kProgram };

// --launch-agent: how the agents of other hosts start. kAuto: through srun for the hosts of a
// Slurm allocation that perseusrun took its hosts from, else by the remote shell.
enum class AgentLaunch { kAuto, kSsh, kSrun };

struct SshOptions {
  RemoteShell shell = RemoteShell::kLibssh2;      // --rsh libssh2|ssh|PROGRAM
  std::vector<std::string> rsh_program;           // kProgram: its words, before HOST COMMAND
  std::string rsh_origin;                         // where the program came from, for messages
  AgentLaunch launch_agent = AgentLaunch::kAuto;  // --launch-agent
  std::string identity;                           // --ssh-identity FILE; tried first
  std::string user;                               // --ssh-user; "user@host" in a host list wins
  int port = 22;                                  // --ssh-port
  bool accept_new = false;                        // --ssh-accept-new: trust and record unknown keys
  double connect_timeout_seconds = 10;            // --ssh-connect-timeout
  std::string remote_program;  // --remote-perseusrun; default: this binary's path
  std::string address;         // --addr: this machine's address for the hosts
  std::string interface;       // --iface: take that address from an interface
};

}  // namespace perseus::launch
