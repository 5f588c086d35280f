#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include "lib/launch/errors.h"
#include "lib/launch/remote/agent_link.h"

namespace perseus::launch {

namespace {

class ProcessAgentLink : public AgentLink {
 public:
  ProcessAgentLink(pid_t pid, FrameChannel channel, std::string host, std::string peer_address,
                   std::string program)
      : pid_(pid),
        channel_(std::move(channel)),
        host_(std::move(host)),
        peer_address_(std::move(peer_address)),
        program_(std::move(program)) {}
  ~ProcessAgentLink() override {
    if (pid_ > 0) {
      kill();
      reap(1000);
    }
  }

  FrameChannel &channel() override { return channel_; }
  const std::string &host() const override { return host_; }
  std::string peer_address() const override { return peer_address_; }
  // How the child ended, once reaped: an ssh, srun or remote-shell program that could not
  // reach the host exits non-zero (its own message is already on perseusrun's stderr).
  // Asked once the channel has closed without the agent's "done", so every case is a failure;
  // each is named, so that an agent that ends oddly says how.
  std::string failure() const override {
    if (!reaped_) {
      return "the agent on " + host_ + " closed its connection, and its process ('" + program_ +
             "') had not exited a few seconds later";
    }
    if (WIFEXITED(status_) && WEXITSTATUS(status_) == 0) {
      return "the agent on " + host_ + " ended: '" + program_ +
             "' exited with code 0 before saying it was done";
    }
    const std::string how = WIFEXITED(status_)
                                ? "exited with code " + std::to_string(WEXITSTATUS(status_))
                                : "was killed by signal " + std::to_string(WTERMSIG(status_));
    if (WIFEXITED(status_) && WEXITSTATUS(status_) == kExitCannotExecute) {
      return "the agent on " + host_ + " could not be started: '" + program_ +
             "' exited with code 126: it could not be run here (not installed, or not on "
             "PATH), or what it ran on the host could not be";
    }
    return "the agent on " + host_ + " ended: '" + program_ + "' " + how +
           " (its own message, if any, is above)";
  }
  void kill() override {
    if (pid_ > 0) ::kill(pid_, SIGKILL);
  }
  void reap(int timeout_ms) override {
    for (int waited = 0; pid_ > 0; waited += 10) {
      const pid_t done = waitpid(pid_, &status_, WNOHANG);
      if (done != 0) {
        reaped_ = done == pid_;
        pid_ = -1;
      } else if (waited >= timeout_ms) {
        return;
      } else {
        usleep(10000);
      }
    }
  }

 private:
  pid_t pid_;
  FrameChannel channel_;
  std::string host_;
  std::string peer_address_;
  std::string program_;
  int status_ = 0;
  bool reaped_ = false;
};

}  // namespace

std::unique_ptr<AgentLink> start_process_agent(const std::vector<std::string> &argv,
                                               const std::string &host,
                                               const std::string &peer_address) {
  std::vector<char *> args;
  for (const std::string &arg : argv) args.push_back(const_cast<char *>(arg.c_str()));
  args.push_back(nullptr);
  Pipe to_agent = make_pipe();
  Pipe from_agent = make_pipe();
  const pid_t pid = fork();
  if (pid == -1) throw_system_error("fork", "for the agent of " + host);
  if (pid == 0) {
    // Its own process group: a Ctrl-C on the terminal reaches perseusrun alone, which then
    // ends the job in order.
    setpgid(0, 0);
    dup2(to_agent.read_end.get(), STDIN_FILENO);
    dup2(from_agent.write_end.get(), STDOUT_FILENO);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    for (int signal : {SIGPIPE, SIGINT, SIGTERM, SIGHUP, SIGCHLD}) ::signal(signal, SIG_DFL);
    execvp(args[0], args.data());
    _exit(kExitCannotExecute);
  }
  return std::make_unique<ProcessAgentLink>(
      pid,
      FrameChannel(std::move(from_agent.read_end), std::move(to_agent.write_end),
                   "agent on " + host),
      host, peer_address, argv.empty() ? "" : argv[0]);
}

}  // namespace perseus::launch
