#pragma once
// The job's cgroup on one host (cgroup v2 only): a child of the agent's own cgroup that every
// rank joins before it execs, so that every process the ranks ever start (children, setsid'd
// and double-forked daemons) stays in it, whoever its parent becomes. Killing the cgroup ends
// them all at once; the job guard (job_guard.h) does that when the agent dies.
//
// Inside the agent's cgroup, so the job keeps the limits the agent runs under (a batch
// system's job cgroup, a systemd slice). No controllers are enabled: it only groups.

#include <sys/types.h>

#include <optional>
#include <string>
#include <string_view>

namespace perseus::launch {

// The mount point of the cgroup v2 hierarchy and the path below it that the mount shows, from
// the text of /proc/self/mountinfo ("/sys/fs/cgroup" and "/" on a plain v2 system;
// "/sys/fs/cgroup/unified" on a hybrid one). Octal escapes (\040) are decoded.
struct CgroupMount {
  std::string mount_point;
  std::string root;
};
std::optional<CgroupMount> parse_cgroup2_mount(std::string_view mountinfo);

// The v2 cgroup of a process from the text of /proc/<pid>/cgroup (the "0::<path>" line).
std::optional<std::string> parse_unified_cgroup(std::string_view proc_cgroup);

// The folder of `cgroup` (a path as /proc/<pid>/cgroup shows it) under `mount`; nullopt when
// the mount does not show it.
std::optional<std::string> cgroup_folder(const CgroupMount &mount, const std::string &cgroup);

// Creates <the agent's cgroup>/<name>. Returns its folder, or nullopt with `why` saying what
// was missing or failed (no cgroup v2, read-only, not permitted).
std::optional<std::string> create_job_cgroup(const std::string &name, std::string &why);

// Whether process `pid` is in the cgroup at `folder`.
bool in_cgroup(pid_t pid, const std::string &folder);

// SIGKILLs every process in the cgroup at `folder` (cgroup.kill, or one by one from
// cgroup.procs on kernels before 5.14), waits up to `timeout_ms` for it to empty and removes
// it. False, with `why`, when it could not be removed.
bool kill_and_remove_cgroup(const std::string &folder, int timeout_ms, std::string &why);

}  // namespace perseus::launch
