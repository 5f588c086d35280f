#pragma once
// perseusrun --check: what was found on every host, what blocks the job, and how it is shown
// (a table for people, one JSON document with --json). Pure functions of the findings.

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "lib/launch/agent/host_check.h"

namespace perseus::launch {

struct HostFindings {
  std::string host;           // as the user named it
  std::string error;          // why the host could not be checked; "" when it was
  std::string agent_version;  // from its Hello
  std::string hostname;
  int ranks = 0;  // ranks the job would run there (0 when it cannot be placed)
  std::optional<CheckReport> report;
};

struct CheckVerdict {
  std::vector<std::string> blockers;  // the job cannot start while any is there
  std::vector<std::string> warnings;  // worth knowing, not blocking
  std::vector<std::string> notes;     // e.g. no driver: ranks run on CPU

  bool can_start() const { return blockers.empty(); }
};

// Busy GPUs are those gpu_is_busy() says are, with `threshold_mib`.
CheckVerdict judge(const std::vector<HostFindings> &hosts, unsigned long long threshold_mib);

std::string render_table(const std::vector<HostFindings> &hosts, const CheckVerdict &verdict,
                         unsigned long long threshold_mib);
nlohmann::json render_json(const std::vector<HostFindings> &hosts, const CheckVerdict &verdict,
                           unsigned long long threshold_mib);

// "GPU 0 (pid 1234 python train.py, user alice, 30000 MiB)" for every busy GPU of a host.
std::string describe_busy_gpus(const GpuInventory &inventory, unsigned long long threshold_mib);

}  // namespace perseus::launch
