#pragma once
// Where rank output goes on the launcher's side: tagged lines to perseusrun's stdout and
// stderr, and with --output-filename the raw bytes to DIR/1/rank.<R>/{stdout,stderr} (Open
// MPI's layout). Lines are queued whole in an OutputSink per destination (one when stdout and
// stderr are the same file) and written without blocking: the launcher polls poll_fds() and
// holds the agents back while backlog() is high. Past kHardLimit queued bytes (reached only
// while the job ends, when agents send what their ranks wrote last), further lines are dropped
// and counted. perseusrun's own messages during the job go through say(), behind the rank
// lines already queued for stderr. The last lines of every rank's stderr are kept for the exit
// summary. If perseusrun's own stdout goes away (EPIPE), the job goes on and terminal output is
// dropped, silently; any other write error is said once on stderr.

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "lib/launch/launcher/line_tagger.h"
#include "lib/launch/launcher/output_sink.h"
#include "lib/launch/launcher/output_tail.h"
#include "lib/launch/protocol/agent_protocol.h"
#include "lib/launch/system_call.h"

namespace perseus::launch {

class OutputRouter {
 public:
  static constexpr size_t kHardLimit = 64u << 20;

  // Creates the per-rank files when `directory` is not empty (appends to them with `append`: a
  // restarted job's later rounds); throws LaunchError if it cannot.
  OutputRouter(int world_size, const std::string &directory, bool append = false);
  // Makes room for ranks (an elastic job's new processes) up to world_size - 1.
  void grow(int world_size);

  void write(const OutputChunk &chunk);
  // One of perseusrun's own messages, a line without its newline, to stderr.
  void say(const std::string &message);
  // Ends every stream: last lines without a newline are handed on.
  void finish();
  // Writes what the destinations take now; says a write error (not EPIPE) once.
  void flush();
  // Drops what is still queued (counted as lost).
  void drop();

  size_t backlog() const;
  std::vector<int> poll_fds() const;
  // The last lines of `rank`'s stderr (OutputTail).
  std::vector<std::string> stderr_tail(int rank) const;
  // "12 lines (3456 bytes) of the ranks' stdout were not written: rank 0: ..." or empty when
  // nothing was lost.
  std::string loss_report() const;

 private:
  std::string directory_;
  bool append_ = false;
  struct Stream {
    std::unique_ptr<LineTagger> tagger;
    UniqueFd file;
  };
  Stream &stream(int rank, OutputStream which);
  void open_files(int first, int world_size, const std::string &directory, bool append);
  void queue(OutputSink &sink, int rank, std::string_view line);
  std::vector<OutputSink *> sinks() const;

  std::vector<Stream> streams_;  // 2 per rank: stdout, stderr
  std::unique_ptr<OutputSink> stdout_;
  std::unique_ptr<OutputSink> stderr_;  // null when stderr is the same file as stdout
  std::map<int, OutputTail> tails_;     // stderr of the ranks that wrote any
};

}  // namespace perseus::launch
