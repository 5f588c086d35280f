#include "lib/launch/launcher/output_router.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>

#include "lib/launch/errors.h"

namespace perseus::launch {

namespace {

// Ranks named one by one in the loss report; the rest are counted.
constexpr size_t kRanksNamed = 10;

std::string lines_and_bytes(size_t lines, size_t bytes) {
  return std::to_string(lines) + (lines == 1 ? " line (" : " lines (") + std::to_string(bytes) +
         " bytes)";
}

bool same_file(int a, int b) {
  struct stat first {
  }, second{};
  return fstat(a, &first) == 0 && fstat(b, &second) == 0 && first.st_dev == second.st_dev &&
         first.st_ino == second.st_ino;
}

std::string describe_loss(const OutputSink &sink) {
  size_t lines = 0, bytes = 0;
  std::string ranks;
  size_t named = 0;
  for (const auto &[rank, loss] : sink.losses()) {
    lines += loss.lines;
    bytes += loss.bytes;
    if (named++ < kRanksNamed) {
      ranks += (ranks.empty() ? "" : ", ") + std::string("rank ") + std::to_string(rank) + ": " +
               lines_and_bytes(loss.lines, loss.bytes);
    }
  }
  if (named > kRanksNamed) ranks += ", and " + std::to_string(named - kRanksNamed) + " more ranks";
  return lines_and_bytes(lines, bytes) +
         " of the ranks' output could not be written to perseusrun's " + sink.name() +
         " and were dropped: " + ranks;
}

}  // namespace

OutputRouter::OutputRouter(int world_size, const std::string &directory, bool append) {
  if (same_file(STDOUT_FILENO, STDERR_FILENO)) {
    stdout_ = std::make_unique<OutputSink>(STDOUT_FILENO, "stdout and stderr");
  } else {
    stdout_ = std::make_unique<OutputSink>(STDOUT_FILENO, "stdout");
    stderr_ = std::make_unique<OutputSink>(STDERR_FILENO, "stderr");
  }
  directory_ = directory;
  append_ = append;
  grow(world_size);
}

void OutputRouter::grow(int world_size) {
  const int first = static_cast<int>(streams_.size() / 2);
  for (int rank = first; rank < world_size; ++rank) {
    for (bool is_stderr : {false, true}) {
      OutputSink &sink = is_stderr && stderr_ ? *stderr_ : *stdout_;
      auto tagged = [this, &sink, rank](std::string_view line) { queue(sink, rank, line); };
      streams_.push_back(
          {std::make_unique<LineTagger>(LineTagger::tag_for(rank, is_stderr), tagged), UniqueFd()});
    }
  }
  if (!directory_.empty()) open_files(first, world_size, directory_, append_);
}

void OutputRouter::open_files(int first, int world_size, const std::string &directory,
                              bool append) {
  for (int rank = first; rank < world_size; ++rank) {
    const std::filesystem::path folder =
        std::filesystem::path(directory) / "1" / ("rank." + std::to_string(rank));
    std::error_code error;
    std::filesystem::create_directories(folder, error);
    if (error) {
      throw LaunchError("--output-filename " + directory + ": cannot create " + folder.string() +
                        ": " + error.message());
    }
    for (bool is_stderr : {false, true}) {
      const std::string path = (folder / (is_stderr ? "stderr" : "stdout")).string();
      UniqueFd fd(::open(path.c_str(),
                         O_WRONLY | O_CREAT | (append ? O_APPEND : O_TRUNC) | O_CLOEXEC, 0644));
      if (!fd.valid()) throw_system_error("open", path + " (--output-filename)");
      streams_[static_cast<size_t>(2 * rank + is_stderr)].file = std::move(fd);
    }
  }
}

OutputRouter::Stream &OutputRouter::stream(int rank, OutputStream which) {
  const size_t index = static_cast<size_t>(2 * rank + (which == OutputStream::kStderr));
  if (rank < 0 || index >= streams_.size()) {
    throw LaunchError("output for rank " + std::to_string(rank) + ", which is not in the job");
  }
  return streams_[index];
}

void OutputRouter::queue(OutputSink &sink, int rank, std::string_view line) {
  if (sink.backlog() + line.size() > kHardLimit) {
    sink.drop_line(rank, line.size());
  } else {
    sink.append(rank, line);
  }
}

void OutputRouter::write(const OutputChunk &chunk) {
  Stream &s = stream(chunk.rank, chunk.stream);
  if (s.file.valid() && !write_all(s.file.get(), chunk.bytes)) {
    throw_system_error("write",
                       "to the --output-filename file of rank " + std::to_string(chunk.rank));
  }
  if (chunk.stream == OutputStream::kStderr) tails_[chunk.rank].feed(chunk.bytes);
  s.tagger->feed(chunk.bytes);
}

void OutputRouter::say(const std::string &message) {
  (stderr_ ? *stderr_ : *stdout_).append(-1, message + "\n");
  flush();
}

void OutputRouter::finish() {
  for (Stream &s : streams_) s.tagger->finish();
  flush();
}

void OutputRouter::flush() {
  for (OutputSink *sink : sinks()) {
    sink->flush();
    if (std::optional<std::string> error = sink->take_error()) {
      say("perseusrun: error: cannot write the ranks' output to perseusrun's " + sink->name() +
          ": " + *error + "; the rest of it is dropped (--output-filename DIR keeps a copy)");
    }
  }
}

void OutputRouter::drop() {
  for (OutputSink *sink : sinks()) sink->drop();
}

size_t OutputRouter::backlog() const {
  size_t most = 0;
  for (const OutputSink *sink : sinks()) most = std::max(most, sink->backlog());
  return most;
}

std::vector<int> OutputRouter::poll_fds() const {
  std::vector<int> fds;
  for (const OutputSink *sink : sinks()) fds.push_back(sink->poll_fd());
  return fds;
}

std::vector<std::string> OutputRouter::stderr_tail(int rank) const {
  const auto found = tails_.find(rank);
  return found == tails_.end() ? std::vector<std::string>{} : found->second.lines();
}

std::string OutputRouter::loss_report() const {
  std::string report;
  for (const OutputSink *sink : sinks()) {
    if (sink->losses().empty()) continue;
    report += (report.empty() ? "" : "; ") + describe_loss(*sink);
  }
  return report;
}

std::vector<OutputSink *> OutputRouter::sinks() const {
  std::vector<OutputSink *> all{stdout_.get()};
  if (stderr_) all.push_back(stderr_.get());
  return all;
}

}  // namespace perseus::launch
