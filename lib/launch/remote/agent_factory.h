#pragma once
// Starting the agent of one host the way the configuration says (a local child process,
// libssh2, or the OpenSSH client), and the blocking first exchanges with it, shared by the
// launcher and by --check.

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "lib/launch/agent/host_check.h"
#include "lib/launch/launch_config.h"
#include "lib/launch/planning/host_spec.h"
#include "lib/launch/protocol/agent_protocol.h"
#include "lib/launch/remote/agent_link.h"

namespace perseus::launch {

// `node_address`: the host's address when Slurm knows it (a node reached through srun).
std::unique_ptr<AgentLink> start_agent(const HostSpec &spec, const LaunchConfig &config,
                                       const std::string &node_address = "");

// Whether the host's agent starts through srun (--launch-agent, or a Slurm allocation's host).
bool through_srun(const HostSpec &spec, const LaunchConfig &config);

// The next frame from the agent, which must be of `type`. Throws LaunchError naming the host
// when the agent ends, says something else, or is silent until `deadline_ms`.
Frame receive_frame(AgentLink &link, FrameType type, long long deadline_ms);

// The agent's Hello, checked to be of this very version.
Hello receive_hello(AgentLink &link, long long deadline_ms);

// How long a started agent may take to answer: its Hello, a check report.
inline constexpr int kAgentAnswerMs = 30000;

// The check exchange with a started agent (the launcher's preflight and --check), in two halves
// so that every host checks at once: send_check queues the request; check_report sends it and
// waits for the agent's report, throwing LaunchError naming the host when the agent ends or is
// silent until `deadline_ms`.
void send_check(AgentLink &link, const CheckRequest &request);
CheckReport check_report(AgentLink &link, long long deadline_ms);

// One host's agent as reach_agents leaves it: started, with its Hello; or, with
// Failures::kRecord, the reason it could not be reached (`error`, without the host's name).
struct ReachedAgent {
  HostSpec spec;
  std::unique_ptr<AgentLink> link;
  std::optional<Hello> hello;
  std::string error;
};

enum class Failures { kThrow, kRecord };

// The launcher's and --check's first step: the agent of every distinct host of `mentions`
// (user@host, in order of first mention) is started at once; every host is reached and its
// key checked before any agent is told to start (so nothing runs anywhere while a host is still
// unreachable); then each one's Hello is read. kThrow: the first failure throws (LaunchError
// naming the host); kRecord: each failure stays in its host's entry and the others go on.
std::vector<ReachedAgent> reach_agents(const std::vector<HostSpec> &mentions,
                                       const LaunchConfig &config, Failures failures);

}  // namespace perseus::launch
