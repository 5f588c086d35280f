// lib/comm/nccl/{shared_library,cuda_api,nccl_api}: loading the CUDA runtime and NCCL at run
// time. On a host without an NVIDIA GPU (CI) loading must fail with a message that says what is
// missing; on the GPU machine the same cases check that both load and work.

#include <doctest/doctest.h>

#include <unistd.h>

#include <cstddef>
#include <string>
#include <vector>

#include "lib/comm/error.h"
#include "lib/comm/nccl/cuda_api.h"
#include "lib/comm/nccl/nccl_api.h"
#include "lib/comm/nccl/shared_library.h"

namespace perseus::comm::nccl {
namespace {

// The NVIDIA driver's control device: present exactly where a GPU can be used.
bool host_has_nvidia_driver() { return access("/dev/nvidiactl", F_OK) == 0; }

TEST_CASE("a library that is nowhere is named with every name tried and what to do") {
  try {
    SharedLibrary::open_first({"libperseus-absent.so.1", "/nowhere/libperseus-absent.so"},
                              "the test library");
    FAIL("open_first succeeded");
  } catch (const Error &error) {
    const std::string what = error.what();
    CHECK(error.code() == Code::kInvalidArgument);
    CHECK(what.find("the test library could not be loaded") != std::string::npos);
    CHECK(what.find("libperseus-absent.so.1: ") != std::string::npos);
    CHECK(what.find("/nowhere/libperseus-absent.so: ") != std::string::npos);
    CHECK(what.find("LD_LIBRARY_PATH") != std::string::npos);
  }
}

TEST_CASE("a missing symbol says the library is too old") {
  // libc is always loaded, and has no cudaMalloc.
  const SharedLibrary libc = SharedLibrary::open_first({"libc.so.6"}, "libc");
  void (*function)() = nullptr;
  libc.bind_optional(function, "cudaMalloc");
  const bool absent = function == nullptr;
  CHECK(absent);
  try {
    libc.bind(function, "cudaMalloc");
    FAIL("bind succeeded");
  } catch (const Error &error) {
    CHECK(error.code() == Code::kInvalidArgument);
    CHECK(std::string(error.what()).find("has no cudaMalloc: it is too old") != std::string::npos);
  }
  libc.bind(function, "getpid");
  const bool present = function != nullptr;
  CHECK(present);
}

TEST_CASE("ncclConfig_t's 2.18 prefix has nccl.h's offsets and version codes") {
  CHECK(offsetof(NcclConfig, size) == 0);
  CHECK(offsetof(NcclConfig, magic) == 8);
  CHECK(offsetof(NcclConfig, version) == 12);
  CHECK(offsetof(NcclConfig, blocking) == 16);
  CHECK(offsetof(NcclConfig, max_ctas) == 28);
  CHECK(offsetof(NcclConfig, net_name) == 32);
  CHECK(offsetof(NcclConfig, split_share) == 40);
  CHECK(sizeof(NcclConfig) == 48);
  CHECK(NcclConfig{}.version == 21800);
  CHECK(sizeof(NcclUniqueId) == 128);
  CHECK(nccl_version_code(2, 8, 4) == 2804);
  CHECK(nccl_version_code(2, 28, 9) == 22809);
}

TEST_CASE("without a GPU, CUDA and NCCL are unavailable with a reason; with one they load") {
  std::string cuda_why;
  std::string nccl_why;
  const bool cuda = cuda_available(&cuda_why);
  const bool nccl = nccl_available(&nccl_why);
  MESSAGE("cuda_available: " << cuda << " " << cuda_why);
  MESSAGE("nccl_available: " << nccl << " " << nccl_why);
  if (!host_has_nvidia_driver()) {
    CHECK_FALSE(cuda);
    CHECK_FALSE(nccl);
    CHECK(cuda_why.find("CUDA runtime") != std::string::npos);
    CHECK_FALSE(nccl_why.empty());
    return;
  }
  REQUIRE(cuda);
  REQUIRE(nccl);
  CHECK(cuda_why.empty());
  CHECK(nccl_why.empty());
  const CudaApi &api = cuda_api();
  int count = 0;
  CHECK(api.get_device_count(&count) == kCudaSuccess);
  CHECK(count >= 1);
  CHECK(nccl_api().version >= kNcclMinimumVersion);
  CHECK_FALSE(nccl_api().library.empty());
  MESSAGE("NCCL " << nccl_api().version_string() << " from " << nccl_api().library
                  << ", CUDA runtime from " << api.library);
}

TEST_CASE("check_device_pointer tells device memory from host memory" *
          doctest::skip(!cuda_available(nullptr))) {
  const CudaApi &cuda = cuda_api();
  REQUIRE(cuda.set_device(0) == kCudaSuccess);
  void *device = nullptr;
  REQUIRE(cuda.malloc(&device, 256) == kCudaSuccess);
  CHECK_NOTHROW(check_device_pointer(cuda, device, 0, "send buffer"));
  try {
    check_device_pointer(cuda, device, 1, "send buffer");
    FAIL("device 1 accepted");
  } catch (const Error &error) {
    CHECK(std::string(error.what()).find("memory of CUDA device 0, not of device 1") !=
          std::string::npos);
  }
  std::vector<char> host(256);
  try {
    check_device_pointer(cuda, host.data(), 0, "send buffer");
    FAIL("host memory accepted");
  } catch (const Error &error) {
    CHECK(error.code() == Code::kInvalidArgument);
    CHECK(std::string(error.what()).find("is host memory") != std::string::npos);
  }
  CHECK(cuda.get_last_error() == kCudaSuccess);  // nothing left behind for a framework to see
  CHECK(cuda.free(device) == kCudaSuccess);
}

TEST_CASE("CudaApi::check names the step and the CUDA error" *
          doctest::skip(!cuda_available(nullptr))) {
  const CudaApi &cuda = cuda_api();
  try {
    cuda.check(cuda.set_device(4096), "cudaSetDevice(4096)");
    FAIL("device 4096 accepted");
  } catch (const Error &error) {
    CHECK(error.code() == Code::kCommunication);
    CHECK(std::string(error.what()).find("cudaSetDevice(4096): invalid device ordinal") !=
          std::string::npos);
  }
}

}  // namespace
}  // namespace perseus::comm::nccl
