#include "lib/launch/gpu_probe.h"

#include <dlfcn.h>

namespace perseus::launch {

namespace {

// NVML's C entry points, as declared in nvml.h (whose header is not needed at build time).
using NvmlInit = int (*)();
using NvmlGetCount = int (*)(unsigned int *);
using NvmlShutdown = int (*)();
constexpr int kNvmlSuccess = 0;

}  // namespace

std::optional<int> probe_gpu_count() {
  void *library = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!library) return std::nullopt;
  auto init = reinterpret_cast<NvmlInit>(dlsym(library, "nvmlInit_v2"));
  auto get_count = reinterpret_cast<NvmlGetCount>(dlsym(library, "nvmlDeviceGetCount_v2"));
  auto shutdown = reinterpret_cast<NvmlShutdown>(dlsym(library, "nvmlShutdown"));
  std::optional<int> count;
  if (init && get_count && shutdown && init() == kNvmlSuccess) {
    unsigned int devices = 0;
    if (get_count(&devices) == kNvmlSuccess) count = static_cast<int>(devices);
    shutdown();
  }
  dlclose(library);
  return count;
}

}  // namespace perseus::launch
