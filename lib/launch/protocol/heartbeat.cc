#include "lib/launch/protocol/heartbeat.h"

#include <algorithm>
#include <cmath>
#include <sstream>

#include "lib/launch/errors.h"

namespace perseus::launch {

HeartbeatTiming heartbeat_timing(double timeout_seconds, const std::string &source) {
  if (!std::isfinite(timeout_seconds) || timeout_seconds < kMinHeartbeatTimeoutSeconds ||
      timeout_seconds > kMaxHeartbeatTimeoutSeconds) {
    std::ostringstream text;
    text << source << ": expected a number of seconds from " << kMinHeartbeatTimeoutSeconds
         << " to " << kMaxHeartbeatTimeoutSeconds
         << " (how long a silent host or launcher may be before it counts as lost; default "
         << kDefaultHeartbeatTimeoutSeconds << ")";
    throw InputError(text.str());
  }
  const auto timeout_ms = static_cast<long long>(std::llround(timeout_seconds * 1000));
  return HeartbeatTiming{std::max(1LL, timeout_ms / kHeartbeatsPerTimeout), timeout_ms};
}

Heartbeat::Heartbeat(HeartbeatTiming timing, long long now_ms)
    : timing_(timing), last_heard_ms_(now_ms), next_send_ms_(now_ms) {}

bool Heartbeat::send_due(long long now_ms) {
  if (now_ms < next_send_ms_) return false;
  // From now, not from the missed slot: a stalled loop sends one heartbeat, not a burst.
  next_send_ms_ = now_ms + timing_.interval_ms;
  return true;
}

long long Heartbeat::wait_ms(long long now_ms) const {
  const long long until_loss = last_heard_ms_ + timing_.timeout_ms - now_ms;
  return std::max(0LL, std::min(next_send_ms_ - now_ms, until_loss));
}

}  // namespace perseus::launch
