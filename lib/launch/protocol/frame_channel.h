#pragma once
// The byte stream between the launcher and an agent, cut into frames:
//   [type: 1 byte][payload length: 4 bytes, big-endian][payload]
// A local agent's channel is a pair of pipes; a remote agent's is an SSH channel bridged to a
// socket. Both ends are non-blocking and driven by the owner's poll loop; nothing here blocks.
//
// Threading: a FrameChannel belongs to one thread.

#include <cstdint>
#include <deque>
#include <string>
#include <string_view>
#include <vector>

#include "lib/launch/system_call.h"

namespace perseus::launch {

enum class FrameType : uint8_t {
  kHello = 1,         // agent -> launcher: version and host facts
  kJob = 2,           // launcher -> agent: what to run
  kStarted = 3,       // agent -> launcher: a rank is running
  kOutput = 4,        // agent -> launcher: bytes a rank wrote
  kExited = 5,        // agent -> launcher: a rank ended
  kError = 6,         // agent -> launcher: the agent cannot go on
  kTerminate = 7,     // launcher -> agent: end every rank (SIGTERM, SIGKILL after the grace)
  kStdin = 8,         // launcher -> agent: bytes for the stdin rank
  kStdinEof = 9,      // launcher -> agent: the stdin rank's input ended
  kStdinAck = 10,     // agent -> launcher: stdin bytes written to the rank, for flow control
  kDone = 11,         // agent -> launcher: every process ended and all output sent
  kCheck = 12,        // launcher -> agent: look at GPUs and ports (host_check.h), before a Job
  kCheckReport = 13,  // agent -> launcher: what it found
  kHeartbeat = 14,    // both ways, empty, every heartbeat interval once the job runs (heartbeat.h)
  // launcher -> agent, elastic jobs only: more ranks to start into the running job (a
  // JobDescription whose `ranks` alone are read; the rest is the Job's).
  kAddRanks = 15,
  // launcher -> agent: perseusrun's stdout or stderr is not taking output; stop reading the
  // ranks' pipes (so that they block) until kResumeOutput. Other frames flow on.
  kPauseOutput = 30,
  kResumeOutput = 31,
};

struct Frame {
  FrameType type;
  std::string payload;
};

// Larger frames are refused before anything is allocated for them.
inline constexpr uint32_t kMaxFramePayload = 64u << 20;
inline constexpr size_t kFrameHeaderSize = 5;

// The message for a frame of `size` bytes over kMaxFramePayload, sent "to" or received "from"
// `peer`.
std::string oversized(size_t size, const std::string &direction, const std::string &peer);

class FrameChannel {
 public:
  // `peer` names the other end in messages ("agent on localhost").
  FrameChannel(UniqueFd in, UniqueFd out, std::string peer);

  int read_fd() const { return in_.get(); }
  int write_fd() const { return out_.get(); }
  const std::string &peer() const { return peer_; }

  // Reads once (up to 64 KiB, so that one busy peer cannot starve the others) and appends the
  // complete frames to `frames`. Returns false at end of stream. A malformed frame throws
  // LaunchError naming the peer.
  bool read_available(std::vector<Frame> &frames);

  // Queues a frame; a payload over kMaxFramePayload throws LaunchError (oversized()).
  void send(FrameType type, std::string_view payload);
  // Writes what the pipe takes now. Returns false when the peer has gone away.
  bool flush();
  // Writes everything queued, waiting (poll) for the pipe to take it, until `deadline_ms`
  // (monotonic_ms()). Returns false when the peer has gone away or the deadline passed first;
  // the rest then stays queued.
  bool flush_until(long long deadline_ms);
  bool wants_write() const { return !queue_.empty(); }
  size_t queued_bytes() const { return queued_bytes_; }
  void close_write() { out_.reset(); }

 private:
  void parse_frames(std::vector<Frame> &frames);

  UniqueFd in_;
  UniqueFd out_;
  std::string peer_;
  std::string read_buffer_;
  std::deque<std::string> queue_;
  size_t queued_bytes_ = 0;
  size_t front_offset_ = 0;
};

}  // namespace perseus::launch
