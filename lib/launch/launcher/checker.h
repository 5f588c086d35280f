#pragma once
// perseusrun --check: reaches every host's agent as a launch would, asks each for its GPUs
// and the job's ports, and prints what blocks the job (check_report.h). Unlike a launch, a
// host that cannot be reached is reported, not fatal. Runs nothing but the agents.
//
// Exit code: 0 when the job can start; kExitLaunchFailure when something blocks it.

#include "lib/launch/launch_config.h"

namespace perseus::launch {

int run_check(const LaunchConfig &config);

}  // namespace perseus::launch
