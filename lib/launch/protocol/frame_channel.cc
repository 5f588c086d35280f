#include "lib/launch/protocol/frame_channel.h"

#include <poll.h>
#include <unistd.h>

#include <algorithm>

#include "lib/launch/errors.h"
#include "lib/launch/system_call.h"

namespace perseus::launch {

namespace {

constexpr size_t kReadChunk = 64 * 1024;

uint32_t decode_length(const std::string &buffer) {
  uint32_t length = 0;
  for (size_t i = 1; i < kFrameHeaderSize; ++i) {
    length = (length << 8) | static_cast<uint8_t>(buffer[i]);
  }
  return length;
}

bool known_type(uint8_t type) {
  return (type >= static_cast<uint8_t>(FrameType::kHello) &&
          type <= static_cast<uint8_t>(FrameType::kAddRanks)) ||
         type == static_cast<uint8_t>(FrameType::kPauseOutput) ||
         type == static_cast<uint8_t>(FrameType::kResumeOutput);
}

}  // namespace

std::string oversized(size_t size, const std::string &direction, const std::string &peer) {
  return "a message of " + std::to_string(size) + " bytes " + direction + " the " + peer +
         " exceeds the limit of " + std::to_string(kMaxFramePayload) +
         " bytes of one launcher-agent message; run fewer ranks per host, or pass less "
         "environment (-x)";
}

FrameChannel::FrameChannel(UniqueFd in, UniqueFd out, std::string peer)
    : in_(std::move(in)), out_(std::move(out)), peer_(std::move(peer)) {
  set_nonblocking(in_.get());
  set_nonblocking(out_.get());
}

bool FrameChannel::read_available(std::vector<Frame> &frames) {
  char chunk[kReadChunk];
  const ssize_t n = retry_on_eintr([&] { return ::read(in_.get(), chunk, sizeof chunk); });
  if (n == 0) {
    if (!read_buffer_.empty()) {
      throw LaunchError("the stream from the " + peer_ + " ended inside a message");
    }
    return false;
  }
  if (n < 0) {
    if (errno == EAGAIN || errno == EWOULDBLOCK) return true;
    if (errno == ECONNRESET) return false;
    throw_system_error("read", "from the " + peer_);
  }
  read_buffer_.append(chunk, static_cast<size_t>(n));
  parse_frames(frames);
  return true;
}

void FrameChannel::parse_frames(std::vector<Frame> &frames) {
  size_t offset = 0;
  while (read_buffer_.size() - offset >= kFrameHeaderSize) {
    const std::string header = read_buffer_.substr(offset, kFrameHeaderSize);
    const auto type = static_cast<uint8_t>(header[0]);
    const uint32_t length = decode_length(header);
    if (!known_type(type)) {
      throw LaunchError("malformed message from the " + peer_ + " (type " + std::to_string(type) +
                        ", length " + std::to_string(length) +
                        "): is the same perseusrun version installed on both ends?");
    }
    if (length > kMaxFramePayload) throw LaunchError(oversized(length, "from", peer_));
    if (read_buffer_.size() - offset - kFrameHeaderSize < length) break;
    frames.push_back(Frame{static_cast<FrameType>(type),
                           read_buffer_.substr(offset + kFrameHeaderSize, length)});
    offset += kFrameHeaderSize + length;
  }
  read_buffer_.erase(0, offset);
}

void FrameChannel::send(FrameType type, std::string_view payload) {
  if (payload.size() > kMaxFramePayload) throw LaunchError(oversized(payload.size(), "to", peer_));
  std::string frame;
  frame.reserve(kFrameHeaderSize + payload.size());
  frame.push_back(static_cast<char>(type));
  const auto length = static_cast<uint32_t>(payload.size());
  for (int shift = 24; shift >= 0; shift -= 8) {
    frame.push_back(static_cast<char>((length >> shift) & 0xff));
  }
  frame.append(payload);
  queued_bytes_ += frame.size();
  queue_.push_back(std::move(frame));
}

bool FrameChannel::flush() {
  while (!queue_.empty()) {
    if (!out_.valid()) return false;
    const std::string &front = queue_.front();
    const char *data = front.data() + front_offset_;
    const size_t size = front.size() - front_offset_;
    const ssize_t n = retry_on_eintr([&] { return ::write(out_.get(), data, size); });
    if (n < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK) return true;
      return false;
    }
    front_offset_ += static_cast<size_t>(n);
    queued_bytes_ -= static_cast<size_t>(n);
    if (front_offset_ == front.size()) {
      queue_.pop_front();
      front_offset_ = 0;
    }
  }
  return true;
}

bool FrameChannel::flush_until(long long deadline_ms) {
  for (;;) {
    if (!flush()) return false;
    if (queue_.empty()) return true;
    const long long left = deadline_ms - monotonic_ms();
    if (left <= 0) return false;
    pollfd out{out_.get(), POLLOUT, 0};
    retry_on_eintr([&] { return ::poll(&out, 1, static_cast<int>(std::min(left, 1000LL))); });
  }
}

}  // namespace perseus::launch
