#include "lib/comm/engine_settings.h"

#include <charconv>
#include <cstring>

#include "lib/comm/error.h"

namespace perseus::comm {

namespace {

long long parse_number(Lookup lookup, const char *name, long long fallback, long long low,
                       long long high) {
  const char *value = lookup(name);
  if (!value || !*value) return fallback;
  long long number = 0;
  const char *end = value + std::strlen(value);
  const auto [at, ec] = std::from_chars(value, end, number);
  if (ec != std::errc() || at != end || number < low || number > high) {
    throw Error(Code::kInvalidArgument, std::string(name) + "='" + value +
                                            "' is not a whole number in [" + std::to_string(low) +
                                            ", " + std::to_string(high) + "]: fix or unset it");
  }
  return number;
}

}  // namespace

EngineSettings read_engine_settings(Lookup lookup) {
  EngineSettings s;
  constexpr long long kWeek = 7LL * 24 * 3600;
  s.fusion_threshold =
      static_cast<size_t>(parse_number(lookup, "PERSEUS_FUSION_THRESHOLD",
                                       static_cast<long long>(s.fusion_threshold), 0, 1LL << 40));
  // Milliseconds, as Horovod's HOROVOD_CYCLE_TIME; fractions are not accepted.
  s.cycle_time =
      std::chrono::milliseconds(parse_number(lookup, "PERSEUS_CYCLE_TIME", 1, 0, 10 * 1000));
  if (s.cycle_time.count() == 0) s.cycle_time = std::chrono::microseconds(100);
  s.stall_check = std::chrono::seconds(
      parse_number(lookup, "PERSEUS_STALL_CHECK_SECONDS", s.stall_check.count(), 0, kWeek));
  s.stall_shutdown =
      std::chrono::seconds(parse_number(lookup, "PERSEUS_STALL_SHUTDOWN_SECONDS", 0, 0, kWeek));
  s.deadlock = std::chrono::seconds(
      parse_number(lookup, "PERSEUS_DEADLOCK_SECONDS", s.deadlock.count(), 0, kWeek));
  s.shared_memory = parse_number(lookup, "PERSEUS_SHM", 1, 0, 1) == 1;
  s.allreduce_streams =
      static_cast<int>(parse_number(lookup, "PERSEUS_ALLREDUCE_STREAMS", 1, 1, 64));
  const char *hierarchical = lookup("PERSEUS_HIERARCHICAL_ALLREDUCE");
  s.hierarchical_allreduce =
      parse_number(lookup,
                   hierarchical && *hierarchical ? "PERSEUS_HIERARCHICAL_ALLREDUCE"
                                                 : "HOROVOD_HIERARCHICAL_ALLREDUCE",
                   0, 0, 1) == 1;
  s.shutdown_timeout = std::chrono::seconds(parse_number(lookup, "PERSEUS_SHUTDOWN_TIMEOUT_SECONDS",
                                                         s.shutdown_timeout.count(), 0, kWeek));
  const char *timeline = lookup("PERSEUS_TIMELINE");
  s.timeline = timeline ? timeline : "";
  return s;
}

}  // namespace perseus::comm
