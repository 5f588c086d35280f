#pragma once
// The job's rendezvous secret on one host: a file readable by its owner only (0600), in a
// folder of its own (0700) under $TMPDIR or /tmp, so that the secret is never on a command line
// or in an environment variable that other users could read. Removed on destruction.
//
// An agent that is SIGKILLed cannot remove its file, so every SecretFile holds an flock on it
// while it lives, and a new one first removes this user's folders whose lock nobody holds.

#include <string>

#include "lib/launch/system_call.h"

namespace perseus::launch {

class SecretFile {
 public:
  // Throws LaunchError naming the folder when it cannot be made.
  SecretFile(const std::string &job_id, const std::string &secret);
  ~SecretFile();
  SecretFile(const SecretFile &) = delete;
  SecretFile &operator=(const SecretFile &) = delete;

  const std::string &path() const { return path_; }
  const std::string &folder() const { return folder_; }

 private:
  std::string folder_;
  std::string path_;
  UniqueFd lock_;  // open on the file, flock()ed for as long as the job runs
};

}  // namespace perseus::launch
