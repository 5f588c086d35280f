#pragma once
// The launcher's end of one agent: the channel it talks over, and how to end it. A local agent
// is a child process on a pair of pipes (as is one reached with the OpenSSH client, --rsh ssh);
// an agent reached with libssh2 is relayed by a thread of its own onto a socket.
//
// Start-up is in two steps, so that no command runs anywhere before every host has been
// reached and its key checked: wait_ready() for every link, then start() for every link.

#include <sys/types.h>

#include <memory>
#include <string>
#include <vector>

#include "lib/launch/protocol/frame_channel.h"
#include "lib/launch/remote/ssh_session.h"

namespace perseus::launch {

class AgentLink {
 public:
  virtual ~AgentLink() = default;
  virtual FrameChannel &channel() = 0;
  // The host as the user named it.
  virtual const std::string &host() const = 0;
  // Blocks until the host is reached, its key checked and the login done (nothing run yet).
  // Throws LaunchError naming the host and the cause, or when `deadline_ms` passes.
  virtual void wait_ready(long long deadline_ms) { (void)deadline_ms; }
  // Starts the agent on the host.
  virtual void start() {}
  // Why the link ended, when it ended badly ("" when unknown).
  virtual std::string failure() const { return ""; }
  // This machine's address as the host reaches it, and the host's address ("" when local).
  virtual std::string local_address() const { return ""; }
  virtual std::string peer_address() const { return ""; }
  // Last resort when the agent does not end by itself: ends it now, without waiting.
  virtual void kill() = 0;
  // Collects the agent's exit, waiting at most `timeout_ms`.
  virtual void reap(int timeout_ms) = 0;
};

// Starts `argv` (e.g. {"/path/perseusrun", "--agent"}, or an ssh or srun command line) in its
// own process group, with its stdin and stdout on pipes and its stderr shared with perseusrun's.
// `peer_address` is the host's address when known (a Slurm node's NodeAddr).
std::unique_ptr<AgentLink> start_process_agent(const std::vector<std::string> &argv,
                                               const std::string &host,
                                               const std::string &peer_address = "");

// Reaches `target` with libssh2 on a thread of its own and, after start(), runs `command`
// there (the agent), relaying its stdin and stdout.
std::unique_ptr<AgentLink> start_ssh_agent(const SshTarget &target, const SshSettings &settings,
                                           const std::string &command);

}  // namespace perseus::launch
