#include <doctest/doctest.h>
#include <pwd.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "lib/launch/agent/gpu_inventory.h"

namespace perseus::launch {
namespace {

// ---- a fake NVML, backed by a struct each test sets up ----

constexpr NvmlReturn kNotSupported = 3;
constexpr NvmlReturn kNoPermission = 4;
constexpr NvmlReturn kDriverNotLoaded = 9;
constexpr NvmlReturn kGpuIsLost = 15;
constexpr unsigned long long kMib = 1024ULL * 1024ULL;
constexpr unsigned int kAbsentPid = 0x3ffffff0;  // above any pid_max: no /proc entry

struct FakeGpu {
  std::string uuid;
  std::string name;
  NvmlMemory memory{};
  unsigned int utilization = 0;
  std::vector<NvmlProcessInfo> processes;
  NvmlReturn handle_result = kNvmlSuccess;
  NvmlReturn utilization_result = kNvmlSuccess;
  NvmlReturn processes_result = kNvmlSuccess;
};

struct FakeNvml {
  NvmlReturn init_result = kNvmlSuccess;
  NvmlReturn count_result = kNvmlSuccess;
  std::string driver_version = "580.95.05";
  int cuda_version = 13000;
  std::vector<FakeGpu> gpus;
  int init_calls = 0;
  int shutdown_calls = 0;
  int process_queries = 0;
};

FakeNvml fake;

NvmlDevice handle_of(unsigned int index) {
  return reinterpret_cast<NvmlDevice>(static_cast<std::uintptr_t>(index) + 1);
}

FakeGpu &gpu_of(NvmlDevice device) {
  return fake.gpus.at(reinterpret_cast<std::uintptr_t>(device) - 1);
}

NvmlReturn copy_string(const std::string &text, char *buffer, unsigned int size) {
  if (text.size() + 1 > size) return kNvmlErrorInsufficientSize;
  std::memcpy(buffer, text.c_str(), text.size() + 1);
  return kNvmlSuccess;
}

NvmlReturn fake_init() {
  ++fake.init_calls;
  return fake.init_result;
}

NvmlReturn fake_shutdown() {
  ++fake.shutdown_calls;
  return kNvmlSuccess;
}

const char *fake_error_string(NvmlReturn code) {
  switch (code) {
    case kNvmlSuccess:
      return "Success";
    case kNotSupported:
      return "Not Supported";
    case kNoPermission:
      return "Insufficient Permissions";
    case kDriverNotLoaded:
      return "Driver Not Loaded";
    case kGpuIsLost:
      return "GPU is lost";
    default:
      return "Unknown Error";
  }
}

NvmlReturn fake_get_count(unsigned int *count) {
  *count = static_cast<unsigned int>(fake.gpus.size());
  return fake.count_result;
}

NvmlReturn fake_get_handle(unsigned int index, NvmlDevice *device) {
  if (index >= fake.gpus.size()) return 2;  // NVML_ERROR_INVALID_ARGUMENT
  if (fake.gpus[index].handle_result != kNvmlSuccess) return fake.gpus[index].handle_result;
  *device = handle_of(index);
  return kNvmlSuccess;
}

NvmlReturn fake_get_uuid(NvmlDevice device, char *uuid, unsigned int size) {
  return copy_string(gpu_of(device).uuid, uuid, size);
}

NvmlReturn fake_get_name(NvmlDevice device, char *name, unsigned int size) {
  return copy_string(gpu_of(device).name, name, size);
}

NvmlReturn fake_get_memory(NvmlDevice device, NvmlMemory *memory) {
  *memory = gpu_of(device).memory;
  return kNvmlSuccess;
}

NvmlReturn fake_get_utilization(NvmlDevice device, NvmlUtilization *utilization) {
  const FakeGpu &gpu = gpu_of(device);
  if (gpu.utilization_result != kNvmlSuccess) return gpu.utilization_result;
  *utilization = NvmlUtilization{gpu.utilization, gpu.utilization / 2};
  return kNvmlSuccess;
}

// NVML's contract: with too small a *count, set it to the number needed and say so.
NvmlReturn fake_get_processes(NvmlDevice device, unsigned int *count, NvmlProcessInfo *infos) {
  ++fake.process_queries;
  const FakeGpu &gpu = gpu_of(device);
  if (gpu.processes_result != kNvmlSuccess) return gpu.processes_result;
  const auto needed = static_cast<unsigned int>(gpu.processes.size());
  if (*count < needed) {
    *count = needed;
    return kNvmlErrorInsufficientSize;
  }
  for (unsigned int i = 0; i < needed; ++i) infos[i] = gpu.processes[i];
  *count = needed;
  return kNvmlSuccess;
}

NvmlReturn fake_get_driver_version(char *version, unsigned int size) {
  return copy_string(fake.driver_version, version, size);
}

NvmlReturn fake_get_cuda_version(int *version) {
  *version = fake.cuda_version;
  return kNvmlSuccess;
}

NvmlApi fake_api() {
  NvmlApi api;
  api.init = fake_init;
  api.shutdown = fake_shutdown;
  api.error_string = fake_error_string;
  api.device_get_count = fake_get_count;
  api.device_get_handle_by_index = fake_get_handle;
  api.device_get_uuid = fake_get_uuid;
  api.device_get_name = fake_get_name;
  api.device_get_memory_info = fake_get_memory;
  api.device_get_utilization_rates = fake_get_utilization;
  api.device_get_compute_running_processes = fake_get_processes;
  api.system_get_driver_version = fake_get_driver_version;
  api.system_get_cuda_driver_version = fake_get_cuda_version;
  return api;
}

NvmlProcessInfo process_info(unsigned int pid, unsigned long long bytes) {
  return NvmlProcessInfo{pid, bytes, 0xffffffff, 0xffffffff};
}

unsigned int own_pid() { return static_cast<unsigned int>(getpid()); }

// Two H200s: GPU 0 runs this test's process and one of another pid namespace; GPU 1 runs
// three processes, one of them of unknown memory.
FakeNvml two_gpus() {
  FakeNvml nvml;
  FakeGpu first;
  first.uuid = "GPU-11111111-2222-3333-4444-555555555555";
  first.name = "NVIDIA H200";
  first.memory = NvmlMemory{143771 * kMib, 143771 * kMib - 1536 * kMib, 1536 * kMib};
  first.utilization = 87;
  first.processes = {process_info(own_pid(), 1024 * kMib), process_info(kAbsentPid, 500 * kMib)};
  FakeGpu second;
  second.uuid = "GPU-66666666-7777-8888-9999-000000000000";
  second.name = "NVIDIA H200";
  second.memory = NvmlMemory{143771 * kMib, 143771 * kMib, 0};
  second.utilization = 0;
  second.processes = {process_info(kAbsentPid, 100 * kMib), process_info(kAbsentPid - 1, 0),
                      process_info(kAbsentPid - 2, kNvmlValueNotAvailable)};
  nvml.gpus = {first, second};
  return nvml;
}

std::string own_user() {
  const passwd *entry = getpwuid(getuid());
  return entry ? entry->pw_name : std::to_string(getuid());
}

TEST_CASE("read_gpu_inventory reports every field of every GPU") {
  fake = two_gpus();
  const GpuInventory inventory = read_gpu_inventory(fake_api());
  CHECK(inventory.driver_found);
  CHECK(inventory.problem.empty());
  CHECK(inventory.driver_version == "580.95.05");
  CHECK(inventory.cuda_driver_version == "13.0");
  CHECK(inventory.nccl_version.empty());
  CHECK(fake.init_calls == 1);
  CHECK(fake.shutdown_calls == 1);
  REQUIRE(inventory.gpus.size() == 2);

  const GpuInfo &first = inventory.gpus[0];
  CHECK(first.index == 0);
  CHECK(first.uuid == "GPU-11111111-2222-3333-4444-555555555555");
  CHECK(first.name == "NVIDIA H200");
  CHECK(first.memory_used_mib == 1536);
  CHECK(first.memory_total_mib == 143771);
  CHECK(first.utilization_percent == 87);
  CHECK(first.problem.empty());
  REQUIRE(first.processes.size() == 2);
  const GpuProcess &mine = first.processes[0];
  CHECK(mine.pid == getpid());
  CHECK(mine.used_mib == 1024);
  CHECK(mine.user == own_user());
  const std::string executable = std::filesystem::read_symlink("/proc/self/exe").filename();
  CHECK_MESSAGE(mine.command.find(executable) != std::string::npos, mine.command);
  CHECK(mine.command.back() != ' ');
  const GpuProcess &foreign = first.processes[1];
  CHECK(foreign.pid == static_cast<int>(kAbsentPid));
  CHECK(foreign.used_mib == 500);
  CHECK(foreign.user.empty());
  CHECK(foreign.command.empty());

  const GpuInfo &second = inventory.gpus[1];
  CHECK(second.index == 1);
  CHECK(second.uuid == "GPU-66666666-7777-8888-9999-000000000000");
  CHECK(second.memory_used_mib == 0);
  CHECK(second.utilization_percent == 0);
  REQUIRE(second.processes.size() == 3);
  CHECK(second.processes[0].used_mib == 100);
  CHECK(second.processes[1].used_mib == 0);
  CHECK(second.processes[2].used_mib == 0);  // NVML_VALUE_NOT_AVAILABLE
  CHECK(second.problem.empty());
}

TEST_CASE("an error on one GPU's field leaves that field at its default and the rest intact") {
  fake = two_gpus();
  SUBCASE("processes and utilization fail on different GPUs") {
    fake.gpus[0].processes_result = kNoPermission;
    fake.gpus[1].utilization_result = kNotSupported;
    const GpuInventory inventory = read_gpu_inventory(fake_api());
    CHECK(inventory.driver_found);
    CHECK(inventory.problem.empty());
    REQUIRE(inventory.gpus.size() == 2);
    const GpuInfo &first = inventory.gpus[0];
    CHECK(first.processes.empty());
    CHECK(first.utilization_percent == 87);
    CHECK(first.memory_total_mib == 143771);
    CHECK(first.problem == "processes: Insufficient Permissions");
    const GpuInfo &second = inventory.gpus[1];
    CHECK(second.utilization_percent == -1);
    CHECK(second.processes.size() == 3);
    CHECK(second.uuid == "GPU-66666666-7777-8888-9999-000000000000");
    CHECK(second.problem == "utilization: Not Supported");
  }
  SUBCASE("both optional fields fail on one GPU") {
    fake.gpus[1].processes_result = kNotSupported;
    fake.gpus[1].utilization_result = kNotSupported;
    const GpuInventory inventory = read_gpu_inventory(fake_api());
    REQUIRE(inventory.gpus.size() == 2);
    CHECK(inventory.gpus[0].processes.size() == 2);
    CHECK(inventory.gpus[1].problem == "utilization: Not Supported; processes: Not Supported");
  }
  SUBCASE("a lost GPU keeps its index and says why") {
    fake.gpus[0].handle_result = kGpuIsLost;
    const GpuInventory inventory = read_gpu_inventory(fake_api());
    REQUIRE(inventory.gpus.size() == 2);
    CHECK(inventory.gpus[0].index == 0);
    CHECK(inventory.gpus[0].uuid.empty());
    CHECK(inventory.gpus[0].problem == "device: GPU is lost");
    CHECK(inventory.gpus[1].uuid == "GPU-66666666-7777-8888-9999-000000000000");
  }
  SUBCASE("a driver without the optional functions") {
    NvmlApi api = fake_api();
    api.device_get_compute_running_processes = nullptr;
    api.system_get_cuda_driver_version = nullptr;
    const GpuInventory inventory = read_gpu_inventory(api);
    REQUIRE(inventory.gpus.size() == 2);
    CHECK(inventory.cuda_driver_version.empty());
    CHECK(inventory.driver_version == "580.95.05");
    CHECK(inventory.gpus[0].processes.empty());
    CHECK(inventory.gpus[0].problem == "processes: not in this NVML");
    CHECK(fake.process_queries == 0);
  }
  CHECK(fake.shutdown_calls == 1);
}

TEST_CASE("nvmlInit failing means no driver, with NVML's reason") {
  fake = two_gpus();
  fake.init_result = kDriverNotLoaded;
  const GpuInventory inventory = read_gpu_inventory(fake_api());
  CHECK_FALSE(inventory.driver_found);
  CHECK(inventory.problem == "nvmlInit failed: Driver Not Loaded");
  CHECK(inventory.gpus.empty());
  CHECK(inventory.driver_version.empty());
  CHECK(fake.shutdown_calls == 0);
}

TEST_CASE("a driver with no GPUs") {
  fake = FakeNvml{};
  const GpuInventory inventory = read_gpu_inventory(fake_api());
  CHECK(inventory.driver_found);
  CHECK(inventory.problem.empty());
  CHECK(inventory.gpus.empty());
  CHECK(inventory.driver_version == "580.95.05");
  CHECK(fake.shutdown_calls == 1);
}

TEST_CASE("nvmlDeviceGetCount failing is reported, after a successful init") {
  fake = two_gpus();
  fake.count_result = kDriverNotLoaded;
  const GpuInventory inventory = read_gpu_inventory(fake_api());
  CHECK(inventory.driver_found);
  CHECK(inventory.problem == "nvmlDeviceGetCount failed: Driver Not Loaded");
  CHECK(inventory.gpus.empty());
  CHECK(fake.shutdown_calls == 1);
}

TEST_CASE("gpu_is_busy sums the memory of the processes not ignored") {
  struct Row {
    std::string name;
    std::vector<unsigned long long> used_mib;  // one process each, pids 100, 101, ...
    unsigned long long threshold_mib;
    std::vector<int> ignore_pids;
    bool busy;
  };
  const std::vector<Row> rows = {
      {"no process, threshold 0", {}, 0, {}, false},
      {"no process, default threshold", {}, kDefaultBusyThresholdMib, {}, false},
      {"threshold 0: a process of 0 MiB is busy", {0}, 0, {}, true},
      {"threshold 0: any process is busy", {1}, 0, {}, true},
      {"below the threshold", {200}, 256, {}, false},
      {"at the threshold is not above it", {256}, 256, {}, false},
      {"above the threshold", {257}, 256, {}, true},
      {"a CUDA context alone", {500}, kDefaultBusyThresholdMib, {}, true},
      {"several small processes sum above", {100, 100, 100}, 256, {}, true},
      {"several small processes sum below", {100, 100, 50}, 256, {}, false},
      {"the ignored process does not count", {1000}, 256, {100}, false},
      {"threshold 0 with every process ignored", {1000, 5}, 0, {100, 101}, false},
      {"the others still count", {1000, 300}, 256, {100}, true},
      {"the others still sum", {1000, 200, 100}, 256, {100}, true},
      {"an ignored pid not on the GPU changes nothing", {300}, 256, {4242}, true},
  };
  for (const Row &row : rows) {
    CAPTURE(row.name);
    GpuInfo gpu;
    int pid = 100;
    for (unsigned long long used : row.used_mib) gpu.processes.push_back({pid++, used, "", ""});
    CHECK(gpu_is_busy(gpu, row.threshold_mib, row.ignore_pids) == row.busy);
  }
}

TEST_CASE("version numbers are formatted like the tools print them") {
  CHECK(format_cuda_driver_version(13000) == "13.0");
  CHECK(format_cuda_driver_version(12040) == "12.4");
  CHECK(format_cuda_driver_version(11080) == "11.8");
  CHECK(format_cuda_driver_version(0).empty());
  CHECK(format_nccl_version(22809) == "2.28.9");
  CHECK(format_nccl_version(21903) == "2.19.3");
  CHECK(format_nccl_version(20900) == "2.9.0");
  CHECK(format_nccl_version(2708) == "2.7.8");
  CHECK(format_nccl_version(2408) == "2.4.8");
  CHECK(format_nccl_version(0).empty());
}

bool looks_like_version(const std::string &text) {
  int dots = 0;
  for (char c : text) {
    if (c == '.') {
      ++dots;
    } else if (c < '0' || c > '9') {
      return false;
    }
  }
  return dots == 2 && text.front() != '.' && text.back() != '.';
}

TEST_CASE("probe_gpu_inventory on this host does not fail without a driver") {
  std::string load_problem;
  const std::optional<NvmlApi> api = load_nvml(&load_problem);
  const GpuInventory inventory = probe_gpu_inventory();
  if (!api) {  // no NVIDIA driver here, as on the build machines
    CHECK_FALSE(inventory.driver_found);
    CHECK(inventory.problem == load_problem);
    CHECK(inventory.problem.find("libnvidia-ml.so.1") != std::string::npos);
    CHECK(inventory.gpus.empty());
  } else {
    MESSAGE("NVML found: " << inventory.gpus.size() << " GPUs, " << inventory.problem);
    for (const GpuInfo &gpu : inventory.gpus) CHECK(gpu.index >= 0);
  }
  if (!inventory.nccl_version.empty()) CHECK(looks_like_version(inventory.nccl_version));
  MESSAGE("problem: " << inventory.problem << "; NCCL: " << inventory.nccl_version);
}

}  // namespace
}  // namespace perseus::launch
