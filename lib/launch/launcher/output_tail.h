#pragma once
// The last lines of one rank's stream, kept for the exit summary (a failing rank's traceback):
// at most kMaxLines lines and kMaxBytes bytes, the newest kept. A line longer than kMaxLineBytes
// keeps its first kMaxLineBytes bytes and is marked as cut. Pure, tested as a table.

#include <cstddef>
#include <deque>
#include <string>
#include <string_view>
#include <vector>

namespace perseus::launch {

class OutputTail {
 public:
  static constexpr size_t kMaxLines = 20;
  static constexpr size_t kMaxBytes = 4096;
  static constexpr size_t kMaxLineBytes = 1024;

  void feed(std::string_view bytes);
  // The kept lines, oldest first, without their newlines; a last line without one included.
  std::vector<std::string> lines() const;

 private:
  void push(std::string line);

  std::deque<std::string> lines_;
  size_t bytes_ = 0;
  std::string partial_;
  bool partial_cut_ = false;
};

}  // namespace perseus::launch
