#include "lib/comm/timeline.h"

#include <cerrno>
#include <cstring>

namespace perseus::comm {

namespace {

std::string quoted(const std::string &text) {
  std::string out = "\"";
  for (unsigned char c : text) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20) {
      char escape[8];
      std::snprintf(escape, sizeof escape, "\\u%04x", c);
      out += escape;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out + "\"";
}

}  // namespace

Timeline::Timeline(const std::string &path) : path_(path), start_(Clock::now()) {
  if (path.empty()) return;
  file_ = std::fopen(path.c_str(), "w");
  if (!file_) {
    std::fprintf(stderr, "perseus: cannot write the timeline PERSEUS_TIMELINE=%s: %s\n",
                 path.c_str(), std::strerror(errno));
    return;
  }
  std::fputs("[\n", file_);
}

Timeline::~Timeline() {
  if (!file_) return;
  std::fputs("\n]\n", file_);
  std::fclose(file_);
}

long long Timeline::micros(Clock::time_point at) const {
  return std::chrono::duration_cast<std::chrono::microseconds>(at - start_).count();
}

void Timeline::event(const std::string &json) {
  if (!file_) return;
  if (!first_) std::fputs(",\n", file_);
  first_ = false;
  if (std::fputs(json.c_str(), file_) < 0) {
    std::fprintf(stderr, "perseus: writing the timeline %s failed: %s; the timeline stops\n",
                 path_.c_str(), std::strerror(errno));
    std::fclose(file_);
    file_ = nullptr;
  }
}

int Timeline::row(const std::string &tensor) {
  const auto [it, inserted] = rows_.try_emplace(tensor, static_cast<int>(rows_.size()) + 1);
  if (inserted) {
    event(R"({"name": "process_name", "ph": "M", "pid": )" + std::to_string(it->second) +
          R"(, "args": {"name": )" + quoted(tensor) + "}}");
    event(R"({"name": "process_sort_index", "ph": "M", "pid": )" + std::to_string(it->second) +
          R"(, "args": {"sort_index": )" + std::to_string(it->second) + "}}");
  }
  return it->second;
}

void Timeline::begin(const std::string &tensor, const std::string &phase, Clock::time_point at) {
  if (!file_) return;
  const int pid = row(tensor);
  event(R"({"name": )" + quoted(phase) + R"(, "ph": "B", "ts": )" + std::to_string(micros(at)) +
        R"(, "pid": )" + std::to_string(pid) + R"(, "tid": 1})");
}

void Timeline::end(const std::string &tensor, Clock::time_point at) {
  if (!file_) return;
  const int pid = row(tensor);
  event(R"({"ph": "E", "ts": )" + std::to_string(micros(at)) + R"(, "pid": )" +
        std::to_string(pid) + R"(, "tid": 1})");
}

void Timeline::instant(const std::string &tensor, const std::string &what, Clock::time_point at) {
  if (!file_) return;
  const int pid = row(tensor);
  event(R"({"name": )" + quoted(what) + R"(, "ph": "i", "s": "p", "ts": )" +
        std::to_string(micros(at)) + R"(, "pid": )" + std::to_string(pid) + R"(, "tid": 1})");
}

void Timeline::span(const std::string &tensor, const std::string &phase, Clock::time_point from,
                    Clock::time_point to) {
  if (!file_) return;
  const int pid = row(tensor);
  event(R"({"name": )" + quoted(phase) + R"(, "ph": "X", "ts": )" + std::to_string(micros(from)) +
        R"(, "dur": )" + std::to_string(micros(to) - micros(from)) + R"(, "pid": )" +
        std::to_string(pid) + R"(, "tid": 1})");
}

void Timeline::flush() {
  if (file_) std::fflush(file_);
}

}  // namespace perseus::comm
