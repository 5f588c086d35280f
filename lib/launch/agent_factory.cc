#include "lib/launch/agent_factory.h"

#include <poll.h>

#include "lib/launch/errors.h"
#include "lib/launch/local_host.h"
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

std::unique_ptr<AgentLink> start_agent(const HostSpec &spec, const LaunchConfig &config) {
  if (is_local_host(spec.host)) {
    return start_process_agent({config.agent_program, "--agent"}, spec.host);
  }
  const SshOptions &ssh = config.ssh;
  const std::string program =
      ssh.remote_program.empty() ? config.agent_program : ssh.remote_program;
  const std::string command = "exec " + shell_quote(program) + " --agent";
  const std::string user = !spec.user.empty() ? spec.user : ssh.user;
  if (ssh.shell == RemoteShell::kOpenSsh) {
    return start_process_agent(openssh_command(spec, ssh, user, command), spec.host);
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

}  // namespace perseus::launch
