#include "lib/launch/launcher/host_discovery_script.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>

#include "lib/launch/errors.h"
#include "lib/launch/planning/host_discovery.h"
#include "lib/launch/planning/host_identity.h"
#include "lib/launch/system_call.h"

namespace perseus::launch {
namespace {

constexpr size_t kMaxOutput = 1u << 20;

std::string last_line(std::string text) {
  while (!text.empty() && (text.back() == '\n' || text.back() == '\r')) text.pop_back();
  const size_t start = text.rfind('\n');
  return start == std::string::npos ? text : text.substr(start + 1);
}

}  // namespace

std::vector<HostSpec> discover_hosts(const std::string &script, int timeout_ms) {
  Pipe out = make_pipe();
  Pipe err = make_pipe();
  const pid_t pid = fork();
  if (pid < 0) throw_system_error("fork", "for --host-discovery-script");
  if (pid == 0) {
    setpgid(0, 0);
    const int null = open("/dev/null", O_RDONLY);
    if (null >= 0) dup2(null, STDIN_FILENO);
    dup2(out.write_end.get(), STDOUT_FILENO);
    dup2(err.write_end.get(), STDERR_FILENO);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    execl("/bin/sh", "sh", "-c", script.c_str(), static_cast<char *>(nullptr));
    _exit(127);
  }
  setpgid(pid, pid);
  out.write_end.reset();
  err.write_end.reset();
  std::string output, errors;
  const long long deadline = monotonic_ms() + timeout_ms;
  bool out_open = true, err_open = true, timed_out = false;
  while (out_open || err_open) {
    const long long left = deadline - monotonic_ms();
    if (left <= 0) {
      timed_out = true;
      break;
    }
    pollfd fds[2] = {{out_open ? out.read_end.get() : -1, POLLIN, 0},
                     {err_open ? err.read_end.get() : -1, POLLIN, 0}};
    if (poll(fds, 2, static_cast<int>(left)) < 0 && errno != EINTR) {
      throw_system_error("poll", "--host-discovery-script");
    }
    for (int i = 0; i < 2; ++i) {
      if (!fds[i].revents) continue;
      char buffer[4096];
      const ssize_t n = retry_on_eintr([&] { return ::read(fds[i].fd, buffer, sizeof buffer); });
      std::string &into = i == 0 ? output : errors;
      if (n > 0 && into.size() < kMaxOutput) into.append(buffer, static_cast<size_t>(n));
      if (n <= 0) (i == 0 ? out_open : err_open) = false;
    }
  }
  if (timed_out) kill(-pid, SIGKILL);
  int status = 0;
  retry_on_eintr([&] { return waitpid(pid, &status, 0); });
  if (timed_out) {
    char limit[32];
    snprintf(limit, sizeof limit, "%g s", timeout_ms / 1000.0);
    throw LaunchError("--host-discovery-script " + script + " ran past " + limit +
                      " and was killed");
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    const std::string how = WIFEXITED(status)
                                ? "exited with code " + std::to_string(WEXITSTATUS(status))
                                : "was killed by signal " + std::to_string(WTERMSIG(status));
    const std::string said = last_line(errors);
    throw LaunchError("--host-discovery-script " + script + " " + how +
                      (said.empty() ? "" : " (" + said + ")") +
                      (WIFEXITED(status) && WEXITSTATUS(status) == 127 ? "; is it there?" : ""));
  }
  return unify_host_names(parse_discovered_hosts(output, script), resolve_host);
}

}  // namespace perseus::launch
