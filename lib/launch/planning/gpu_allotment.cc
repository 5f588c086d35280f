#include "lib/launch/planning/gpu_allotment.h"

#include <algorithm>
#include <sstream>

#include "lib/launch/errors.h"

namespace perseus::launch {

namespace {

std::vector<std::string> split_list(const std::string &value) {
  std::vector<std::string> entries;
  std::stringstream stream(value);
  for (std::string entry; std::getline(stream, entry, ',');) entries.push_back(entry);
  return entries;
}

std::vector<std::string> numbered(int count) {
  std::vector<std::string> entries;
  for (int i = 0; i < count; ++i) entries.push_back(std::to_string(i));
  return entries;
}

std::vector<std::string> device_list(const HostGpuFacts &facts, int local_size) {
  if (facts.cuda_visible_devices) return split_list(*facts.cuda_visible_devices);
  if (facts.gpu_count && *facts.gpu_count > 0) return numbered(*facts.gpu_count);
  return numbered(local_size);
}

std::vector<std::string> without_busy(std::vector<std::string> devices,
                                      const std::vector<std::string> &busy) {
  std::erase_if(devices, [&](const std::string &device) {
    return std::find(busy.begin(), busy.end(), device) != busy.end();
  });
  return devices;
}

std::string join(const std::vector<std::string> &entries, size_t count) {
  std::string joined;
  for (size_t i = 0; i < count; ++i) {
    if (i) joined += ',';
    joined += entries[i];
  }
  return joined;
}

void refuse_shared_gpus(const HostGpuFacts &facts, size_t devices, int local_size,
                        const std::string &host) {
  std::string source = facts.cuda_visible_devices
                           ? "CUDA_VISIBLE_DEVICES=" + *facts.cuda_visible_devices
                           : "the driver";
  throw InputError("host " + host + " would run " + std::to_string(local_size) + " ranks on " +
                   std::to_string(devices) + " GPU(s) (from " + source +
                   "), so two ranks would share a GPU; run at most " + std::to_string(devices) +
                   " ranks there (-npernode, -H " + host + ":" + std::to_string(devices) +
                   "), or use --gpu-bind none for ranks that do not each need a GPU");
}

}  // namespace

GpuAllotment allot_gpus(GpuBind bind, const HostGpuFacts &facts, int local_size,
                        const std::string &host) {
  GpuAllotment allotment;
  std::vector<std::optional<std::string>> &values = allotment.own;
  values.resize(static_cast<size_t>(local_size));
  if (bind == GpuBind::kNone) return allotment;
  if (facts.cuda_visible_devices && facts.cuda_visible_devices->empty()) {
    allotment.shared = "";
    values.clear();
    return allotment;
  }
  const std::vector<std::string> all = device_list(facts, local_size);
  if (all.size() < values.size()) refuse_shared_gpus(facts, all.size(), local_size, host);
  const std::vector<std::string> devices = without_busy(all, facts.busy);
  if (devices.size() < values.size()) {
    throw LaunchError("host " + host + ": " + std::to_string(local_size) +
                      " ranks need as many free GPUs, but only " + std::to_string(devices.size()) +
                      " of its " + std::to_string(all.size()) +
                      " are free; busy: " + facts.busy_detail +
                      "; end those processes, run fewer ranks there, raise "
                      "--gpu-busy-threshold, or skip the check with --no-preflight");
  }
  if (bind == GpuBind::kList) {
    allotment.shared = join(devices, values.size());
    values.clear();
    return allotment;
  }
  for (size_t i = 0; i < values.size(); ++i) values[i] = devices[i];
  return allotment;
}

}  // namespace perseus::launch
