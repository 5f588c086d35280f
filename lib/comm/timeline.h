#pragma once
// PERSEUS_TIMELINE: a Chrome trace (chrome://tracing, Perfetto) of what the background thread
// does, one row per tensor name: NEGOTIATE from this rank's submission until every rank had
// submitted it (with an instant event as each rank announces it), then the operation itself
// with its phases (copies into and out of the fusion buffer, the transfer). Written by rank 0
// only, as Horovod does; the file is a JSON array that is valid after each flush even before
// the closing bracket (the trace format allows the bracket to be missing).
//
// Used by the background thread only. Failing to write stops the timeline with one warning;
// it never fails an operation.

#include <chrono>
#include <cstdio>
#include <map>
#include <string>

namespace perseus::comm {

class Timeline {
 public:
  // An empty path: disabled, every call returns at once.
  explicit Timeline(const std::string &path);
  ~Timeline();
  Timeline(const Timeline &) = delete;
  Timeline &operator=(const Timeline &) = delete;

  bool enabled() const { return file_ != nullptr; }

  using Clock = std::chrono::steady_clock;
  void begin(const std::string &tensor, const std::string &phase, Clock::time_point at);
  void end(const std::string &tensor, Clock::time_point at);
  void instant(const std::string &tensor, const std::string &what, Clock::time_point at);
  // A complete event (begin and end known).
  void span(const std::string &tensor, const std::string &phase, Clock::time_point from,
            Clock::time_point to);
  void flush();

 private:
  int row(const std::string &tensor);
  void event(const std::string &json);
  long long micros(Clock::time_point at) const;

  std::FILE *file_ = nullptr;
  std::string path_;
  Clock::time_point start_;
  std::map<std::string, int> rows_;
  bool first_ = true;
};

}  // namespace perseus::comm
