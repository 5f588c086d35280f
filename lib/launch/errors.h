#pragma once
// The two kinds of failure in lib/launch (docs/ERRORS.md has the table of exit codes):
//  - InputError: the user's input is wrong (a flag, a hostfile, an environment value). Nothing
//    has been started; the caller prints the message and exits with kExitUsage. The message
//    names the value, where it came from and how to fix it.
//  - LaunchError: the input was fine but the job could not be run (a spawn failed, an agent
//    died, a port is taken). Whatever was started has been ended before it is thrown; the
//    caller prints the message and exits with kExitLaunchFailure.
// Bugs are neither: they are assertions.

#include <stdexcept>
#include <string>

namespace perseus::launch {

inline constexpr int kExitSuccess = 0;
inline constexpr int kExitLaunchFailure = 1;
inline constexpr int kExitUsage = 2;
inline constexpr int kExitTimeout = 124;
inline constexpr int kExitCannotExecute = 126;
inline constexpr int kExitNotFound = 127;

class InputError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class LaunchError : public std::runtime_error {
 public:
  explicit LaunchError(const std::string &what, int exit_code = kExitLaunchFailure)
      : std::runtime_error(what), exit_code_(exit_code) {}
  int exit_code() const { return exit_code_; }

 private:
  int exit_code_;
};

// `text` without a leading "host HOST: ", for messages that name the host already (errors of
// an SSH session or agent link start with it).
inline std::string without_host_prefix(const std::string &text, const std::string &host) {
  const std::string prefix = "host " + host + ": ";
  return text.compare(0, prefix.size(), prefix) == 0 ? text.substr(prefix.size()) : text;
}

}  // namespace perseus::launch
