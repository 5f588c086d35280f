#include "lib/launch/launcher/output_tail.h"

#include <algorithm>

namespace perseus::launch {

namespace {

constexpr std::string_view kCutMark = " [...]";

}  // namespace

void OutputTail::feed(std::string_view bytes) {
  while (!bytes.empty()) {
    const size_t newline = bytes.find('\n');
    const std::string_view piece = bytes.substr(0, newline);
    const size_t room = kMaxLineBytes - std::min(kMaxLineBytes, partial_.size());
    partial_.append(piece.substr(0, room));
    partial_cut_ = partial_cut_ || piece.size() > room;
    if (newline == std::string_view::npos) return;
    bytes.remove_prefix(newline + 1);
    push(partial_cut_ ? partial_ + std::string(kCutMark) : partial_);
    partial_.clear();
    partial_cut_ = false;
  }
}

void OutputTail::push(std::string line) {
  bytes_ += line.size();
  lines_.push_back(std::move(line));
  while (lines_.size() > kMaxLines || (bytes_ > kMaxBytes && lines_.size() > 1)) {
    bytes_ -= lines_.front().size();
    lines_.pop_front();
  }
}

std::vector<std::string> OutputTail::lines() const {
  std::vector<std::string> result(lines_.begin(), lines_.end());
  if (!partial_.empty())
    result.push_back(partial_cut_ ? partial_ + std::string(kCutMark) : partial_);
  if (result.size() > kMaxLines) result.erase(result.begin());
  return result;
}

}  // namespace perseus::launch
