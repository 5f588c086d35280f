#pragma once
// What an agent finds out about its host before a job starts (perseusrun --check, and the
// quick preflight of every launch): its GPUs and the processes on them (NVML, loaded at run
// time), and who holds the TCP ports the job would use (/proc). Sent to the launcher as a
// CheckReport; nlohmann/json gives both the wire form (CBOR) and --json's output.

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "lib/launch/agent/gpu_inventory.h"
#include "lib/launch/agent/port_holders.h"

namespace perseus::launch {

struct CheckRequest {
  std::vector<int> ports;
  bool gpus = true;  // false: ports only
};

struct CheckReport {
  GpuInventory gpus;
  std::vector<PortUse> ports;
};

// Runs on the agent's host.
CheckReport run_host_check(const CheckRequest &request);

nlohmann::json to_json(const GpuInventory &inventory);
nlohmann::json to_json(const PortUse &use);
nlohmann::json to_json(const CheckReport &report);

std::string encode(const CheckRequest &request);
std::string encode(const CheckReport &report);
CheckRequest decode_check_request(const std::string &payload, const std::string &peer);
CheckReport decode_check_report(const std::string &payload, const std::string &peer);

}  // namespace perseus::launch
