#include "lib/launch/agent/gpu_inventory.h"

#include "lib/launch/agent/process_info.h"

#include <dlfcn.h>
#include <pwd.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string_view>
#include <vector>

namespace perseus::launch {

namespace {

constexpr const char *kNvmlLibrary = "libnvidia-ml.so.1";
constexpr const char *kNcclLibrary = "libnccl.so.2";
constexpr unsigned int kNvmlStringSize = 96;         // NVML_DEVICE_{UUID,NAME}_V2_BUFFER_SIZE
constexpr unsigned int kNvmlDriverVersionSize = 80;  // NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE

static_assert(sizeof(NvmlMemory) == 24 && sizeof(NvmlUtilization) == 8);
static_assert(sizeof(NvmlProcessInfo) == 24 && offsetof(NvmlProcessInfo, usedGpuMemory) == 8);

unsigned long long to_mib(unsigned long long bytes) { return bytes >> 20; }

// ---- loading libnvidia-ml.so.1 ----

struct LoadedLibrary {
  void *handle = nullptr;
  std::string error;  // dlerror() when handle is null
};

// Opened once and never closed: NvmlApi's pointers stay valid for the process lifetime.
const LoadedLibrary &nvml_library() {
  static const LoadedLibrary library = [] {
    LoadedLibrary loaded;
    loaded.handle = dlopen(kNvmlLibrary, RTLD_NOW | RTLD_LOCAL);
    if (!loaded.handle) {
      const char *error = dlerror();
      loaded.error = error ? error : "";
    }
    return loaded;
  }();
  return library;
}

std::string load_problem(const std::string &dl_error) {
  if (dl_error.empty() || dl_error.find("No such file") != std::string::npos) {
    return std::string("no NVIDIA driver (") + kNvmlLibrary + " not found)";
  }
  return std::string("cannot load ") + kNvmlLibrary + ": " + dl_error;
}

template <typename Pointer>
void bind(void *library, const char *symbol, Pointer &pointer) {
  pointer = reinterpret_cast<Pointer>(dlsym(library, symbol));
}

NvmlApi bind_nvml(void *library) {
  NvmlApi api;
  bind(library, "nvmlInit_v2", api.init);
  bind(library, "nvmlShutdown", api.shutdown);
  bind(library, "nvmlErrorString", api.error_string);
  bind(library, "nvmlDeviceGetCount_v2", api.device_get_count);
  bind(library, "nvmlDeviceGetHandleByIndex_v2", api.device_get_handle_by_index);
  bind(library, "nvmlDeviceGetUUID", api.device_get_uuid);
  bind(library, "nvmlDeviceGetName", api.device_get_name);
  bind(library, "nvmlDeviceGetMemoryInfo", api.device_get_memory_info);
  bind(library, "nvmlDeviceGetUtilizationRates", api.device_get_utilization_rates);
  bind(library, "nvmlDeviceGetComputeRunningProcesses_v3",
       api.device_get_compute_running_processes);
  bind(library, "nvmlSystemGetDriverVersion", api.system_get_driver_version);
  bind(library, "nvmlSystemGetCudaDriverVersion_v2", api.system_get_cuda_driver_version);
  return api;
}

// The name of the first required function the library lacks; "" when it has them all.
std::string missing_required(const NvmlApi &api) {
  if (!api.init) return "nvmlInit_v2";
  if (!api.shutdown) return "nvmlShutdown";
  if (!api.error_string) return "nvmlErrorString";
  if (!api.device_get_count) return "nvmlDeviceGetCount_v2";
  if (!api.device_get_handle_by_index) return "nvmlDeviceGetHandleByIndex_v2";
  return "";
}

// ---- reading NVML ----

std::string error_text(const NvmlApi &api, NvmlReturn code) {
  const char *text = api.error_string(code);
  if (text && *text) return text;
  return "NVML error " + std::to_string(code);
}

// Appends "<field>: <reason>" to gpu.problem.
void note(GpuInfo &gpu, std::string_view field, std::string_view reason) {
  if (!gpu.problem.empty()) gpu.problem += "; ";
  gpu.problem.append(field).append(": ").append(reason);
}

// Reads a string through an NVML call that fills a char buffer of `size`.
template <typename Call>
NvmlReturn read_string(unsigned int size, Call call, std::string &out) {
  std::vector<char> buffer(size, '\0');
  const NvmlReturn result = call(buffer.data(), size);
  if (result == kNvmlSuccess) out.assign(buffer.data(), strnlen(buffer.data(), size));
  return result;
}

// Runs one optional field query: notes why the field stays at its default when it does.
template <typename Function, typename Query>
void read_field(const NvmlApi &api, GpuInfo &gpu, std::string_view field, Function function,
                Query query) {
  if (!function) return note(gpu, field, "not in this NVML");
  const NvmlReturn result = query();
  if (result != kNvmlSuccess) note(gpu, field, error_text(api, result));
}

// nvmlDeviceGetComputeRunningProcesses_v3: asks for the count, then the list, retrying
// when processes started in between.
NvmlReturn query_processes(const NvmlApi &api, NvmlDevice device,
                           std::vector<NvmlProcessInfo> &infos) {
  unsigned int count = 0;
  NvmlReturn result = api.device_get_compute_running_processes(device, &count, nullptr);
  for (int attempt = 0; result == kNvmlErrorInsufficientSize && attempt < 4; ++attempt) {
    infos.resize(count + 8);
    count = static_cast<unsigned int>(infos.size());
    result = api.device_get_compute_running_processes(device, &count, infos.data());
  }
  infos.resize(result == kNvmlSuccess ? std::min<size_t>(count, infos.size()) : 0);
  return result;
}

// Fills user and command from /proc/<pid>; leaves them empty when it is not visible.
void describe_process(GpuProcess &process) {
  process.user = process_user(process.pid);
  process.command = process_command(process.pid);
}

GpuProcess to_process(const NvmlProcessInfo &info) {
  GpuProcess process;
  process.pid = static_cast<int>(info.pid);
  if (info.usedGpuMemory != kNvmlValueNotAvailable) process.used_mib = to_mib(info.usedGpuMemory);
  describe_process(process);
  return process;
}

void read_processes(const NvmlApi &api, NvmlDevice device, GpuInfo &gpu) {
  std::vector<NvmlProcessInfo> infos;
  read_field(api, gpu, "processes", api.device_get_compute_running_processes,
             [&] { return query_processes(api, device, infos); });
  for (const NvmlProcessInfo &info : infos) gpu.processes.push_back(to_process(info));
}

void read_device_fields(const NvmlApi &api, NvmlDevice device, GpuInfo &gpu) {
  read_field(api, gpu, "uuid", api.device_get_uuid, [&] {
    return read_string(
        kNvmlStringSize,
        [&](char *text, unsigned int size) { return api.device_get_uuid(device, text, size); },
        gpu.uuid);
  });
  read_field(api, gpu, "name", api.device_get_name, [&] {
    return read_string(
        kNvmlStringSize,
        [&](char *text, unsigned int size) { return api.device_get_name(device, text, size); },
        gpu.name);
  });
  read_field(api, gpu, "memory", api.device_get_memory_info, [&] {
    NvmlMemory memory{};
    const NvmlReturn result = api.device_get_memory_info(device, &memory);
    if (result == kNvmlSuccess) {
      gpu.memory_used_mib = to_mib(memory.used);
      gpu.memory_total_mib = to_mib(memory.total);
    }
    return result;
  });
  read_field(api, gpu, "utilization", api.device_get_utilization_rates, [&] {
    NvmlUtilization utilization{};
    const NvmlReturn result = api.device_get_utilization_rates(device, &utilization);
    if (result == kNvmlSuccess) gpu.utilization_percent = static_cast<int>(utilization.gpu);
    return result;
  });
}

GpuInfo read_gpu(const NvmlApi &api, unsigned int index) {
  GpuInfo gpu;
  gpu.index = static_cast<int>(index);
  NvmlDevice device = nullptr;
  const NvmlReturn result = api.device_get_handle_by_index(index, &device);
  if (result != kNvmlSuccess) {
    note(gpu, "device", error_text(api, result));
    return gpu;
  }
  read_device_fields(api, device, gpu);
  read_processes(api, device, gpu);
  return gpu;
}

void read_versions(const NvmlApi &api, GpuInventory &inventory) {
  if (api.system_get_driver_version) {
    read_string(kNvmlDriverVersionSize, api.system_get_driver_version, inventory.driver_version);
  }
  int cuda = 0;
  if (api.system_get_cuda_driver_version &&
      api.system_get_cuda_driver_version(&cuda) == kNvmlSuccess) {
    inventory.cuda_driver_version = format_cuda_driver_version(cuda);
  }
}

}  // namespace

std::optional<NvmlApi> load_nvml(std::string *problem) {
  const LoadedLibrary &library = nvml_library();
  if (!library.handle) {
    if (problem) *problem = load_problem(library.error);
    return std::nullopt;
  }
  NvmlApi api = bind_nvml(library.handle);
  if (const std::string missing = missing_required(api); !missing.empty()) {
    if (problem) *problem = std::string(kNvmlLibrary) + " lacks " + missing + " (driver too old?)";
    return std::nullopt;
  }
  return api;
}

GpuInventory read_gpu_inventory(const NvmlApi &api) {
  GpuInventory inventory;
  const NvmlReturn init = api.init();
  if (init != kNvmlSuccess) {
    inventory.problem = "nvmlInit failed: " + error_text(api, init);
    return inventory;
  }
  inventory.driver_found = true;
  read_versions(api, inventory);
  unsigned int count = 0;
  const NvmlReturn counted = api.device_get_count(&count);
  if (counted != kNvmlSuccess) {
    inventory.problem = "nvmlDeviceGetCount failed: " + error_text(api, counted);
  } else {
    for (unsigned int index = 0; index < count; ++index) {
      inventory.gpus.push_back(read_gpu(api, index));
    }
  }
  api.shutdown();
  return inventory;
}

GpuInventory probe_gpu_inventory() {
  GpuInventory inventory;
  std::string problem;
  if (const std::optional<NvmlApi> api = load_nvml(&problem)) {
    inventory = read_gpu_inventory(*api);
  } else {
    inventory.problem = problem;
  }
  inventory.nccl_version = probe_nccl_version();
  return inventory;
}

std::string probe_nccl_version() {
  void *library = dlopen(kNcclLibrary, RTLD_NOW | RTLD_LOCAL);
  if (!library) return "";
  using GetVersion = int (*)(int *);  // ncclResult_t ncclGetVersion(int *); ncclSuccess is 0
  const auto get_version = reinterpret_cast<GetVersion>(dlsym(library, "ncclGetVersion"));
  int code = 0;
  const bool found = get_version && get_version(&code) == 0;
  dlclose(library);
  return found ? format_nccl_version(code) : "";
}

std::string format_cuda_driver_version(int version) {
  if (version <= 0) return "";
  return std::to_string(version / 1000) + "." + std::to_string(version % 1000 / 10);
}

std::string format_nccl_version(int code) {
  if (code <= 0) return "";
  const bool new_scheme = code >= 20900;
  const int major = new_scheme ? code / 10000 : code / 1000;
  const int minor = new_scheme ? code / 100 % 100 : code / 100 % 10;
  return std::to_string(major) + "." + std::to_string(minor) + "." + std::to_string(code % 100);
}

bool gpu_is_busy(const GpuInfo &gpu, unsigned long long threshold_mib,
                 const std::vector<int> &ignore_pids) {
  bool any = false;
  unsigned long long total_mib = 0;
  for (const GpuProcess &process : gpu.processes) {
    if (std::find(ignore_pids.begin(), ignore_pids.end(), process.pid) != ignore_pids.end()) {
      continue;
    }
    any = true;
    total_mib += process.used_mib;
  }
  return threshold_mib == 0 ? any : total_mib > threshold_mib;
}

}  // namespace perseus::launch
