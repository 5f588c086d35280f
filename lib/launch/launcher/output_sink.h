#pragma once
// One of perseusrun's own output streams (stdout or stderr) as a bounded queue of whole lines
// that is written without ever blocking the launcher's poll loop.
//
// A pipe, socket or terminal is written through a non-blocking handle of its own (the fd
// reopened through /proc/self/fd, or send(MSG_DONTWAIT) for a socket), so that the O_NONBLOCK
// flag never changes the file description perseusrun shares with its shell. A regular file is
// written directly (such writes never wait for a reader). What the destination does not take
// stays queued; the owner polls poll_fd() for POLLOUT and calls flush(). Lines are queued whole
// and written in order, so lines of different ranks never mix mid-line. The owner reads
// backlog() to hold the producers back, and drop() ends the stream: what is still queued is
// counted, per rank, as lost. A write error other than EPIPE (ENOSPC of /dev/full, EIO) ends
// the stream too, and error() says what it was, once.

#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <string>
#include <string_view>

#include "lib/launch/system_call.h"

namespace perseus::launch {

// Output of one rank that never reached its destination.
struct OutputLoss {
  size_t lines = 0;
  size_t bytes = 0;
};

class OutputSink {
 public:
  // `fd` stays open and owned by the caller; `name` ("stdout") is for messages.
  OutputSink(int fd, std::string name);

  // Queues one whole line (ending with '\n') of `rank` (-1: perseusrun's own message).
  void append(int rank, std::string_view line);
  // Counts a line as lost without queueing it (the owner's queue limit).
  void drop_line(int rank, size_t size) { count_lost(rank, size); }
  // Writes what the destination takes now; never blocks (except on a regular file).
  void flush();
  // Ends the stream: what is queued is counted as lost; later lines are counted as lost too.
  void drop();

  // The fd to poll for POLLOUT while lines are queued, else -1.
  int poll_fd() const;
  size_t backlog() const { return buffer_.size() - offset_; }
  bool open() const { return open_; }
  const std::string &name() const { return name_; }
  // The first write error but EPIPE ("No space left on device"), once: empty afterwards.
  std::optional<std::string> take_error();
  // Lost output by rank (not perseusrun's own lines).
  const std::map<int, OutputLoss> &losses() const { return losses_; }

 private:
  struct Piece {
    int rank;
    uint32_t size;
  };
  ssize_t write_some(const char *data, size_t size);
  void consume(size_t written);
  void count_lost(int rank, size_t bytes);

  int fd_;
  UniqueFd own_;  // the non-blocking handle, when there is one
  bool socket_ = false;
  std::string name_;
  std::string buffer_;  // queued bytes; buffer_[offset_...] are not written yet
  size_t offset_ = 0;
  std::deque<Piece> pieces_;  // the lines in buffer_, from its start
  size_t front_written_ = 0;  // bytes of pieces_.front() already written
  bool open_ = true;
  bool counting_ = true;  // false once the reader went away (EPIPE): nothing to report
  std::optional<std::string> error_;
  std::map<int, OutputLoss> losses_;
};

}  // namespace perseus::launch
