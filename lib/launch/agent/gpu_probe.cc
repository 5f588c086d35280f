#include "lib/launch/agent/gpu_probe.h"

#include "lib/launch/agent/gpu_inventory.h"

namespace perseus::launch {

std::optional<int> probe_gpu_count() {
  const std::optional<NvmlApi> api = load_nvml(nullptr);
  if (!api || api->init() != kNvmlSuccess) return std::nullopt;
  std::optional<int> count;
  unsigned int devices = 0;
  if (api->device_get_count(&devices) == kNvmlSuccess) count = static_cast<int>(devices);
  api->shutdown();
  return count;
}

}  // namespace perseus::launch
