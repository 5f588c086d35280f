#pragma once
// The launcher: turns a LaunchConfig into a running job and waits for its end.
//
//   1. host mentions from -H, the hostfile, or this machine alone;
//   2. one agent per distinct host (local ones are child processes), each says Hello;
//   3. the job is planned (job_plan.h) and each agent gets its part;
//   4. one poll loop routes output, watches exits, forwards stdin to rank 0, and ends the job
//      on the first failure, a signal (SIGINT, SIGTERM, SIGHUP) or --timeout.
//
// Exit code: 0; the lowest failing rank's code or 128+signal; 128+signal when perseusrun was
// signalled; kExitTimeout; or an agent's error code. Throws InputError or LaunchError only
// before any rank has started (nothing is left running then).

#include "lib/launch/launch_config.h"

namespace perseus::launch {

int run_launcher(const LaunchConfig &config);

}  // namespace perseus::launch
