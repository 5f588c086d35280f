#pragma once
// Cuts one rank's output stream into lines and hands each to a sink with the rank's tag in
// front, so that lines are never split or merged, whatever chunks the bytes arrive in. Bytes
// are not interpreted: non-UTF-8 passes through. A line longer than kMaxLine is handed on in
// pieces of kMaxLine bytes, each tagged, so that one rank cannot take unbounded memory.
//
// Tag format (mpirun's --tag-output): "[1,<rank>]<stdout>:" or "[1,<rank>]<stderr>:".

#include <functional>
#include <string>
#include <string_view>

namespace perseus::launch {

class LineTagger {
 public:
  static constexpr size_t kMaxLine = 16u << 20;
  // Receives whole tagged lines, each ending with '\n'.
  using Sink = std::function<void(std::string_view)>;

  LineTagger(std::string tag, Sink sink) : tag_(std::move(tag)), sink_(std::move(sink)) {}

  static std::string tag_for(int rank, bool is_stderr);

  void feed(std::string_view bytes);
  // The stream ended: a last line without a newline is handed on with one added.
  void finish();

 private:
  void emit(std::string_view line);

  std::string tag_;
  Sink sink_;
  std::string partial_;
  bool piece_sent_ = false;  // part of the current line went out as a kMaxLine piece
};

}  // namespace perseus::launch
