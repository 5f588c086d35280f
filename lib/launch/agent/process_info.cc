#include "lib/launch/agent/process_info.h"

#include <pwd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <sstream>
#include <string_view>
#include <vector>

namespace perseus::launch {

std::string read_proc_file(const std::string &path) {
  std::ifstream file(path, std::ios::binary);
  std::stringstream text;
  text << file.rdbuf();
  return text.str();
}

std::string user_name(uid_t uid) {
  passwd entry{};
  passwd *result = nullptr;
  std::vector<char> buffer(16384);
  if (getpwuid_r(uid, &entry, buffer.data(), buffer.size(), &result) == 0 && result) {
    return result->pw_name;
  }
  return std::to_string(uid);
}

std::string process_user(int pid) {
  struct stat info {};
  if (::stat(("/proc/" + std::to_string(pid)).c_str(), &info) != 0) return "";
  return user_name(info.st_uid);
}

namespace {

std::string trimmed(std::string_view text) {
  const size_t first = text.find_first_not_of(' ');
  if (first == std::string_view::npos) return "";
  return std::string(text.substr(first, text.find_last_not_of(' ') - first + 1));
}

// At most kMaxCommand bytes, cut between UTF-8 sequences and ended with "..." when cut.
std::string shortened(std::string text) {
  if (text.size() <= kMaxCommand) return text;
  size_t cut = kMaxCommand - 3;
  while (cut > 0 && (static_cast<unsigned char>(text[cut]) & 0xC0) == 0x80) --cut;
  text.resize(cut);
  return text + "...";
}

}  // namespace

std::string process_command(int pid) {
  if (::access(("/proc/" + std::to_string(pid)).c_str(), F_OK) != 0) return "";
  const std::string proc = "/proc/" + std::to_string(pid);
  std::string command = read_proc_file(proc + "/cmdline");
  // NULs between arguments, and any other control character, would break the line.
  for (char &c : command) {
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7F) c = ' ';
  }
  command = trimmed(command);
  if (command.empty()) {
    std::string name = read_proc_file(proc + "/comm");
    for (char &c : name) {
      if (static_cast<unsigned char>(c) < 0x20) c = ' ';
    }
    name = trimmed(name);
    command = name.empty() ? "?" : "[" + name + "]";
  }
  return shortened(command);
}

}  // namespace perseus::launch
