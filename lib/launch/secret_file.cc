#include "lib/launch/secret_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cstdlib>
#include <vector>

#include "lib/launch/system_call.h"

namespace perseus::launch {

SecretFile::SecretFile(const std::string &job_id, const std::string &secret) {
  const char *tmp = getenv("TMPDIR");
  std::string pattern = std::string(tmp && *tmp ? tmp : "/tmp") + "/perseus-" + job_id + "-XXXXXX";
  std::vector<char> buffer(pattern.begin(), pattern.end());
  buffer.push_back('\0');
  if (!mkdtemp(buffer.data())) throw_system_error("mkdtemp", pattern + " (for the job's secret)");
  folder_ = buffer.data();  // mkdtemp makes it 0700
  path_ = folder_ + "/secret";
  UniqueFd fd(::open(path_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600));
  if (!fd.valid() || !write_all(fd.get(), secret)) {
    rmdir(folder_.c_str());
    throw_system_error("write", path_);
  }
}

SecretFile::~SecretFile() {
  unlink(path_.c_str());
  rmdir(folder_.c_str());
}

}  // namespace perseus::launch
