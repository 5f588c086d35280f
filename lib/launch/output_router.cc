#include "lib/launch/output_router.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>

#include "lib/launch/errors.h"

namespace perseus::launch {

namespace {

constexpr size_t kFlushAt = 1u << 20;

}  // namespace

OutputRouter::OutputRouter(int world_size, const std::string &directory) {
  for (int rank = 0; rank < world_size; ++rank) {
    for (bool is_stderr : {false, true}) {
      std::string *pending = is_stderr ? &pending_stderr_ : &pending_stdout_;
      auto sink = [this, pending](std::string_view line) {
        pending->append(line);
        if (pending->size() >= kFlushAt) flush();
      };
      streams_.push_back(
          {std::make_unique<LineTagger>(LineTagger::tag_for(rank, is_stderr), sink), UniqueFd()});
    }
  }
  if (!directory.empty()) open_files(world_size, directory);
}

void OutputRouter::open_files(int world_size, const std::string &directory) {
  for (int rank = 0; rank < world_size; ++rank) {
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
      UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
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

void OutputRouter::write(const OutputChunk &chunk) {
  Stream &s = stream(chunk.rank, chunk.stream);
  if (s.file.valid() && !write_all(s.file.get(), chunk.bytes)) {
    throw_system_error("write",
                       "to the --output-filename file of rank " + std::to_string(chunk.rank));
  }
  s.tagger->feed(chunk.bytes);
}

void OutputRouter::finish() {
  for (Stream &s : streams_) s.tagger->finish();
  flush();
}

void OutputRouter::flush() {
  if (stdout_open_ && !pending_stdout_.empty()) {
    stdout_open_ = write_all(STDOUT_FILENO, pending_stdout_);
  }
  if (stderr_open_ && !pending_stderr_.empty()) {
    stderr_open_ = write_all(STDERR_FILENO, pending_stderr_);
  }
  pending_stdout_.clear();
  pending_stderr_.clear();
}

}  // namespace perseus::launch
