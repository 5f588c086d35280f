#pragma once
// Liveness of the other end of a launcher-agent channel. Each end sends a Heartbeat frame every
// `interval_ms` and counts any frame it receives as a sign of life; a peer silent for
// `timeout_ms` is lost. That notices what the end of a stream cannot show: a host that lost
// power or its link, a network that silently drops packets, a peer that is stopped.
//
// Pure timing logic (times are monotonic_ms() values passed in), so that it can be tested
// without a clock.

#include <string>

namespace perseus::launch {

// --heartbeat-timeout: the default, and how many heartbeats fit into one timeout.
inline constexpr double kDefaultHeartbeatTimeoutSeconds = 10;
inline constexpr int kHeartbeatsPerTimeout = 5;
// Bounds of --heartbeat-timeout: shorter would mistake a busy machine for a dead one.
inline constexpr double kMinHeartbeatTimeoutSeconds = 1;
inline constexpr double kMaxHeartbeatTimeoutSeconds = 86400;

struct HeartbeatTiming {
  long long interval_ms = 2000;  // how often this end sends a heartbeat
  long long timeout_ms = 10000;  // silence after which the peer is lost
};

// A heartbeat every timeout/kHeartbeatsPerTimeout; throws InputError starting with `source`
// (the value and where it came from, e.g. "--heartbeat-timeout '0.5'") when `timeout_seconds`
// is outside [kMinHeartbeatTimeoutSeconds, kMaxHeartbeatTimeoutSeconds].
HeartbeatTiming heartbeat_timing(double timeout_seconds, const std::string &source);

class Heartbeat {
 public:
  Heartbeat() = default;
  Heartbeat(HeartbeatTiming timing, long long now_ms);

  // Something came from the peer (or this end is deliberately not reading it, so its silence
  // says nothing).
  void heard(long long now_ms) { last_heard_ms_ = now_ms; }
  // True when this end should send a heartbeat now; then counts it as sent.
  bool send_due(long long now_ms);
  bool lost(long long now_ms) const { return silence_ms(now_ms) >= timing_.timeout_ms; }
  long long silence_ms(long long now_ms) const { return now_ms - last_heard_ms_; }
  // Milliseconds until the next send or the loss, whichever comes first (0 when due): how long
  // a poll loop may sleep.
  long long wait_ms(long long now_ms) const;
  const HeartbeatTiming &timing() const { return timing_; }

 private:
  HeartbeatTiming timing_;
  long long last_heard_ms_ = 0;
  long long next_send_ms_ = 0;
};

}  // namespace perseus::launch
