#pragma once
// The job guard: a small process that the agent forks before it starts the ranks and that ends
// what is left of the job on this host once the agent is gone, however it went (a normal end,
// an error, SIGKILL, the OOM killer). Ranks die with the agent (PR_SET_PDEATHSIG), but their
// children, setsid'd and double-forked daemons would be re-parented away from the dead
// subreaper and run on.
//
// The guard notices the agent's end as the end of a pipe whose only writer is the agent (its
// end is close-on-exec, so no rank holds it). Then it:
//  - with a job cgroup (job_cgroup.h; cgroup v2 and permission to create one, the default):
//    kills the cgroup, which every rank joined before exec, and removes it;
//  - without one (PERSEUS_AGENT_CGROUP=0, or the cgroup could not be made): stops and then
//    kills every process it saw below the agent in its scans, every kScanMs while the job
//    ran, with every process below those. A process started and orphaned within the last
//    scan before the agent died is missed.
//  - removes the job's temporary files (the secret file and its folder).
// The guard runs in its own session, ignores SIGINT/SIGTERM/SIGHUP, holds no descriptor of
// the agent's but its pipe and stderr, and is named perseus-guard (/proc/<pid>/comm).
//
// Threading: built and destroyed on the agent's one thread.

#include <sys/types.h>

#include <optional>
#include <string>
#include <vector>

#include "lib/launch/system_call.h"

namespace perseus::launch {

struct GuardPlan {
  std::string cgroup_name;           // "": no cgroup; else made below the agent's own cgroup
  std::vector<std::string> files;    // removed at the end, in order
  std::vector<std::string> folders;  // removed (if empty) after the files
};

class JobGuard {
 public:
  // Makes the cgroup (if asked and possible; why not is in cgroup_problem()) and forks the
  // guard. Throws LaunchError when fork fails.
  explicit JobGuard(const GuardPlan &plan);
  // Lets the guard clean up (the agent has ended every process by now) and waits for it, at
  // most a few seconds.
  ~JobGuard();
  JobGuard(const JobGuard &) = delete;
  JobGuard &operator=(const JobGuard &) = delete;

  pid_t pid() const { return pid_; }
  // The cgroup's cgroup.procs opened for writing (a rank writes "0" to join), or -1.
  int cgroup_procs_fd() const { return procs_.get(); }
  const std::optional<std::string> &cgroup() const { return cgroup_; }
  const std::string &cgroup_problem() const { return cgroup_problem_; }

 private:
  pid_t pid_ = -1;
  UniqueFd lifeline_;  // write end; its closing tells the guard that the agent has ended
  UniqueFd procs_;
  std::optional<std::string> cgroup_;
  std::string cgroup_problem_;
};

// PERSEUS_AGENT_CGROUP: unset or empty: a job cgroup where possible (kAuto); 1: a job cgroup or
// an error (kRequired); 0: none (kOff). Throws InputError naming any other value.
enum class CgroupChoice { kAuto, kRequired, kOff };
CgroupChoice job_cgroup_choice();

}  // namespace perseus::launch
