#include "lib/launch/agent/rank_process.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <sstream>

#include "lib/launch/errors.h"

namespace perseus::launch {

namespace {

bool is_executable_file(const std::string &path) {
  struct stat info {};
  return ::stat(path.c_str(), &info) == 0 && S_ISREG(info.st_mode) &&
         ::access(path.c_str(), X_OK) == 0;
}

std::string absolute(const std::string &path, const std::string &working_directory) {
  if (!path.empty() && path[0] == '/') return path;
  return working_directory + "/" + path;
}

[[noreturn]] void throw_not_runnable(const std::string &name, const std::string &host,
                                     const std::string &where, const std::string &path) {
  if (::access(path.c_str(), F_OK) == 0) {
    throw LaunchError("cannot run '" + name + "' on " + host + ": " + path +
                          " is not an executable file; check its permissions (chmod +x)",
                      kExitCannotExecute);
  }
  throw LaunchError("cannot run '" + name + "' on " + host + ": " + where +
                        "; check the name, or give its full path",
                    kExitNotFound);
}

// Everything the child does between fork and exec: async-signal-safe calls only.
[[noreturn]] void exec_child(const RankCommand &command, char *const *argv, char *const *envp,
                             int stdin_fd, int stdout_fd, int stderr_fd, int status_fd,
                             pid_t agent) {
  // Best effort: a rank that cannot join is still tracked while the agent lives; the agent
  // checks and says so (Agent::check_in_cgroup).
  if (command.cgroup_procs_fd >= 0) (void)!write(command.cgroup_procs_fd, "0", 1);
  setpgid(0, 0);
  // The agent kills its ranks itself; this covers the agent being SIGKILLed.
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != agent) _exit(kExitLaunchFailure);
  dup2(stdin_fd, STDIN_FILENO);
  dup2(stdout_fd, STDOUT_FILENO);
  dup2(stderr_fd, STDERR_FILENO);
  for (int signal = 1; signal < NSIG; ++signal) ::signal(signal, SIG_DFL);
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, nullptr);
  int error = 0;
  if (chdir(command.working_directory.c_str()) == 0) {
    execve(command.program.c_str(), argv, envp);
  }
  error = errno;
  (void)!write(status_fd, &error, sizeof error);
  _exit(kExitCannotExecute);
}

std::vector<char *> c_strings(const std::vector<std::string> &strings) {
  std::vector<char *> pointers;
  for (const auto &s : strings) pointers.push_back(const_cast<char *>(s.c_str()));
  pointers.push_back(nullptr);
  return pointers;
}

UniqueFd open_dev_null() {
  UniqueFd fd(::open("/dev/null", O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) throw_system_error("open", "/dev/null");
  return fd;
}

}  // namespace

std::string resolve_program(const std::string &name, const std::string &path,
                            const std::string &working_directory, const std::string &host) {
  if (name.find('/') != std::string::npos) {
    const std::string full = absolute(name, working_directory);
    if (is_executable_file(full)) return full;
    throw_not_runnable(name, host, full + " does not exist", full);
  }
  std::stringstream directories(path);
  std::string first_match;
  for (std::string directory; std::getline(directories, directory, ':');) {
    const std::string candidate =
        absolute((directory.empty() ? "." : directory) + "/" + name, working_directory);
    if (is_executable_file(candidate)) return candidate;
    if (first_match.empty() && ::access(candidate.c_str(), F_OK) == 0) first_match = candidate;
  }
  throw_not_runnable(name, host, "not found in PATH=" + path,
                     first_match.empty() ? name : first_match);
}

void check_working_directory(const std::string &directory, const std::string &host) {
  if (directory.empty()) return;
  struct stat info {};
  std::string problem;
  if (::stat(directory.c_str(), &info) != 0) {
    problem =
        errno == ENOENT ? "does not exist" : std::string("cannot be read: ") + std::strerror(errno);
  } else if (!S_ISDIR(info.st_mode)) {
    problem = "is not a directory";
  } else if (::access(directory.c_str(), X_OK) != 0) {
    problem = "cannot be entered: " + std::string(std::strerror(errno));
  }
  if (problem.empty()) return;
  throw InputError("the working directory of the ranks, " + directory + ", " + problem +
                   " on host " + host + "; create it there, or give another with -wdir DIR");
}

void ensure_fd_room(size_t ranks, const std::string &host) {
  constexpr rlim_t kSpare = 64;  // the agent's own: channel, signalfd, /proc scans
  const rlim_t needed = 3 * static_cast<rlim_t>(ranks) + kSpare;
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0 || limit.rlim_cur >= needed) return;
  if (limit.rlim_max >= needed || limit.rlim_max == RLIM_INFINITY) {
    limit.rlim_cur = needed;
    if (setrlimit(RLIMIT_NOFILE, &limit) == 0) return;
  }
  throw LaunchError("host " + host + " cannot run " + std::to_string(ranks) +
                    " ranks: its agent needs 3 file descriptors per rank (" +
                    std::to_string(needed) + " in all), but the limit there is " +
                    std::to_string(limit.rlim_max) +
                    " (ulimit -Hn); run fewer ranks on it, or raise the limit");
}

RankProcess start_rank(const RankCommand &command) {
  Pipe input = command.gets_stdin ? make_pipe() : Pipe{open_dev_null(), UniqueFd()};
  Pipe output = make_pipe();
  Pipe errors = make_pipe();
  Pipe status = make_pipe();
  std::vector<char *> argv = c_strings(command.argv);
  std::vector<char *> envp = c_strings(command.environment);
  const pid_t agent = getpid();
  const pid_t pid = fork();
  if (pid == -1) throw_system_error("fork", "for " + command.program);
  if (pid == 0) {
    exec_child(command, argv.data(), envp.data(), input.read_end.get(), output.write_end.get(),
               errors.write_end.get(), status.write_end.get(), agent);
  }
  status.write_end.reset();
  int error = 0;
  const ssize_t n =
      retry_on_eintr([&] { return ::read(status.read_end.get(), &error, sizeof error); });
  if (n == static_cast<ssize_t>(sizeof error)) {
    // The child has exited; the agent's SIGCHLD handling reaps it.
    throw LaunchError("cannot run '" + command.program + "' in " + command.working_directory +
                          ": " + std::strerror(error),
                      kExitCannotExecute);
  }
  RankProcess process;
  process.pid = pid;
  process.stdin_pipe = std::move(input.write_end);
  process.stdout_pipe = std::move(output.read_end);
  process.stderr_pipe = std::move(errors.read_end);
  return process;
}

}  // namespace perseus::launch
