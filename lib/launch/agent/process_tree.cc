#include "lib/launch/agent/process_tree.h"

#include <dirent.h>
#include <signal.h>

#include <charconv>
#include <fstream>
#include <map>
#include <sstream>
#include <string>

namespace perseus::launch {

std::optional<pid_t> parse_stat_parent(std::string_view stat) {
  // "<pid> (<name>) <state> <ppid> ..."
  const size_t open = stat.find(" (");
  const size_t close = stat.rfind(") ");
  if (open == std::string_view::npos || close == std::string_view::npos || close < open) {
    return std::nullopt;
  }
  std::string_view rest = stat.substr(close + 2);
  if (rest.size() < 3 || rest[1] != ' ') return std::nullopt;
  rest.remove_prefix(2);
  pid_t parent = -1;
  const auto [end, error] = std::from_chars(rest.data(), rest.data() + rest.size(), parent);
  if (error != std::errc() || end == rest.data() || parent < 0) return std::nullopt;
  if (end != rest.data() + rest.size() && *end != ' ') return std::nullopt;
  return parent;
}

std::optional<unsigned long long> parse_stat_start_time(std::string_view stat) {
  // After the name: state(3) ppid(4) ... starttime(22), so 19 fields after the state's.
  const size_t close = stat.rfind(") ");
  if (close == std::string_view::npos) return std::nullopt;
  std::string_view rest = stat.substr(close + 2);
  for (int field = 3; field < 22; ++field) {
    const size_t space = rest.find(' ');
    if (space == std::string_view::npos) return std::nullopt;
    rest.remove_prefix(space + 1);
  }
  unsigned long long start = 0;
  const auto [end, error] = std::from_chars(rest.data(), rest.data() + rest.size(), start);
  if (error != std::errc() || end == rest.data()) return std::nullopt;
  if (end != rest.data() + rest.size() && *end != ' ' && *end != '\n') return std::nullopt;
  return start;
}

namespace {

std::string read_stat(const std::string &pid) {
  std::ifstream file("/proc/" + pid + "/stat");
  std::stringstream text;
  text << file.rdbuf();
  return text.str();
}

bool is_zombie(std::string_view stat) {
  const size_t close = stat.rfind(')');
  return close != std::string_view::npos && close + 2 < stat.size() && stat[close + 2] == 'Z';
}

std::multimap<pid_t, pid_t> children_by_parent() {
  std::multimap<pid_t, pid_t> children;
  DIR *proc = opendir("/proc");
  if (!proc) return children;
  while (dirent *entry = readdir(proc)) {
    pid_t pid = 0;
    const std::string_view name(entry->d_name);
    const auto [end, error] = std::from_chars(name.data(), name.data() + name.size(), pid);
    if (error != std::errc() || end != name.data() + name.size()) continue;
    const std::string stat = read_stat(std::string(name));
    if (is_zombie(stat)) continue;  // already dead, waiting to be reaped
    if (auto parent = parse_stat_parent(stat)) children.emplace(*parent, pid);
  }
  closedir(proc);
  return children;
}

std::vector<pid_t> descendants_below(const std::multimap<pid_t, pid_t> &children,
                                     std::vector<pid_t> pending, pid_t skip) {
  std::vector<pid_t> found;
  while (!pending.empty()) {
    const pid_t parent = pending.back();
    pending.pop_back();
    const auto [first, last] = children.equal_range(parent);
    for (auto it = first; it != last; ++it) {
      if (skip != 0 && it->second == skip) continue;
      found.push_back(it->second);
      pending.push_back(it->second);
    }
  }
  return found;
}

}  // namespace

std::optional<unsigned long long> start_time_of(pid_t pid) {
  const std::string stat = read_stat(std::to_string(pid));
  if (stat.empty() || is_zombie(stat)) return std::nullopt;
  return parse_stat_start_time(stat);
}

std::vector<pid_t> descendants_of(pid_t root, pid_t skip) {
  return descendants_below(children_by_parent(), {root}, skip);
}

std::vector<pid_t> descendants_of_any(const std::vector<pid_t> &roots) {
  return descendants_below(children_by_parent(), roots, 0);
}

int signal_descendants(pid_t root, int signal, pid_t skip) {
  int signalled = 0;
  for (pid_t pid : descendants_of(root, skip)) {
    if (::kill(pid, signal) == 0) ++signalled;
  }
  return signalled;
}

}  // namespace perseus::launch
