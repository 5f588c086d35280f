#include "lib/launch/agent/job_cgroup.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstring>
#include <fstream>
#include <sstream>
#include <vector>

#include "lib/launch/system_call.h"

namespace perseus::launch {

namespace {

constexpr int kPollMs = 10;

std::vector<std::string_view> split(std::string_view text, char separator) {
  std::vector<std::string_view> parts;
  for (size_t start = 0;;) {
    const size_t end = text.find(separator, start);
    parts.push_back(text.substr(start, end == std::string_view::npos ? end : end - start));
    if (end == std::string_view::npos) return parts;
    start = end + 1;
  }
}

// mountinfo writes space, tab, newline and backslash as \ooo.
std::string unescape(std::string_view field) {
  std::string out;
  for (size_t i = 0; i < field.size(); ++i) {
    int value = 0;
    if (field[i] == '\\' && i + 3 < field.size() &&
        std::from_chars(field.data() + i + 1, field.data() + i + 4, value, 8).ptr ==
            field.data() + i + 4) {
      out += static_cast<char>(value);
      i += 3;
    } else {
      out += field[i];
    }
  }
  return out;
}

std::string read_text(const std::string &path) {
  std::ifstream file(path);
  std::stringstream text;
  text << file.rdbuf();
  return text.str();
}

bool write_text(const std::string &path, std::string_view text) {
  UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CLOEXEC));
  return fd.valid() && retry_on_eintr([&] {
                         return ::write(fd.get(), text.data(), text.size());
                       }) == static_cast<ssize_t>(text.size());
}

std::vector<pid_t> cgroup_pids(const std::string &folder) {
  std::vector<pid_t> pids;
  std::stringstream lines(read_text(folder + "/cgroup.procs"));
  for (pid_t pid = 0; lines >> pid;) pids.push_back(pid);
  return pids;
}

void kill_members(const std::string &folder) {
  if (write_text(folder + "/cgroup.kill", "1")) return;
  // Before Linux 5.14: one by one. A process forked meanwhile shows up in the next round.
  for (pid_t pid : cgroup_pids(folder)) ::kill(pid, SIGKILL);
}

}  // namespace

std::optional<CgroupMount> parse_cgroup2_mount(std::string_view mountinfo) {
  for (std::string_view line : split(mountinfo, '\n')) {
    const size_t dash = line.find(" - ");
    if (dash == std::string_view::npos) continue;
    const std::vector<std::string_view> after = split(line.substr(dash + 3), ' ');
    const std::vector<std::string_view> before = split(line.substr(0, dash), ' ');
    if (after.empty() || after[0] != "cgroup2" || before.size() < 5) continue;
    return CgroupMount{unescape(before[4]), unescape(before[3])};
  }
  return std::nullopt;
}

std::optional<std::string> parse_unified_cgroup(std::string_view proc_cgroup) {
  for (std::string_view line : split(proc_cgroup, '\n')) {
    if (line.rfind("0::", 0) == 0 && line.size() > 3 && line[3] == '/') {
      return std::string(line.substr(3));
    }
  }
  return std::nullopt;
}

std::optional<std::string> cgroup_folder(const CgroupMount &mount, const std::string &cgroup) {
  std::string relative = cgroup;
  if (mount.root != "/") {
    if (cgroup != mount.root && cgroup.rfind(mount.root + "/", 0) != 0) return std::nullopt;
    relative = cgroup.substr(mount.root.size());
  }
  if (relative == "/") relative.clear();
  return mount.mount_point + relative;
}

std::optional<std::string> create_job_cgroup(const std::string &name, std::string &why) {
  const auto mount = parse_cgroup2_mount(read_text("/proc/self/mountinfo"));
  if (!mount) {
    why = "no cgroup v2 hierarchy is mounted (/proc/self/mountinfo)";
    return std::nullopt;
  }
  const auto own = parse_unified_cgroup(read_text("/proc/self/cgroup"));
  const auto parent = own ? cgroup_folder(*mount, *own) : std::nullopt;
  if (!parent) {
    why = "the agent's own cgroup is not under " + mount->mount_point + " (/proc/self/cgroup)";
    return std::nullopt;
  }
  const std::string folder = *parent + "/" + name;
  if (::mkdir(folder.c_str(), 0755) != 0) {
    why = "mkdir " + folder + ": " + std::strerror(errno);
    return std::nullopt;
  }
  if (::access((folder + "/cgroup.procs").c_str(), W_OK) != 0) {
    why = folder + "/cgroup.procs is not writable: " + std::strerror(errno);
    ::rmdir(folder.c_str());
    return std::nullopt;
  }
  return folder;
}

bool in_cgroup(pid_t pid, const std::string &folder) {
  for (pid_t member : cgroup_pids(folder)) {
    if (member == pid) return true;
  }
  return false;
}

bool kill_and_remove_cgroup(const std::string &folder, int timeout_ms, std::string &why) {
  for (int waited = 0;; waited += kPollMs) {
    if (::rmdir(folder.c_str()) == 0 || errno == ENOENT) return true;
    if (errno != EBUSY) {
      why = "rmdir " + folder + ": " + std::strerror(errno);
      return false;
    }
    if (waited >= timeout_ms) {
      why = "rmdir " + folder + ": still " + std::to_string(cgroup_pids(folder).size()) +
            " processes in it after " + std::to_string(timeout_ms) + " ms";
      return false;
    }
    kill_members(folder);
    usleep(kPollMs * 1000);
  }
}

}  // namespace perseus::launch
