#pragma once
// A CUDA runtime table for unit tests of lib/comm/nccl: `Devices` GPUs, device 0 current, every
// call it has succeeds. A test sets, on its copy, the functions it watches.

#include "lib/comm/nccl/cuda_api.h"

namespace perseus::comm::nccl::testing {

template <int Devices>
CudaApi fake_cuda() {
  CudaApi api;
  api.get_device_count = [](int *count) {
    *count = Devices;
    return kCudaSuccess;
  };
  api.get_device = [](int *device) {
    *device = 0;
    return kCudaSuccess;
  };
  api.set_device = [](int) { return kCudaSuccess; };
  api.get_last_error = [] { return kCudaSuccess; };
  api.get_error_string = [](CudaError) { return "fake CUDA error"; };
  return api;
}

}  // namespace perseus::comm::nccl::testing
