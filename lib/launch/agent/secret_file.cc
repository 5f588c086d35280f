#include "lib/launch/agent/secret_file.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <vector>

#include "lib/launch/system_call.h"

namespace perseus::launch {

namespace {

std::string temporary_folder() {
  const char *tmp = getenv("TMPDIR");
  return tmp && *tmp ? tmp : "/tmp";
}

// Removes the folders of this user's jobs whose agent died without cleaning up: their lock is
// free. A folder of a live job is locked and left alone.
void remove_stale_folders(const std::string &parent) {
  std::error_code error;
  for (const auto &entry : std::filesystem::directory_iterator(parent, error)) {
    const std::string name = entry.path().filename().string();
    struct stat info {};
    if (name.rfind("perseus-", 0) != 0 || lstat(entry.path().c_str(), &info) != 0 ||
        !S_ISDIR(info.st_mode) || info.st_uid != getuid()) {
      continue;
    }
    const std::string file = entry.path().string() + "/secret";
    UniqueFd fd(::open(file.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW));
    if (fd.valid() && flock(fd.get(), LOCK_EX | LOCK_NB) == 0) {
      unlink(file.c_str());
      rmdir(entry.path().c_str());
    }
  }
}

}  // namespace

SecretFile::SecretFile(const std::string &job_id, const std::string &secret) {
  remove_stale_folders(temporary_folder());
  std::string pattern = temporary_folder() + "/perseus-" + job_id + "-XXXXXX";
  std::vector<char> buffer(pattern.begin(), pattern.end());
  buffer.push_back('\0');
  if (!mkdtemp(buffer.data())) throw_system_error("mkdtemp", pattern + " (for the job's secret)");
  folder_ = buffer.data();  // mkdtemp makes it 0700
  path_ = folder_ + "/secret";
  // Written and locked under another name first, so that a sweeping agent never sees the file
  // before its lock is held.
  const std::string draft = folder_ + "/secret.new";
  UniqueFd fd(::open(draft.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600));
  if (!fd.valid() || flock(fd.get(), LOCK_EX) != 0 || !write_all(fd.get(), secret) ||
      rename(draft.c_str(), path_.c_str()) != 0) {
    const int saved = errno;
    unlink(draft.c_str());
    rmdir(folder_.c_str());
    errno = saved;
    throw_system_error("write", path_);
  }
  lock_ = std::move(fd);
}

SecretFile::~SecretFile() {
  unlink(path_.c_str());
  rmdir(folder_.c_str());
}

}  // namespace perseus::launch
