#include "lib/launch/launcher/check_report.h"

#include <set>
#include <sstream>

namespace perseus::launch {

namespace {

std::string describe_process(const GpuProcess &p) {
  std::string text = "pid " + std::to_string(p.pid);
  if (!p.command.empty()) text += " " + p.command;
  if (!p.user.empty()) text += ", user " + p.user;
  return text + ", " + std::to_string(p.used_mib) + " MiB";
}

int free_gpu_count(const GpuInventory &inventory, unsigned long long threshold_mib) {
  int free = 0;
  for (const GpuInfo &gpu : inventory.gpus) free += !gpu_is_busy(gpu, threshold_mib);
  return free;
}

void judge_host(const HostFindings &host, unsigned long long threshold_mib, CheckVerdict &v) {
  if (!host.error.empty()) {
    v.blockers.push_back("host " + host.host + ": " + host.error);
    return;
  }
  if (!host.report) return;
  for (const PortUse &use : host.report->ports) {
    if (use.in_use) {
      v.blockers.push_back("host " + host.host + ": " + describe(use) +
                           "; stop that process or choose another port with --master-port");
    }
  }
  const GpuInventory &gpus = host.report->gpus;
  if (!gpus.driver_found) {
    v.notes.push_back("host " + host.host + ": " + gpus.problem + "; ranks there run on CPU");
    return;
  }
  const int free = free_gpu_count(gpus, threshold_mib);
  if (host.ranks > free) {
    v.blockers.push_back("host " + host.host + ": " + std::to_string(host.ranks) +
                         " ranks need as many free GPUs, " + std::to_string(free) +
                         " are free; busy: " + describe_busy_gpus(gpus, threshold_mib) +
                         "; end those processes, run fewer ranks there, or raise "
                         "--gpu-busy-threshold");
  }
}

// A warning when hosts report different values of one version.
void compare_versions(const std::vector<HostFindings> &hosts, const char *what,
                      std::string (*get)(const HostFindings &), CheckVerdict &v) {
  std::set<std::string> seen;
  std::string listing;
  for (const HostFindings &host : hosts) {
    if (!host.report || !host.report->gpus.driver_found) continue;
    const std::string value = get(host);
    seen.insert(value);
    listing += (listing.empty() ? "" : ", ") + host.host + " " + (value.empty() ? "none" : value);
  }
  if (seen.size() > 1)
    v.warnings.push_back(std::string(what) + " differs between hosts: " + listing);
}

std::string mib(unsigned long long value) { return std::to_string(value) + " MiB"; }

void render_host(std::ostringstream &out, const HostFindings &host,
                 unsigned long long threshold_mib) {
  out << "host " << host.host;
  if (!host.error.empty()) {
    out << ": UNREACHABLE: " << host.error << "\n";
    return;
  }
  out << " (" << host.hostname << ", perseusrun " << host.agent_version << ", " << host.ranks
      << " ranks)\n";
  if (!host.report) return;
  const GpuInventory &gpus = host.report->gpus;
  if (!gpus.driver_found) {
    out << "  GPUs: none usable: " << gpus.problem << " (ranks run on CPU)\n";
  } else {
    out << "  driver " << gpus.driver_version << ", CUDA " << gpus.cuda_driver_version << ", NCCL "
        << (gpus.nccl_version.empty() ? "not found" : gpus.nccl_version) << "\n";
    for (const GpuInfo &gpu : gpus.gpus) {
      out << "  GPU " << gpu.index << " " << gpu.uuid << " " << gpu.name << ": "
          << mib(gpu.memory_used_mib) << " / " << mib(gpu.memory_total_mib) << ", "
          << (gpu.utilization_percent < 0 ? std::string("?")
                                          : std::to_string(gpu.utilization_percent))
          << "% busy" << (gpu_is_busy(gpu, threshold_mib) ? "  [BUSY]" : "  [free]") << "\n";
      for (const GpuProcess &p : gpu.processes) out << "    " << describe_process(p) << "\n";
    }
  }
  for (const PortUse &use : host.report->ports) out << "  " << describe(use) << "\n";
}

}  // namespace

std::string describe_busy_gpus(const GpuInventory &inventory, unsigned long long threshold_mib) {
  std::string text;
  for (const GpuInfo &gpu : inventory.gpus) {
    if (!gpu_is_busy(gpu, threshold_mib)) continue;
    std::string processes;
    for (const GpuProcess &p : gpu.processes) {
      processes += (processes.empty() ? "" : "; ") + describe_process(p);
    }
    text += (text.empty() ? "" : ", ") + std::string("GPU ") + std::to_string(gpu.index) + " (" +
            processes + ")";
  }
  return text.empty() ? "none" : text;
}

CheckVerdict judge(const std::vector<HostFindings> &hosts, unsigned long long threshold_mib) {
  CheckVerdict verdict;
  for (const HostFindings &host : hosts) judge_host(host, threshold_mib, verdict);
  compare_versions(
      hosts, "the NVIDIA driver version",
      [](const HostFindings &h) { return h.report->gpus.driver_version; }, verdict);
  compare_versions(
      hosts, "the CUDA driver version",
      [](const HostFindings &h) { return h.report->gpus.cuda_driver_version; }, verdict);
  compare_versions(
      hosts, "the NCCL version", [](const HostFindings &h) { return h.report->gpus.nccl_version; },
      verdict);
  return verdict;
}

std::string render_table(const std::vector<HostFindings> &hosts, const CheckVerdict &verdict,
                         unsigned long long threshold_mib) {
  std::ostringstream out;
  for (const HostFindings &host : hosts) render_host(out, host, threshold_mib);
  for (const std::string &note : verdict.notes) out << "note: " << note << "\n";
  for (const std::string &warning : verdict.warnings) out << "warning: " << warning << "\n";
  for (const std::string &blocker : verdict.blockers) out << "BLOCKS THE JOB: " << blocker << "\n";
  out << (verdict.can_start() ? "result: the job can start\n"
                              : "result: the job cannot start (" +
                                    std::to_string(verdict.blockers.size()) + " problem(s))\n");
  return out.str();
}

nlohmann::json render_json(const std::vector<HostFindings> &hosts, const CheckVerdict &verdict,
                           unsigned long long threshold_mib) {
  nlohmann::json list = nlohmann::json::array();
  for (const HostFindings &host : hosts) {
    nlohmann::json entry = {{"host", host.host},         {"reachable", host.error.empty()},
                            {"error", host.error},       {"agent_version", host.agent_version},
                            {"hostname", host.hostname}, {"ranks", host.ranks}};
    if (host.report) {
      entry.update(to_json(*host.report));
      entry["free_gpus"] =
          host.report->gpus.driver_found ? free_gpu_count(host.report->gpus, threshold_mib) : 0;
    }
    list.push_back(entry);
  }
  return {{"can_start", verdict.can_start()}, {"hosts", list},
          {"blockers", verdict.blockers},     {"warnings", verdict.warnings},
          {"notes", verdict.notes},           {"gpu_busy_threshold_mib", threshold_mib}};
}

}  // namespace perseus::launch
