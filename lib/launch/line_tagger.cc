#include "lib/launch/line_tagger.h"

namespace perseus::launch {

std::string LineTagger::tag_for(int rank, bool is_stderr) {
  return "[1," + std::to_string(rank) + (is_stderr ? "]<stderr>:" : "]<stdout>:");
}

void LineTagger::feed(std::string_view bytes) {
  while (!bytes.empty()) {
    const size_t newline = bytes.find('\n');
    if (newline == std::string_view::npos) {
      partial_.append(bytes);
      while (partial_.size() >= kMaxLine) {
        emit(std::string_view(partial_).substr(0, kMaxLine));
        partial_.erase(0, kMaxLine);
      }
      return;
    }
    if (partial_.empty()) {
      emit(bytes.substr(0, newline));
    } else {
      partial_.append(bytes.substr(0, newline));
      emit(partial_);
      partial_.clear();
    }
    bytes.remove_prefix(newline + 1);
  }
}

void LineTagger::finish() {
  if (!partial_.empty()) emit(partial_);
  partial_.clear();
}

void LineTagger::emit(std::string_view line) {
  std::string tagged;
  tagged.reserve(tag_.size() + line.size() + 1);
  tagged.append(tag_).append(line).push_back('\n');
  sink_(tagged);
}

}  // namespace perseus::launch
