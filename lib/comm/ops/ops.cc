#include "lib/comm/ops/ops.h"

#include <array>

namespace perseus::comm::ops {

namespace {

// In OpKind's order.
const std::array<OpRuns, kOpKinds> kRuns = {{
    {nullptr, nullptr},  // allreduce: the engine fuses them
    {broadcast_on_host, broadcast_on_device},
    {allgatherv_on_host, allgatherv_on_device},
    {alltoall_on_host, alltoall_on_device},
    {reducescatter_on_host, reducescatter_on_device},
    {nullptr, nullptr},  // barrier: agreement proved that every rank has arrived
    {nullptr, nullptr},  // join: the engine completes it when every rank has joined
    {add_process_set_on_host, nullptr},
}};

}  // namespace

const OpRuns &runs_of(OpKind kind) {
  static const OpRuns kNothing = {nullptr, nullptr};
  const auto index = static_cast<size_t>(kind);
  return index < kRuns.size() ? kRuns[index] : kNothing;
}

}  // namespace perseus::comm::ops
