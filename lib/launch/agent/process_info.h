#pragma once
// What /proc says about a process, for messages that name it: "pid 1234 (python train.py,
// user alice)". Processes that are gone or hidden (another PID namespace, hidepid) give
// empty answers, never errors.

#include <sys/types.h>

#include <string>

namespace perseus::launch {

// The whole of a small file such as /proc/<pid>/cmdline; "" when unreadable.
std::string read_proc_file(const std::string &path);

// The user name of `uid`, or the number when it has none.
std::string user_name(uid_t uid);

// The owner of /proc/<pid>; "" when the process cannot be seen.
std::string process_user(int pid);

// The command line on one line: NULs and other control characters become spaces, at most
// kMaxCommand bytes (cut between UTF-8 sequences, ending in "..."); "[name]" from
// /proc/<pid>/comm when the command line is empty; "" when the process cannot be seen.
inline constexpr size_t kMaxCommand = 200;
std::string process_command(int pid);

}  // namespace perseus::launch
