#include "lib/launch/process_tree.h"

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

namespace {

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
    std::ifstream file("/proc/" + std::string(name) + "/stat");
    std::stringstream text;
    text << file.rdbuf();
    const std::string stat = text.str();
    if (is_zombie(stat)) continue;  // already dead, waiting to be reaped
    if (auto parent = parse_stat_parent(stat)) children.emplace(*parent, pid);
  }
  closedir(proc);
  return children;
}

}  // namespace

std::vector<pid_t> descendants_of(pid_t root) {
  const std::multimap<pid_t, pid_t> children = children_by_parent();
  std::vector<pid_t> found;
  std::vector<pid_t> pending{root};
  while (!pending.empty()) {
    const pid_t parent = pending.back();
    pending.pop_back();
    const auto [first, last] = children.equal_range(parent);
    for (auto it = first; it != last; ++it) {
      found.push_back(it->second);
      pending.push_back(it->second);
    }
  }
  return found;
}

int signal_descendants(pid_t root, int signal) {
  int signalled = 0;
  for (pid_t pid : descendants_of(root)) {
    if (::kill(pid, signal) == 0) ++signalled;
  }
  return signalled;
}

}  // namespace perseus::launch
