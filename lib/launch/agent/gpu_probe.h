#pragma once
// How many GPUs this host has, from NVIDIA's management library loaded at run time, so that
// the same binary runs on hosts without an NVIDIA driver.

#include <optional>

namespace perseus::launch {

// nullopt when no driver (libnvidia-ml.so.1) is found or it fails to initialise.
std::optional<int> probe_gpu_count();

}  // namespace perseus::launch
