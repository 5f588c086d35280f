#include "lib/launch/agent/host_check.h"

#include "lib/launch/errors.h"

namespace perseus::launch {

namespace {

using nlohmann::json;

template <typename Read>
auto from_cbor(const std::string &payload, const std::string &peer, const char *what, Read read) {
  try {
    return read(json::from_cbor(payload));
  } catch (const json::exception &error) {
    throw LaunchError(std::string("malformed ") + what + " message from the " + peer + ": " +
                      error.what());
  }
}

std::string to_cbor(const json &message) {
  const std::vector<std::uint8_t> bytes = json::to_cbor(message);
  return std::string(bytes.begin(), bytes.end());
}

GpuProcess gpu_process_from(const json &j) {
  return GpuProcess{j.at("pid").get<int>(), j.at("used_mib").get<unsigned long long>(),
                    j.at("user").get<std::string>(), j.at("command").get<std::string>()};
}

GpuInfo gpu_from(const json &j) {
  GpuInfo gpu;
  gpu.index = j.at("index").get<int>();
  gpu.uuid = j.at("uuid").get<std::string>();
  gpu.name = j.at("name").get<std::string>();
  gpu.memory_used_mib = j.at("memory_used_mib").get<unsigned long long>();
  gpu.memory_total_mib = j.at("memory_total_mib").get<unsigned long long>();
  gpu.utilization_percent = j.at("utilization_percent").get<int>();
  for (const json &p : j.at("processes")) gpu.processes.push_back(gpu_process_from(p));
  gpu.problem = j.at("problem").get<std::string>();
  return gpu;
}

GpuInventory inventory_from(const json &j) {
  GpuInventory inventory;
  inventory.driver_found = j.at("driver_found").get<bool>();
  inventory.problem = j.at("problem").get<std::string>();
  inventory.driver_version = j.at("driver_version").get<std::string>();
  inventory.cuda_driver_version = j.at("cuda_driver_version").get<std::string>();
  inventory.nccl_version = j.at("nccl_version").get<std::string>();
  for (const json &g : j.at("gpus")) inventory.gpus.push_back(gpu_from(g));
  return inventory;
}

PortUse port_from(const json &j) {
  PortUse use;
  use.port = j.at("port").get<int>();
  use.in_use = j.at("in_use").get<bool>();
  use.detail = j.at("detail").get<std::string>();
  for (const json &h : j.at("holders")) {
    use.holders.push_back(PortHolder{h.at("pid").get<int>(), h.at("user").get<std::string>(),
                                     h.at("command").get<std::string>()});
  }
  return use;
}

}  // namespace

CheckReport run_host_check(const CheckRequest &request) {
  CheckReport report;
  if (request.gpus) report.gpus = probe_gpu_inventory();
  for (int port : request.ports) report.ports.push_back(find_port_use(port));
  return report;
}

json to_json(const GpuInventory &inventory) {
  json gpus = json::array();
  for (const GpuInfo &gpu : inventory.gpus) {
    json processes = json::array();
    for (const GpuProcess &p : gpu.processes) {
      processes.push_back(
          {{"pid", p.pid}, {"used_mib", p.used_mib}, {"user", p.user}, {"command", p.command}});
    }
    gpus.push_back({{"index", gpu.index},
                    {"uuid", gpu.uuid},
                    {"name", gpu.name},
                    {"memory_used_mib", gpu.memory_used_mib},
                    {"memory_total_mib", gpu.memory_total_mib},
                    {"utilization_percent", gpu.utilization_percent},
                    {"processes", processes},
                    {"problem", gpu.problem}});
  }
  return {{"driver_found", inventory.driver_found},
          {"problem", inventory.problem},
          {"driver_version", inventory.driver_version},
          {"cuda_driver_version", inventory.cuda_driver_version},
          {"nccl_version", inventory.nccl_version},
          {"gpus", gpus}};
}

json to_json(const PortUse &use) {
  json holders = json::array();
  for (const PortHolder &h : use.holders) {
    holders.push_back({{"pid", h.pid}, {"user", h.user}, {"command", h.command}});
  }
  return {{"port", use.port}, {"in_use", use.in_use}, {"detail", use.detail}, {"holders", holders}};
}

json to_json(const CheckReport &report) {
  json ports = json::array();
  for (const PortUse &use : report.ports) ports.push_back(to_json(use));
  return {{"gpus", to_json(report.gpus)}, {"ports", ports}};
}

std::string encode(const CheckRequest &request) {
  return to_cbor({{"ports", request.ports}, {"gpus", request.gpus}});
}

std::string encode(const CheckReport &report) { return to_cbor(to_json(report)); }

CheckRequest decode_check_request(const std::string &payload, const std::string &peer) {
  return from_cbor(payload, peer, "check", [](const json &j) {
    return CheckRequest{j.at("ports").get<std::vector<int>>(), j.at("gpus").get<bool>()};
  });
}

CheckReport decode_check_report(const std::string &payload, const std::string &peer) {
  return from_cbor(payload, peer, "check report", [](const json &j) {
    CheckReport report;
    report.gpus = inventory_from(j.at("gpus"));
    for (const json &p : j.at("ports")) report.ports.push_back(port_from(p));
    return report;
  });
}

}  // namespace perseus::launch
