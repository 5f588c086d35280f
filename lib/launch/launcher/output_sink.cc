#include "lib/launch/launcher/output_sink.h"

#include <fcntl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <utility>

namespace perseus::launch {

namespace {

// Written bytes are cut off the front of the buffer once they are this many.
constexpr size_t kCompactAt = 1u << 20;

// A handle of its own on the pipe, terminal or device behind `fd`, with O_NONBLOCK, so that
// the flag does not reach the shell that shares `fd`'s file description.
UniqueFd reopen_nonblocking(int fd) {
  const std::string path = "/proc/self/fd/" + std::to_string(fd);
  return UniqueFd(::open(path.c_str(), O_WRONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC));
}

}  // namespace

OutputSink::OutputSink(int fd, std::string name) : fd_(fd), name_(std::move(name)) {
  struct stat info {};
  if (fstat(fd, &info) != 0) {
    open_ = false;  // nothing there: the output is dropped, as for a closed reader
    return;
  }
  if (S_ISSOCK(info.st_mode)) {
    socket_ = true;
  } else if (S_ISFIFO(info.st_mode) || S_ISCHR(info.st_mode)) {
    own_ = reopen_nonblocking(fd);  // if that fails, writes block as they always did
  }
}

void OutputSink::append(int rank, std::string_view line) {
  if (!open_) {
    count_lost(rank, line.size());
    return;
  }
  buffer_.append(line);
  pieces_.push_back({rank, static_cast<uint32_t>(line.size())});
}

int OutputSink::poll_fd() const {
  if (!open_ || backlog() == 0) return -1;
  if (socket_) return fd_;
  return own_.valid() ? own_.get() : -1;
}

ssize_t OutputSink::write_some(const char *data, size_t size) {
  if (socket_) {
    return retry_on_eintr([&] { return ::send(fd_, data, size, MSG_DONTWAIT | MSG_NOSIGNAL); });
  }
  const int fd = own_.valid() ? own_.get() : fd_;
  return retry_on_eintr([&] { return ::write(fd, data, size); });
}

void OutputSink::flush() {
  while (open_ && backlog() > 0) {
    const ssize_t n = write_some(buffer_.data() + offset_, backlog());
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
    if (n <= 0) {
      // A reader that went away (EPIPE) is the documented, silent case; anything else is said.
      if (n < 0 && errno != EPIPE) error_ = std::strerror(errno);
      if (n < 0 && errno == EPIPE) counting_ = false;
      drop();
      return;
    }
    consume(static_cast<size_t>(n));
  }
  if (offset_ >= kCompactAt && offset_ * 2 >= buffer_.size()) {
    buffer_.erase(0, offset_);
    offset_ = 0;
  }
}

void OutputSink::consume(size_t written) {
  offset_ += written;
  while (written > 0 && !pieces_.empty()) {
    const size_t take = std::min<size_t>(written, pieces_.front().size - front_written_);
    front_written_ += take;
    written -= take;
    if (front_written_ == pieces_.front().size) {
      pieces_.pop_front();
      front_written_ = 0;
    }
  }
}

void OutputSink::drop() {
  for (const Piece &piece : pieces_) {
    count_lost(piece.rank, piece.size - front_written_);
    front_written_ = 0;
  }
  pieces_.clear();
  front_written_ = 0;
  buffer_.clear();
  offset_ = 0;
  open_ = false;
}

void OutputSink::count_lost(int rank, size_t bytes) {
  if (rank < 0 || !counting_) return;
  OutputLoss &loss = losses_[rank];
  ++loss.lines;
  loss.bytes += bytes;
}

std::optional<std::string> OutputSink::take_error() { return std::exchange(error_, std::nullopt); }

}  // namespace perseus::launch
