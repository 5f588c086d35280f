#include "lib/launch/agent/job_guard.h"

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>

#include "lib/launch/agent/job_cgroup.h"
#include "lib/launch/agent/process_tree.h"
#include "lib/launch/errors.h"
#include "lib/launch/local_host.h"

namespace perseus::launch {

namespace {

// How often a guard without a cgroup looks for the job's processes.
constexpr int kScanMs = 100;
// How long a guard waits for a killed cgroup to empty.
constexpr int kCgroupEmptyMs = 5000;
// Rounds of "stop what is known, look below it" before the SIGKILL; each round finds the
// children forked while the round before was stopping their parents.
constexpr int kStopRounds = 20;
// How long the agent waits for its guard at the end before it SIGKILLs it.
constexpr int kGuardExitMs = 10000;

bool contains(const std::vector<pid_t> &pids, pid_t pid) {
  return std::find(pids.begin(), pids.end(), pid) != pids.end();
}

// The processes a guard without a cgroup has seen below the agent: pid and start time, so that
// a pid reused after its process ended is never taken for it.
class SeenProcesses {
 public:
  void scan(pid_t agent) {
    for (auto it = seen_.begin(); it != seen_.end();) {
      it = start_time_of(it->first) == it->second ? std::next(it) : seen_.erase(it);
    }
    for (pid_t pid : descendants_of(agent, getpid())) {
      if (seen_.count(pid) != 0) continue;
      if (auto start = start_time_of(pid)) seen_.emplace(pid, *start);
    }
  }

  // Stops every seen process that still lives and everything below them, until nothing new
  // turns up (a stopped process cannot fork), then kills them all.
  void kill_all() const {
    std::vector<pid_t> known;
    for (const auto &[pid, start] : seen_) {
      if (start_time_of(pid) == start) known.push_back(pid);
    }
    for (int round = 0; round < kStopRounds && !known.empty(); ++round) {
      for (pid_t pid : known) ::kill(pid, SIGSTOP);
      std::vector<pid_t> more;
      for (pid_t pid : descendants_of_any(known)) {
        if (!contains(known, pid)) more.push_back(pid);
      }
      if (more.empty()) break;
      known.insert(known.end(), more.begin(), more.end());
    }
    for (pid_t pid : known) ::kill(pid, SIGKILL);
  }

 private:
  std::map<pid_t, unsigned long long> seen_;
};

// Closes every descriptor but stdin, stdout, stderr and `keep`; then points stdin and stdout
// at /dev/null, so that the guard holds no pipe of the launcher's or the ranks'.
void close_all_but(int keep) {
  std::vector<int> open_fds;
  if (DIR *fds = opendir("/proc/self/fd")) {
    while (dirent *entry = readdir(fds)) {
      const int fd = atoi(entry->d_name);
      if (entry->d_name[0] != '.' && fd > STDERR_FILENO && fd != keep) open_fds.push_back(fd);
    }
    closedir(fds);
  }
  for (int fd : open_fds) ::close(fd);  // includes the directory's own, already closed: EBADF
  const int null = ::open("/dev/null", O_RDWR | O_CLOEXEC);
  if (null >= 0) {
    dup2(null, STDIN_FILENO);
    dup2(null, STDOUT_FILENO);
    if (null > STDERR_FILENO) ::close(null);
  }
}

void detach() {
  setsid();
  prctl(PR_SET_NAME, "perseus-guard");
  for (int signal : {SIGINT, SIGTERM, SIGHUP, SIGPIPE, SIGQUIT}) ::signal(signal, SIG_IGN);
  ::signal(SIGCHLD, SIG_DFL);
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, nullptr);
}

// Waits until the agent's end of the lifeline closes; without a cgroup, scans meanwhile.
void wait_for_agent(int lifeline, pid_t agent, SeenProcesses *seen) {
  for (;;) {
    pollfd entry{lifeline, POLLIN, 0};
    const int ready = ::poll(&entry, 1, seen ? kScanMs : -1);
    if (ready > 0) {
      char byte = 0;
      const ssize_t n = ::read(lifeline, &byte, 1);
      if (n == 0 || (n < 0 && errno != EINTR && errno != EAGAIN)) return;
    } else if (ready < 0 && errno != EINTR) {
      return;
    }
    if (seen) seen->scan(agent);
  }
}

[[noreturn]] void run_guard(int lifeline, pid_t agent, const GuardPlan &plan,
                            const std::optional<std::string> &cgroup) {
  detach();
  close_all_but(lifeline);
  SeenProcesses seen;
  wait_for_agent(lifeline, agent, cgroup ? nullptr : &seen);
  std::string why;
  if (!cgroup) {
    seen.kill_all();
  } else if (!kill_and_remove_cgroup(*cgroup, kCgroupEmptyMs, why)) {
    fprintf(stderr, "perseusrun guard on %s: warning: %s\n", local_hostname().c_str(), why.c_str());
  }
  for (const std::string &file : plan.files) ::unlink(file.c_str());
  for (const std::string &folder : plan.folders) ::rmdir(folder.c_str());
  _exit(0);
}

}  // namespace

CgroupChoice job_cgroup_choice() {
  const char *value = getenv("PERSEUS_AGENT_CGROUP");
  if (!value || !*value) return CgroupChoice::kAuto;
  if (std::strcmp(value, "1") == 0) return CgroupChoice::kRequired;
  if (std::strcmp(value, "0") == 0) return CgroupChoice::kOff;
  throw InputError(std::string("PERSEUS_AGENT_CGROUP=") + value + " on " + local_hostname() +
                   ": expected 1 (a cgroup per job, or an error), 0 (none) or nothing (a "
                   "cgroup where possible)");
}

JobGuard::JobGuard(const GuardPlan &plan) {
  if (!plan.cgroup_name.empty()) cgroup_ = create_job_cgroup(plan.cgroup_name, cgroup_problem_);
  if (cgroup_) {
    procs_ = UniqueFd(::open((*cgroup_ + "/cgroup.procs").c_str(), O_WRONLY | O_CLOEXEC));
    if (!procs_.valid()) {
      cgroup_problem_ = "open " + *cgroup_ + "/cgroup.procs: " + std::strerror(errno);
      ::rmdir(cgroup_->c_str());
      cgroup_.reset();
    }
  }
  Pipe lifeline = make_pipe();
  const pid_t agent = getpid();
  pid_ = fork();
  if (pid_ == -1) {
    if (cgroup_) ::rmdir(cgroup_->c_str());
    throw_system_error("fork", "for the job guard");
  }
  if (pid_ == 0) run_guard(lifeline.read_end.get(), agent, plan, cgroup_);
  lifeline_ = std::move(lifeline.write_end);
}

JobGuard::~JobGuard() {
  lifeline_.reset();
  procs_.reset();
  for (int waited = 0; waited < kGuardExitMs; waited += 10) {
    const pid_t reaped = waitpid(pid_, nullptr, WNOHANG);
    if (reaped == pid_ || (reaped == -1 && errno == ECHILD)) return;  // ECHILD: reaped already
    usleep(10000);
  }
  ::kill(pid_, SIGKILL);
  waitpid(pid_, nullptr, 0);
}

}  // namespace perseus::launch
