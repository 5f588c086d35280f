#pragma once
// Starting one rank: fork and exec with its own pipes, in its own process group, with the
// signal state reset, so that the agent alone decides which signals it gets.

#include <sys/types.h>

#include <string>
#include <vector>

#include "lib/launch/system_call.h"

namespace perseus::launch {

struct RankCommand {
  std::string program;                   // resolved path (see resolve_program)
  std::vector<std::string> argv;         // argv[0] as the user wrote it
  std::vector<std::string> environment;  // "NAME=value"
  std::string working_directory;
  bool gets_stdin = false;  // false: stdin is /dev/null
  // The job cgroup's cgroup.procs, open for writing (job_guard.h): the rank joins it before
  // exec, so that everything it starts is in it too. -1: none.
  int cgroup_procs_fd = -1;
};

struct RankProcess {
  pid_t pid = -1;
  UniqueFd stdin_pipe;  // invalid unless gets_stdin
  UniqueFd stdout_pipe;
  UniqueFd stderr_pipe;
};

// Finds `name` the way execvp would, but in the rank's PATH and relative to its working
// directory. Throws LaunchError with kExitNotFound or kExitCannotExecute naming the program,
// the host and the PATH searched.
std::string resolve_program(const std::string &name, const std::string &path,
                            const std::string &working_directory, const std::string &host);

// Throws InputError when `directory` (not empty) is not a directory the agent can enter on
// `host`, naming both, before any rank starts.
void check_working_directory(const std::string &directory, const std::string &host);

// The agent holds up to 3 pipes per rank and polls them all: raises the soft limit of open
// files toward the hard one as far as `ranks` need; throws LaunchError naming the host, the
// numbers and the fix when the hard limit is too low.
void ensure_fd_room(size_t ranks, const std::string &host);

// Starts the process. Throws LaunchError naming the program when fork or exec fails (exec's
// failure is reported through a close-on-exec pipe, so it is never mistaken for the program's
// own exit code).
RankProcess start_rank(const RankCommand &command);

}  // namespace perseus::launch
