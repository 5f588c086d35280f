#pragma once
// Everything perseusrun was asked to do, as plain data. apps/perseusrun fills it from the
// command line; lib/launch validates what depends on the hosts.

#include <string>
#include <utility>
#include <vector>

#include "lib/launch/gpu_allotment.h"
#include "lib/launch/placement.h"
#include "lib/launch/ssh_options.h"

namespace perseus::launch {

struct LaunchConfig {
  int np = 0;                           // 0: the total slots
  std::vector<std::string> host_lists;  // each -H value
  std::string hostfile;
  int npernode = 0;
  MapBy map_by = MapBy::kSlot;
  bool oversubscribe = false;
  GpuBind gpu_bind = GpuBind::kList;
  std::vector<std::string> exports;                      // -x values as written
  std::vector<std::pair<std::string, std::string>> mca;  // -mca NAME VALUE
  std::string output_directory;
  double kill_grace_seconds = 5;
  double timeout_seconds = 0;  // 0: none
  int master_port = 0;         // 0: pick a free one
  // --heartbeat-timeout (heartbeat.h)
  double heartbeat_timeout_seconds = 10;
  std::string working_directory;
  bool display_map = false;
  bool verbose = false;
  std::vector<std::string> command;  // program and its arguments
  std::string agent_program;         // this binary, started as the agent on each host
  SshOptions ssh;
  bool preflight = true;                            // --no-preflight turns it off
  unsigned long long gpu_busy_threshold_mib = 256;  // --gpu-busy-threshold
  bool check_only = false;                          // --check
  bool json = false;                                // --json (with --check)
};

}  // namespace perseus::launch
