#pragma once
// Starting the agent of one host the way the configuration says (a local child process,
// libssh2, or the OpenSSH client), and the blocking first exchanges with it, shared by the
// launcher and by --check.

#include <memory>

#include "lib/launch/agent_link.h"
#include "lib/launch/agent_protocol.h"
#include "lib/launch/host_spec.h"
#include "lib/launch/launch_config.h"

namespace perseus::launch {

std::unique_ptr<AgentLink> start_agent(const HostSpec &spec, const LaunchConfig &config);

// The next frame from the agent, which must be of `type`. Throws LaunchError naming the host
// when the agent ends, says something else, or is silent until `deadline_ms`.
Frame receive_frame(AgentLink &link, FrameType type, long long deadline_ms);

// The agent's Hello, checked to be of this very version.
Hello receive_hello(AgentLink &link, long long deadline_ms);

}  // namespace perseus::launch
