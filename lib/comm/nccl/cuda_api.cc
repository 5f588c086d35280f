#include "lib/comm/nccl/cuda_api.h"

#include <dlfcn.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <iterator>
#include <memory>

#include "lib/comm/error.h"
#include "lib/comm/nccl/shared_library.h"

namespace perseus::comm::nccl {

namespace {

// CUDA 13 first, then 12 (both have every function below with these signatures); the bare
// names search the loader's path, the full paths cover a toolkit that is not on it. Constant
// initialised: cuda_available() may run during static initialisation (a test's skip decorator).
constexpr const char *kCudartNames[] = {
    "libcudart.so.13",
    "libcudart.so.12",
    "libcudart.so",
    "/usr/local/cuda/lib64/libcudart.so.13",
    "/usr/local/cuda/lib64/libcudart.so.12",
};

CudaApi load_cuda() {
  const SharedLibrary library = SharedLibrary::open_first(
      std::vector<std::string>(std::begin(kCudartNames), std::end(kCudartNames)),
      "the CUDA runtime");
  CudaApi api;
  library.bind(api.get_device_count, "cudaGetDeviceCount");
  library.bind(api.set_device, "cudaSetDevice");
  library.bind(api.get_device, "cudaGetDevice");
  library.bind(api.malloc, "cudaMalloc");
  library.bind(api.free, "cudaFree");
  library.bind(api.memcpy_async, "cudaMemcpyAsync");
  library.bind(api.memset_async, "cudaMemsetAsync");
  library.bind(api.stream_create_with_flags, "cudaStreamCreateWithFlags");
  library.bind(api.stream_destroy, "cudaStreamDestroy");
  library.bind(api.stream_wait_event, "cudaStreamWaitEvent");
  library.bind(api.stream_synchronize, "cudaStreamSynchronize");
  library.bind(api.event_create_with_flags, "cudaEventCreateWithFlags");
  library.bind(api.event_record, "cudaEventRecord");
  library.bind(api.event_query, "cudaEventQuery");
  library.bind(api.event_synchronize, "cudaEventSynchronize");
  library.bind(api.event_destroy, "cudaEventDestroy");
  library.bind(api.get_error_string, "cudaGetErrorString");
  library.bind(api.get_error_name, "cudaGetErrorName");
  library.bind(api.get_last_error, "cudaGetLastError");
  library.bind(api.pointer_get_attributes, "cudaPointerGetAttributes");
  library.bind(api.runtime_get_version, "cudaRuntimeGetVersion");
  api.library = library.path();
  return api;
}

// The outcome of the one load: the table, or the error every call of cuda_api() throws.
struct Loaded {
  std::unique_ptr<CudaApi> api;
  std::unique_ptr<Error> error;
};

const Loaded &loaded() {
  static const Loaded once = [] {
    Loaded result;
    try {
      result.api = std::make_unique<CudaApi>(load_cuda());
    } catch (const Error &error) {
      result.error = std::make_unique<Error>(error);
    }
    return result;
  }();
  return once;
}

std::string hex(const void *pointer) {
  char text[32];
  std::snprintf(text, sizeof text, "%p", pointer);
  return text;
}

}  // namespace

std::string CudaApi::describe(CudaError error) const {
  const char *text = get_error_string != nullptr ? get_error_string(error) : nullptr;
  const char *name = get_error_name != nullptr ? get_error_name(error) : nullptr;
  return std::string(text != nullptr ? text : "unknown CUDA error") + " (" +
         (name != nullptr ? name : "cudaError") + " = " + std::to_string(error) + ")";
}

void CudaApi::check(CudaError error, const std::string &doing) const {
  if (error == kCudaSuccess) return;
  get_last_error();  // reported here; a framework's own check must not see it again
  throw Error(Code::kCommunication, doing + ": " + describe(error));
}

const CudaApi &cuda_api() {
  const Loaded &result = loaded();
  if (result.error) throw *result.error;
  return *result.api;
}

namespace {
std::atomic<bool> g_cuda_found{false};  // cuda_available() has run and found a GPU
}  // namespace

bool cuda_available(std::string *why) {
  static const std::string problem = []() -> std::string {
    try {
      const CudaApi &cuda = cuda_api();
      int count = 0;
      const CudaError error = cuda.get_device_count(&count);
      if (error != kCudaSuccess) {
        cuda.get_last_error();
        return "the CUDA runtime (" + cuda.library +
               ") found no usable GPU: cudaGetDeviceCount: " + cuda.describe(error) +
               ". Is the NVIDIA driver installed and a GPU visible "
               "(nvidia-smi, CUDA_VISIBLE_DEVICES)?";
      }
      if (count < 1) {
        return "the CUDA runtime (" + cuda.library + ") sees no GPU (CUDA_VISIBLE_DEVICES?)";
      }
      return "";
    } catch (const Error &error) {
      return error.what();
    }
  }();
  if (why != nullptr) *why = problem;
  if (problem.empty()) g_cuda_found.store(true, std::memory_order_relaxed);
  return problem.empty();
}

void check_device_pointer(const CudaApi &cuda, const void *pointer, int device,
                          const std::string &what) {
  CudaPointerAttributes attributes{};
  const CudaError error = cuda.pointer_get_attributes(&attributes, pointer);
  const std::string where = what + " " + hex(pointer);
  if (error != kCudaSuccess) {
    cuda.get_last_error();
    throw Error(Code::kInvalidArgument, where +
                                            " is not memory CUDA knows: " + cuda.describe(error) +
                                            " (expected memory of CUDA "
                                            "device " +
                                            std::to_string(device) + ")");
  }
  const bool on_device =
      attributes.type == CudaMemoryType::kDevice || attributes.type == CudaMemoryType::kManaged;
  if (!on_device) {
    throw Error(Code::kInvalidArgument,
                where + " is host memory, not memory of CUDA device " + std::to_string(device) +
                    ": pass PERSEUS_DEVICE_CPU for host buffers, or the tensor's device");
  }
  // Managed memory is reachable from every device; `device` is only where it was allocated.
  if (attributes.type == CudaMemoryType::kDevice && attributes.device != device) {
    throw Error(Code::kInvalidArgument, where + " is memory of CUDA device " +
                                            std::to_string(attributes.device) + ", not of device " +
                                            std::to_string(device) + " as the call said");
  }
}

bool cuda_in_use() {
  // Known already (a device operation ran, or perseus_nccl_built() was asked): no probe.
  if (g_cuda_found.load(std::memory_order_relaxed)) return true;
  // The driver library is loaded by every CUDA runtime (torch's bundled one too) before any
  // device memory exists; RTLD_NOLOAD only looks, it never loads. Looking takes the loader's
  // lock and walks its list (microseconds), so a "no" is trusted for a second: a host operation
  // is not slowed by it, and a process that starts CUDA later is checked from then on.
  using namespace std::chrono;
  static std::atomic<int64_t> checked_at{INT64_MIN / 2};
  const int64_t now = duration_cast<milliseconds>(steady_clock::now().time_since_epoch()).count();
  if (now - checked_at.load(std::memory_order_relaxed) < 1000) return false;
  void *driver = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  if (!driver) {
    checked_at.store(now, std::memory_order_relaxed);
    return false;
  }
  dlclose(driver);
  return cuda_available(nullptr);
}

void check_host_pointer(const CudaApi &cuda, const void *pointer, const std::string &what) {
  CudaPointerAttributes attributes{};
  const CudaError error = cuda.pointer_get_attributes(&attributes, pointer);
  if (error != kCudaSuccess) {
    cuda.get_last_error();  // not memory CUDA knows: plain host memory
    return;
  }
  if (attributes.type == CudaMemoryType::kDevice) {
    throw Error(Code::kInvalidArgument,
                what + " " + hex(pointer) + " is memory of CUDA device " +
                    std::to_string(attributes.device) +
                    ", but the call said PERSEUS_DEVICE_CPU: pass the tensor's device");
  }
}

ScopedDevice::ScopedDevice(const CudaApi &cuda, int device) : cuda_(cuda) {
  cuda_.check(cuda_.get_device(&previous_), "cudaGetDevice");
  changed_ = previous_ != device;
  if (changed_) {
    cuda_.check(cuda_.set_device(device), "cudaSetDevice(" + std::to_string(device) + ")");
  }
}

ScopedDevice::~ScopedDevice() {
  if (changed_) cuda_.set_device(previous_);
}

}  // namespace perseus::comm::nccl
