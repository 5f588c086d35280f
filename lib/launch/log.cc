#include "lib/launch/log.h"

#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>

#include "lib/launch/local_host.h"

namespace perseus::launch {

void init_logging(bool verbose, const std::string &who) {
  // Called again by a restarted job's next round: the logger made the first time serves on.
  auto logger = spdlog::get(who);
  if (!logger) logger = spdlog::stderr_logger_st(who);
  logger->set_pattern("%n: [" + local_hostname() + ":%P] %v");
  logger->set_level(verbose ? spdlog::level::debug : spdlog::level::warn);
  spdlog::set_default_logger(logger);
}

}  // namespace perseus::launch
