#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <condition_variable>
#include <mutex>
#include <thread>

#include "lib/launch/errors.h"
#include "lib/launch/remote/agent_link.h"

namespace perseus::launch {

namespace {

UniqueFd duplicate(int fd) {
  UniqueFd copy(fcntl(fd, F_DUPFD_CLOEXEC, 3));
  if (!copy.valid()) throw_system_error("dup", "of an SSH relay socket");
  return copy;
}

// The thread owns the SshSession; the launcher's thread sees only the socket and the state
// below, guarded by mutex_.
class SshAgentLink : public AgentLink {
 public:
  SshAgentLink(const SshTarget &target, const SshSettings &settings, std::string command,
               UniqueFd launcher_in, UniqueFd launcher_out, UniqueFd thread_end)
      : target_(target),
        command_(std::move(command)),
        channel_(std::move(launcher_in), std::move(launcher_out), "agent on " + target.host),
        thread_([this, settings, end = std::move(thread_end)]() mutable {
          run(settings, std::move(end));
        }) {}

  ~SshAgentLink() override {
    kill();
    thread_.join();
  }

  FrameChannel &channel() override { return channel_; }
  const std::string &host() const override { return target_.host; }

  void wait_ready(long long deadline_ms) override {
    std::unique_lock lock(mutex_);
    const auto left = std::chrono::milliseconds(std::max(0LL, deadline_ms - monotonic_ms()));
    if (!changed_.wait_for(lock, left, [&] { return state_ != State::kConnecting; })) {
      throw LaunchError("host " + target_.host + ": no SSH login within the connect timeout");
    }
    if (state_ == State::kFailed) throw LaunchError(failure_);
  }

  void start() override {
    std::lock_guard lock(mutex_);
    go_ = true;
    changed_.notify_all();
  }

  std::string failure() const override {
    std::lock_guard lock(mutex_);
    return failure_;
  }
  std::string local_address() const override {
    std::lock_guard lock(mutex_);
    return local_address_;
  }
  std::string peer_address() const override {
    std::lock_guard lock(mutex_);
    return peer_address_;
  }

  void kill() override {
    stop_ = true;
    // Wakes the relay at once: its side of the socket ends.
    shutdown(channel_.read_fd(), SHUT_RDWR);
    std::lock_guard lock(mutex_);
    changed_.notify_all();
  }

  void reap(int timeout_ms) override {
    std::unique_lock lock(mutex_);
    changed_.wait_for(lock, std::chrono::milliseconds(timeout_ms),
                      [&] { return state_ == State::kEnded || state_ == State::kFailed; });
  }

 private:
  enum class State { kConnecting, kReady, kFailed, kEnded };

  void run(const SshSettings &settings, UniqueFd end) {
    try {
      SshSession session(target_, settings);
      {
        std::unique_lock lock(mutex_);
        local_address_ = session.local_address();
        peer_address_ = session.peer_address();
        set_state(State::kReady);
        changed_.wait(lock, [&] { return go_ || stop_; });
      }
      if (stop_) return finish(State::kEnded, "");
      const std::string how = session.relay(command_, end.get(), STDERR_FILENO, stop_);
      finish(State::kEnded, how.empty() ? "" : "host " + target_.host + ": " + how);
    } catch (const std::exception &error) {
      finish(State::kFailed, error.what());
    }
  }

  void set_state(State state) {
    state_ = state;
    changed_.notify_all();
  }

  void finish(State state, const std::string &failure) {
    std::lock_guard lock(mutex_);
    failure_ = failure;
    set_state(state);
  }

  const SshTarget target_;
  const std::string command_;
  FrameChannel channel_;
  std::atomic<bool> stop_{false};
  mutable std::mutex mutex_;
  std::condition_variable changed_;
  State state_ = State::kConnecting;
  bool go_ = false;
  std::string failure_;
  std::string local_address_;
  std::string peer_address_;
  std::thread thread_;  // last: starts once everything above exists
};

}  // namespace

std::unique_ptr<AgentLink> start_ssh_agent(const SshTarget &target, const SshSettings &settings,
                                           const std::string &command) {
  ssh_library_init();
  int ends[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, ends) != 0) {
    throw_system_error("socketpair", "for the SSH relay of " + target.host);
  }
  UniqueFd launcher_end(ends[0]);
  UniqueFd launcher_copy = duplicate(launcher_end.get());
  return std::make_unique<SshAgentLink>(target, settings, command, std::move(launcher_end),
                                        std::move(launcher_copy), UniqueFd(ends[1]));
}

}  // namespace perseus::launch
