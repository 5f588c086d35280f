#include "lib/launch/remote/agent_factory.h"

#include <poll.h>

#include <spdlog/spdlog.h>

#include <algorithm>
#include <map>

#include "lib/launch/errors.h"
#include "lib/launch/local_host.h"
#include "lib/launch/planning/job_plan.h"
#include "lib/launch/planning/slurm_hostlist.h"
#include "lib/launch/remote/slurm_nodes.h"
#include "lib/launch/shell_quote.h"
#include "perseus/config.h"

namespace perseus::launch {

namespace {

std::vector<std::string> openssh_command(const HostSpec &spec, const SshOptions &ssh,
                                         const std::string &user, const std::string &command) {
  std::vector<std::string> argv{
      "ssh",
      "-o",
      "BatchMode=yes",
      "-o",
      "ConnectTimeout=" + std::to_string(static_cast<int>(ssh.connect_timeout_seconds)),
      "-o",
      "ServerAliveInterval=10",
      "-p",
      std::to_string(ssh.port)};
  if (!ssh.identity.empty()) argv.insert(argv.end(), {"-i", ssh.identity});
  if (ssh.accept_new) argv.insert(argv.end(), {"-o", "StrictHostKeyChecking=accept-new"});
  if (!user.empty()) argv.insert(argv.end(), {"-l", user});
  argv.insert(argv.end(), {spec.host, "--", command});
  return argv;
}

}  // namespace

bool through_srun(const HostSpec &spec, const LaunchConfig &config) {
  switch (config.ssh.launch_agent) {
    case AgentLaunch::kSrun:
      return true;
    case AgentLaunch::kSsh:
      return false;
    case AgentLaunch::kAuto:
      break;
  }
  return spec.origin == kSlurmAllocationOrigin;
}

std::unique_ptr<AgentLink> start_agent(const HostSpec &spec, const LaunchConfig &config,
                                       const std::string &node_address) {
  if (is_local_host(spec.host)) {
    return start_process_agent({config.agent_program, "--agent"}, spec.host);
  }
  const SshOptions &ssh = config.ssh;
  const std::string program =
      ssh.remote_program.empty() ? config.agent_program : ssh.remote_program;
  if (through_srun(spec, config)) {
    return start_process_agent(srun_agent_command(spec.host, program), spec.host, node_address);
  }
  const std::string command = "exec " + shell_quote(program) + " --agent";
  const std::string user = !spec.user.empty() ? spec.user : ssh.user;
  if (ssh.shell == RemoteShell::kOpenSsh) {
    return start_process_agent(openssh_command(spec, ssh, user, command), spec.host);
  }
  if (ssh.shell == RemoteShell::kProgram) {
    // As mpirun runs its rsh agent: PROGRAM [ARGS] HOST COMMAND (Kubeflow's kubexec.sh, a
    // wrapper of the user's). The user of user@host is the program's business.
    std::vector<std::string> argv = ssh.rsh_program;
    argv.insert(argv.end(), {spec.host, command});
    return start_process_agent(argv, spec.host);
  }
  const SshTarget target{spec.host, user.empty() ? current_user() : user, ssh.port};
  const SshSettings settings{ssh.identity, home_directory(), ssh.accept_new,
                             static_cast<int>(ssh.connect_timeout_seconds * 1000)};
  return start_ssh_agent(target, settings, command);
}

Frame receive_frame(AgentLink &link, FrameType type, long long deadline_ms) {
  std::vector<Frame> frames;
  while (frames.empty()) {
    const long long left = deadline_ms - monotonic_ms();
    pollfd fd{link.channel().read_fd(), POLLIN, 0};
    if (left <= 0 || retry_on_eintr([&] { return poll(&fd, 1, static_cast<int>(left)); }) == 0) {
      throw LaunchError("the agent on " + link.host() + " did not answer in time");
    }
    if (!link.channel().read_available(frames)) {
      link.reap(2000);
      const std::string why = link.failure();
      throw LaunchError(why.empty() ? "the agent on " + link.host() + " ended unexpectedly" : why);
    }
  }
  if (frames.front().type == FrameType::kError) {
    throw LaunchError(decode_error(frames.front().payload, link.channel().peer()).message);
  }
  if (frames.front().type != type) {
    throw LaunchError("the agent on " + link.host() + " sent an unexpected message; is the " +
                      "same perseusrun version installed on every host?");
  }
  return frames.front();
}

Hello receive_hello(AgentLink &link, long long deadline_ms) {
  const Frame frame = receive_frame(link, FrameType::kHello, deadline_ms);
  Hello hello = decode_hello(frame.payload, link.channel().peer());
  if (hello.version != PERSEUS_VERSION || hello.protocol != kProtocolVersion) {
    throw LaunchError("the agent on " + link.host() + " runs perseusrun " + hello.version +
                      ", this is " + PERSEUS_VERSION + "; install the same version on every host");
  }
  return hello;
}

void send_check(AgentLink &link, const CheckRequest &request) {
  link.channel().send(FrameType::kCheck, encode(request));
}

CheckReport check_report(AgentLink &link, long long deadline_ms) {
  link.channel().flush_until(deadline_ms);  // a peer gone or silent: receive_frame says which
  return decode_check_report(receive_frame(link, FrameType::kCheckReport, deadline_ms).payload,
                             link.channel().peer());
}

std::vector<ReachedAgent> reach_agents(const std::vector<HostSpec> &mentions,
                                       const LaunchConfig &config, Failures failures) {
  std::vector<ReachedAgent> agents;
  std::vector<std::string> srun_nodes;
  for (const HostSpec &spec : mentions) {
    if (!is_local_host(spec.host) && through_srun(spec, config)) srun_nodes.push_back(spec.host);
  }
  const std::map<std::string, std::string> node_addresses = slurm_node_addresses(srun_nodes);
  for (const HostSpec &spec : mentions) {
    const std::string key = host_key(spec.user, spec.host);
    if (std::any_of(agents.begin(), agents.end(), [&](const ReachedAgent &a) {
          return host_key(a.spec.user, a.spec.host) == key;
        })) {
      continue;
    }
    const auto address = node_addresses.find(spec.host);
    agents.push_back(ReachedAgent{
        spec, start_agent(spec, config, address == node_addresses.end() ? "" : address->second),
        std::nullopt, ""});
    spdlog::debug("started the agent for {}", key);
  }
  // Runs one step for every agent still in the running; a failure throws or is recorded.
  const auto each = [&](auto step) {
    for (ReachedAgent &agent : agents) {
      if (!agent.error.empty()) continue;
      try {
        step(agent);
      } catch (const std::exception &error) {
        if (failures == Failures::kThrow) throw;
        agent.error = without_host_prefix(error.what(), agent.spec.host);
      }
    }
  };
  const long long ready_by =
      monotonic_ms() + static_cast<long long>(config.ssh.connect_timeout_seconds * 1000) + 5000;
  each([&](ReachedAgent &agent) { agent.link->wait_ready(ready_by); });
  each([&](ReachedAgent &agent) { agent.link->start(); });
  const long long hello_by = monotonic_ms() + kAgentAnswerMs;
  each([&](ReachedAgent &agent) {
    agent.hello = receive_hello(*agent.link, hello_by);
    spdlog::debug(
        "agent on {}: hostname {}, {} cores, {} GPUs, CUDA_VISIBLE_DEVICES {}", agent.link->host(),
        agent.hello->hostname, agent.hello->cpu_count,
        agent.hello->gpu_count ? std::to_string(*agent.hello->gpu_count) : "unknown (no driver)",
        agent.hello->cuda_visible_devices.value_or("unset"));
  });
  return agents;
}

}  // namespace perseus::launch
