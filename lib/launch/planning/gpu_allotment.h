#pragma once
// Which GPUs the ranks of one host see (CUDA_VISIBLE_DEVICES), a pure function of the host's
// facts so that it is tested as a table.
//
// The host's device list is its own CUDA_VISIBLE_DEVICES when set, else 0..gpus-1 when a
// driver reports GPUs, else 0..local_size-1 (a host without a driver gets the same variables,
// so that scripts behave the same there). The host's ranks are allotted the first local_size
// entries, in local-rank order.
//  - kList: every rank sees all entries allotted to its host: "3,5" for both ranks.
//  - kIsolate: each rank sees only its own entry: "3" for local rank 0, "5" for local rank 1.
//  - kNone: CUDA_VISIBLE_DEVICES is left as it is.
// A host with fewer entries than ranks would put two ranks on one GPU: that is an InputError
// naming the host, the counts and the fixes. GPUs listed as busy are left out of the list
// first; when that leaves too few, it is a LaunchError naming the busy GPUs and their holders.
// An empty CUDA_VISIBLE_DEVICES ("no GPU") is kept
// as is for every rank.

#include <optional>
#include <string>
#include <vector>

namespace perseus::launch {

enum class GpuBind { kList, kIsolate, kNone };

struct HostGpuFacts {
  std::optional<int> gpu_count;                     // nullopt: no driver
  std::optional<std::string> cuda_visible_devices;  // the host's own setting
  std::vector<std::string> busy;  // GPUs other processes hold (indices and UUIDs): skipped
  std::string busy_detail;        // who holds them, for the message when too few are left
};

// CUDA_VISIBLE_DEVICES of a host's ranks: with kList one value every rank shares (kept once,
// so that a host of n ranks does not hold n copies of an n-entry list), else one per rank
// (nullopt for kNone).
struct GpuAllotment {
  std::optional<std::string> shared;
  std::vector<std::optional<std::string>> own;  // per local rank when there is no shared value

  std::optional<std::string> of(size_t local_rank) const {
    return shared ? shared : own.at(local_rank);
  }
};

GpuAllotment allot_gpus(GpuBind bind, const HostGpuFacts &facts, int local_size,
                        const std::string &host);

}  // namespace perseus::launch
