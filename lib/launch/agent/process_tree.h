#pragma once
// The processes of a job on one host are the agent's descendants: the agent is a child
// subreaper (PR_SET_CHILD_SUBREAPER), so a rank's child that calls setsid() or double-forks is
// re-parented to the agent, not to init, and stays findable here. Nothing is ever found or
// killed by name.

#include <sys/types.h>

#include <optional>
#include <string_view>
#include <vector>

namespace perseus::launch {

// The parent pid in the text of /proc/<pid>/stat; nullopt if the text is malformed. The
// command name in parentheses may itself contain spaces and parentheses.
std::optional<pid_t> parse_stat_parent(std::string_view stat);

// Every live process below `root` in the process tree (not `root` itself), read from /proc.
// `skip` (if not 0) and its own descendants are left out: the agent's job guard is its child
// but not part of the job.
std::vector<pid_t> descendants_of(pid_t root, pid_t skip = 0);

// Every live process below any of `roots` (not the roots themselves), from one read of /proc.
std::vector<pid_t> descendants_of_any(const std::vector<pid_t> &roots);

// The start time (field 22 of /proc/<pid>/stat, in clock ticks since boot); nullopt if the
// text is malformed. With the pid it names one process for good: a pid can be reused, the pair
// cannot.
std::optional<unsigned long long> parse_stat_start_time(std::string_view stat);

// The start time of a live, non-zombie process; nullopt when there is none with that pid.
std::optional<unsigned long long> start_time_of(pid_t pid);

// Sends `signal` to every descendant of `root` (but `skip` and its subtree); returns how many
// were signalled.
int signal_descendants(pid_t root, int signal, pid_t skip = 0);

}  // namespace perseus::launch
