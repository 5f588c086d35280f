#pragma once
// Where rank output goes on the launcher's side: tagged lines to perseusrun's stdout and
// stderr, and with --output-filename the raw bytes to DIR/1/rank.<R>/{stdout,stderr} (Open
// MPI's layout). Lines are collected and written in batches (flush), whole lines only.
// If perseusrun's own stdout goes away (EPIPE), the job goes on and terminal output is dropped.

#include <memory>
#include <string>
#include <vector>

#include "lib/launch/agent_protocol.h"
#include "lib/launch/line_tagger.h"
#include "lib/launch/system_call.h"

namespace perseus::launch {

class OutputRouter {
 public:
  // Creates the per-rank files when `directory` is not empty; throws LaunchError if it cannot.
  OutputRouter(int world_size, const std::string &directory);

  void write(const OutputChunk &chunk);
  // Ends every stream: last lines without a newline are handed on.
  void finish();
  void flush();

 private:
  struct Stream {
    std::unique_ptr<LineTagger> tagger;
    UniqueFd file;
  };
  Stream &stream(int rank, OutputStream which);
  void open_files(int world_size, const std::string &directory);

  std::vector<Stream> streams_;  // 2 per rank: stdout, stderr
  std::string pending_stdout_;
  std::string pending_stderr_;
  bool stdout_open_ = true;
  bool stderr_open_ = true;
};

}  // namespace perseus::launch
