#pragma once
// What this host's NVIDIA GPUs are and who uses them, for `perseusrun --check` and the launch
// preflight (busy GPUs). NVIDIA's management library (NVML, libnvidia-ml.so.1) and NCCL
// (libnccl.so.2) are loaded at run time with dlopen, so the same binary runs on hosts with no
// NVIDIA driver: there the inventory says driver_found == false and why, and nothing fails.
//
// The NVML functions are reached through NvmlApi, a table of function pointers with NVML's
// exact C signatures (nvml.h is not needed to build), so that tests can fake the library.
// Only nvmlInit and nvmlDeviceGetCount failing makes the whole inventory fail; an error on
// one GPU's field leaves that field at its default and names it in GpuInfo::problem.
//
// Process ids are NVML's: in a container they are the host's ids, so /proc/<pid> there may be
// absent (user and command are left empty) or even another process of the container.

#include <optional>
#include <string>
#include <vector>

namespace perseus::launch {

struct GpuProcess {
  int pid = 0;
  unsigned long long used_mib = 0;  // 0 also when NVML cannot tell
  std::string user;                 // owner of /proc/<pid>, "" when not visible
  std::string command;              // /proc/<pid>/cmdline, arguments joined by spaces
};

struct GpuInfo {
  int index = 0;
  std::string uuid;  // "GPU-8f2e..."
  std::string name;  // "NVIDIA H200"
  unsigned long long memory_used_mib = 0;
  unsigned long long memory_total_mib = 0;
  int utilization_percent = -1;  // -1 when not supported
  std::vector<GpuProcess> processes;
  std::string problem;  // "" when every field was read, else e.g. "utilization: Not Supported"
};

struct GpuInventory {
  bool driver_found = false;  // NVML loaded and initialised
  // Why the inventory is missing or incomplete: "no NVIDIA driver (libnvidia-ml.so.1 not
  // found)", "nvmlInit failed: Driver Not Loaded", "nvmlDeviceGetCount failed: ...".
  std::string problem;
  std::string driver_version;       // "580.95.05"
  std::string cuda_driver_version;  // "13.0"
  std::string nccl_version;         // "2.28.9"; "" when libnccl.so.2 is absent
  std::vector<GpuInfo> gpus;
};

// NVML's C types, with the layouts of nvml.h.
using NvmlReturn = int;  // nvmlReturn_t; NVML_SUCCESS is 0
struct NvmlDeviceOpaque;
using NvmlDevice = NvmlDeviceOpaque *;  // nvmlDevice_t
struct NvmlMemory {                     // nvmlMemory_t, in bytes
  unsigned long long total;
  unsigned long long free;
  unsigned long long used;
};
struct NvmlUtilization {  // nvmlUtilization_t, in percent
  unsigned int gpu;
  unsigned int memory;
};
struct NvmlProcessInfo {  // nvmlProcessInfo_t
  unsigned int pid;
  unsigned long long usedGpuMemory;  // bytes, or kNvmlValueNotAvailable
  unsigned int gpuInstanceId;
  unsigned int computeInstanceId;
};
inline constexpr NvmlReturn kNvmlSuccess = 0;
inline constexpr NvmlReturn kNvmlErrorInsufficientSize = 7;
inline constexpr unsigned long long kNvmlValueNotAvailable = ~0ULL;

// The NVML functions used. The first five are required; a null optional one (older drivers
// lack some) leaves its fields at their defaults.
struct NvmlApi {
  NvmlReturn (*init)() = nullptr;      // nvmlInit_v2
  NvmlReturn (*shutdown)() = nullptr;  // nvmlShutdown
  const char *(*error_string)(NvmlReturn) = nullptr;
  NvmlReturn (*device_get_count)(unsigned int *) = nullptr;                        // _v2
  NvmlReturn (*device_get_handle_by_index)(unsigned int, NvmlDevice *) = nullptr;  // _v2
  NvmlReturn (*device_get_uuid)(NvmlDevice, char *, unsigned int) = nullptr;
  NvmlReturn (*device_get_name)(NvmlDevice, char *, unsigned int) = nullptr;
  NvmlReturn (*device_get_memory_info)(NvmlDevice, NvmlMemory *) = nullptr;
  NvmlReturn (*device_get_utilization_rates)(NvmlDevice, NvmlUtilization *) = nullptr;
  // nvmlDeviceGetComputeRunningProcesses_v3
  NvmlReturn (*device_get_compute_running_processes)(NvmlDevice, unsigned int *,
                                                     NvmlProcessInfo *) = nullptr;
  NvmlReturn (*system_get_driver_version)(char *, unsigned int) = nullptr;
  NvmlReturn (*system_get_cuda_driver_version)(int *) = nullptr;  // _v2
};

// dlopen("libnvidia-ml.so.1") once; the library stays loaded for the process lifetime.
// nullopt, with *problem saying why, when it is absent or lacks a required function.
std::optional<NvmlApi> load_nvml(std::string *problem);

// nvmlInit, reads every GPU, nvmlShutdown. Leaves nccl_version empty.
GpuInventory read_gpu_inventory(const NvmlApi &api);

// load_nvml + read_gpu_inventory + probe_nccl_version. Never throws on a missing driver.
GpuInventory probe_gpu_inventory();

// ncclGetVersion from libnccl.so.2, as "2.28.9"; "" when the library is absent.
std::string probe_nccl_version();

// 13000 -> "13.0", 12040 -> "12.4".
std::string format_cuda_driver_version(int version);

// NCCL's version code: major*10000 + minor*100 + patch from 2.9 on (22809 -> "2.28.9"),
// major*1000 + minor*100 + patch before (2708 -> "2.7.8").
std::string format_nccl_version(int code);

// The default of gpu_is_busy's threshold: below a CUDA context's own footprint (some 300 to
// 600 MiB), so any process holding a context counts, but not a few small allocations.
inline constexpr unsigned long long kDefaultBusyThresholdMib = 256;

// Whether `gpu` is busy: its compute processes other than those in `ignore_pids` use more
// than threshold_mib in total; with threshold 0, any such process makes it busy.
bool gpu_is_busy(const GpuInfo &gpu, unsigned long long threshold_mib,
                 const std::vector<int> &ignore_pids = {});

}  // namespace perseus::launch
