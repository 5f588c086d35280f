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
std::vector<pid_t> descendants_of(pid_t root);

// Sends `signal` to every descendant of `root`; returns how many were signalled.
int signal_descendants(pid_t root, int signal);

}  // namespace perseus::launch
