#include "lib/launch/launcher/line_tagger.h"

#include <algorithm>

namespace perseus::launch {

std::string LineTagger::tag_for(int rank, bool is_stderr) {
  return "[1," + std::to_string(rank) + (is_stderr ? "]<stderr>:" : "]<stdout>:");
}

void LineTagger::feed(std::string_view bytes) {
  while (!bytes.empty()) {
    const size_t newline = bytes.find('\n');
    std::string_view line = bytes.substr(0, newline);
    bytes.remove_prefix(newline == std::string_view::npos ? bytes.size() : newline + 1);
    if (partial_.empty() && !piece_sent_ && newline != std::string_view::npos &&
        line.size() < kMaxLine) {
      emit(line);  // the common case: a whole line in one chunk, no copy
      piece_sent_ = false;
      continue;
    }
    while (!line.empty()) {
      const size_t take = std::min(line.size(), kMaxLine - partial_.size());
      partial_.append(line.substr(0, take));
      line.remove_prefix(take);
      if (partial_.size() == kMaxLine) {
        emit(partial_);
        partial_.clear();
        piece_sent_ = true;
      }
    }
    if (newline != std::string_view::npos) {
      // A line of exactly kMaxLine bytes has been sent whole: its newline adds nothing.
      if (!partial_.empty() || !piece_sent_) emit(partial_);
      partial_.clear();
      piece_sent_ = false;
    }
  }
}

void LineTagger::finish() {
  if (!partial_.empty()) emit(partial_);
  partial_.clear();
  piece_sent_ = false;
}

void LineTagger::emit(std::string_view line) {
  std::string tagged;
  tagged.reserve(tag_.size() + line.size() + 1);
  tagged.append(tag_).append(line).push_back('\n');
  sink_(tagged);
}

}  // namespace perseus::launch
