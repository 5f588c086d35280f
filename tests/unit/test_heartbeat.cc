#include <doctest/doctest.h>

#include "lib/launch/errors.h"
#include "lib/launch/protocol/heartbeat.h"

namespace perseus::launch {
namespace {

TEST_CASE("the timing is a heartbeat every fifth of the timeout") {
  const HeartbeatTiming standard = heartbeat_timing(kDefaultHeartbeatTimeoutSeconds, "test");
  CHECK(standard.timeout_ms == 10000);
  CHECK(standard.interval_ms == 2000);
  const HeartbeatTiming shortest = heartbeat_timing(1, "test");
  CHECK(shortest.timeout_ms == 1000);
  CHECK(shortest.interval_ms == 200);
  CHECK(heartbeat_timing(2.5, "test").interval_ms == 500);
}

TEST_CASE("a timeout out of bounds throws InputError naming where it came from") {
  for (double bad : {0.0, 0.999, -1.0, 86400.5, 1e300}) {
    CAPTURE(bad);
    CHECK_THROWS_WITH_AS(heartbeat_timing(bad, "--heartbeat-timeout 'x'"),
                         doctest::Contains("--heartbeat-timeout 'x': expected a number of "
                                           "seconds from 1 to 86400"),
                         InputError);
  }
  CHECK_NOTHROW(heartbeat_timing(86400, "test"));
}

TEST_CASE("a heartbeat is due at once, then once per interval, never in a burst") {
  Heartbeat beat({2000, 10000}, 1000);
  CHECK(beat.send_due(1000));
  CHECK_FALSE(beat.send_due(1000));
  CHECK_FALSE(beat.send_due(2999));
  CHECK(beat.send_due(3000));
  // A loop that stalled for 7 s sends one heartbeat, and the next one interval later.
  CHECK(beat.send_due(10000));
  CHECK_FALSE(beat.send_due(10001));
  CHECK_FALSE(beat.send_due(11999));
  CHECK(beat.send_due(12000));
}

TEST_CASE("the peer is lost after the timeout of silence, and hearing from it resets that") {
  Heartbeat beat({2000, 10000}, 0);
  CHECK_FALSE(beat.lost(0));
  CHECK_FALSE(beat.lost(9999));
  CHECK(beat.lost(10000));
  beat.heard(9000);
  CHECK(beat.silence_ms(10000) == 1000);
  CHECK_FALSE(beat.lost(18999));
  CHECK(beat.lost(19000));
  // Sending says nothing about the peer.
  beat.send_due(18000);
  CHECK(beat.lost(19000));
}

TEST_CASE("wait_ms is the time to the next send or the loss, whichever is first") {
  Heartbeat beat({2000, 10000}, 0);
  CHECK(beat.wait_ms(0) == 0);  // the first heartbeat is due
  beat.send_due(0);
  CHECK(beat.wait_ms(500) == 1500);
  CHECK(beat.wait_ms(2500) == 0);
  Heartbeat rare({60000, 10000}, 0);
  rare.send_due(0);
  CHECK(rare.wait_ms(4000) == 6000);  // the loss comes first
  CHECK(rare.wait_ms(20000) == 0);
}

}  // namespace
}  // namespace perseus::launch
