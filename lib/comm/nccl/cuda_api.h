#pragma once
// The CUDA runtime functions libperseus uses, loaded at run time from libcudart (dlopen), so that
// libperseus links no CUDA library and loads on hosts without an NVIDIA driver. No CUDA header
// is needed to build: the types below have the runtime's C layouts (cuda_runtime_api.h,
// driver_types.h of CUDA 12 and 13), and CudaApi holds the functions with their exact C
// signatures, so that tests can fake them.
//
// Errors: a library that is missing or finds no GPU is the caller's setup (kInvalidArgument: it
// asked for device memory on a host that cannot have any); a failing call on a working GPU is
// kCommunication (the job cannot go on), with the CUDA error string and what was being done.
//
// Threads: the table is loaded once per process (thread-safe) and never unloaded; its functions
// may be called from any thread, as the CUDA runtime's.

#include <cstddef>
#include <string>

namespace perseus::comm::nccl {

using CudaError = int;      // cudaError_t
using CudaStream = void *;  // cudaStream_t (a CUstream); nullptr is the legacy default stream
using CudaEvent = void *;   // cudaEvent_t

inline constexpr CudaError kCudaSuccess = 0;
inline constexpr CudaError kCudaErrorNotReady = 600;   // cudaEventQuery: work still pending
inline constexpr unsigned kCudaStreamNonBlocking = 1;  // cudaStreamNonBlocking
inline constexpr unsigned kCudaEventDisableTiming = 2;
inline constexpr int kCudaMemcpyDefault = 4;  // direction inferred from the pointers (UVA)

// cudaPointerAttributes (CUDA 11 and later). The runtime writes its own struct's size; the
// reserved tail keeps a longer struct of a later runtime from writing past ours.
enum class CudaMemoryType : int { kUnregistered = 0, kHost = 1, kDevice = 2, kManaged = 3 };
struct CudaPointerAttributes {
  CudaMemoryType type;
  int device;
  void *device_pointer;
  void *host_pointer;
  unsigned char reserved[64];
};

struct CudaApi {
  CudaError (*get_device_count)(int *count) = nullptr;          // cudaGetDeviceCount
  CudaError (*set_device)(int device) = nullptr;                // cudaSetDevice
  CudaError (*get_device)(int *device) = nullptr;               // cudaGetDevice
  CudaError (*malloc)(void **pointer, size_t bytes) = nullptr;  // cudaMalloc
  CudaError (*free)(void *pointer) = nullptr;                   // cudaFree
  CudaError (*memcpy_async)(void *dst, const void *src, size_t bytes, int kind,
                            CudaStream stream) = nullptr;  // cudaMemcpyAsync
  CudaError (*memset_async)(void *dst, int value, size_t bytes,
                            CudaStream stream) = nullptr;  // cudaMemsetAsync
  CudaError (*stream_create_with_flags)(CudaStream *stream,
                                        unsigned flags) = nullptr;  // cudaStreamCreateWithFlags
  CudaError (*stream_destroy)(CudaStream stream) = nullptr;         // cudaStreamDestroy
  CudaError (*stream_wait_event)(CudaStream stream, CudaEvent event,
                                 unsigned flags) = nullptr;      // cudaStreamWaitEvent
  CudaError (*stream_synchronize)(CudaStream stream) = nullptr;  // cudaStreamSynchronize
  CudaError (*event_create_with_flags)(CudaEvent *event,
                                       unsigned flags) = nullptr;  // cudaEventCreateWithFlags
  CudaError (*event_record)(CudaEvent event, CudaStream stream) = nullptr;  // cudaEventRecord
  CudaError (*event_query)(CudaEvent event) = nullptr;  // cudaEventQuery: success or not ready
  CudaError (*event_synchronize)(CudaEvent event) = nullptr;   // cudaEventSynchronize
  CudaError (*event_destroy)(CudaEvent event) = nullptr;       // cudaEventDestroy
  const char *(*get_error_string)(CudaError error) = nullptr;  // cudaGetErrorString
  const char *(*get_error_name)(CudaError error) = nullptr;    // cudaGetErrorName
  // cudaGetLastError: clears the error a failed call leaves behind, which a framework that
  // checks cudaGetLastError after its own kernels would otherwise take for its own.
  CudaError (*get_last_error)() = nullptr;
  CudaError (*pointer_get_attributes)(CudaPointerAttributes *attributes,
                                      const void *pointer) = nullptr;  // cudaPointerGetAttributes
  CudaError (*runtime_get_version)(int *version) = nullptr;            // cudaRuntimeGetVersion

  std::string library;  // the file loaded, for messages

  // "out of memory (cudaErrorMemoryAllocation = 2)".
  std::string describe(CudaError error) const;
  // Throws Error(kCommunication) "<doing>: <describe(error)>" unless error is kCudaSuccess.
  void check(CudaError error, const std::string &doing) const;
};

// The process's CUDA runtime, loaded on first use (libcudart.so.13, .so.12, .so; then the same
// under /usr/local/cuda/lib64). Throws Error(kInvalidArgument) saying what was tried when it
// cannot be loaded; the same error on every later call.
const CudaApi &cuda_api();

// True when the CUDA runtime loads and sees at least one GPU; else false and *why (may be null)
// says which step failed ("... cudaGetDeviceCount: CUDA driver version is insufficient ...").
// The answer is computed once per process.
bool cuda_available(std::string *why);

// Throws Error(kInvalidArgument) unless `pointer` is CUDA device (or managed) memory of
// `device`: "<what> 0x7f.. is host memory, not memory of CUDA device 0". `what` names the
// argument ("send buffer").
void check_device_pointer(const CudaApi &cuda, const void *pointer, int device,
                          const std::string &what);

// True when this process already uses CUDA (its driver library is loaded) and a GPU is there:
// only then can a buffer be device memory, so only then are host buffers checked.
bool cuda_in_use();

// Throws Error(kInvalidArgument) when `pointer` is device memory (managed memory is fine: the
// host can read it): a CUDA tensor passed as PERSEUS_DEVICE_CPU would otherwise crash Gloo.
void check_host_pointer(const CudaApi &cuda, const void *pointer, const std::string &what);

// Makes `device` the calling thread's current CUDA device for the length of a scope and then
// restores the one it had, so that the engine's thread and the framework's threads keep the
// device they chose. Calls cudaSetDevice only when the device differs.
class ScopedDevice {
 public:
  ScopedDevice(const CudaApi &cuda, int device);
  ~ScopedDevice();
  ScopedDevice(const ScopedDevice &) = delete;
  ScopedDevice &operator=(const ScopedDevice &) = delete;

 private:
  const CudaApi &cuda_;
  int previous_ = 0;
  bool changed_ = false;
};

}  // namespace perseus::comm::nccl
