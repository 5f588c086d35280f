#pragma once
// The launcher's end of one agent: the channel it talks over, and how to end it. A local agent
// is a child process on a pair of pipes; remote agents (over SSH) come in through the same
// interface.

#include <sys/types.h>

#include <memory>
#include <string>

#include "lib/launch/frame_channel.h"

namespace perseus::launch {

class AgentLink {
 public:
  virtual ~AgentLink() = default;
  virtual FrameChannel &channel() = 0;
  // The host as the user named it.
  virtual const std::string &host() const = 0;
  // Last resort when the agent does not end by itself: ends it now, without waiting.
  virtual void kill() = 0;
  // Collects the agent's exit, waiting at most `timeout_ms`.
  virtual void reap(int timeout_ms) = 0;
};

// Starts `program --agent` on this machine in its own process group, with its stdin and stdout
// on pipes and its stderr shared with perseusrun's.
std::unique_ptr<AgentLink> start_local_agent(const std::string &program, const std::string &host);

}  // namespace perseus::launch
