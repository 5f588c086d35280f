#pragma once
// How each collective runs once the ranks have agreed on it, one file per op: the request glue
// (output sizes, whose block is where) and the call of its memory's executor, HostExecutor or
// nccl::DeviceExecutor. The engine looks an op up by kind (runs_of) and calls the entry for the
// operation's memory, on its thread, in the agreed order. All-reduces are not here: the
// engine groups them (fusion_plan) and hands each group to an executor whole.
//
// Adding a collective: its OpKind (operation.h) and traits (op_traits.cc), a file here with its
// host and device runs and its row in ops.cc's table, its C entry point (perseus.h, c_api.cc,
// libperseus.map) and Runtime method; docs/ARCHITECTURE.md has the list.

#include <vector>

#include "lib/comm/host_executor.h"
#include "lib/comm/nccl/device_executor.h"
#include "lib/comm/negotiation.h"
#include "lib/comm/operation.h"

namespace perseus::comm::ops {

// One agreed operation as this rank runs it.
struct OpRun {
  const Agreed &agreed;
  const Descriptor &mine;           // this rank's descriptor
  const std::vector<int> &members;  // its process set's ranks, in rank order
  int me;                           // this rank's index among them
  Request *request;                 // null when this rank has joined
};

using HostRun = void (*)(HostExecutor &host, const OpRun &run);
using DeviceRun = void (*)(nccl::DeviceExecutor &device, const OpRun &run);

// Null: nothing to run there (for a barrier, agreement itself was the operation).
struct OpRuns {
  HostRun host;
  DeviceRun device;
};

const OpRuns &runs_of(OpKind kind);

// Element counts as bytes of elements of `unit` bytes each (what the host executor moves).
inline std::vector<size_t> in_bytes(std::vector<size_t> counts, size_t unit) {
  for (size_t &c : counts) c *= unit;
  return counts;
}

// broadcast.cc
void broadcast_on_host(HostExecutor &host, const OpRun &run);
void broadcast_on_device(nccl::DeviceExecutor &device, const OpRun &run);
// allgatherv.cc
void allgatherv_on_host(HostExecutor &host, const OpRun &run);
void allgatherv_on_device(nccl::DeviceExecutor &device, const OpRun &run);
// alltoall.cc
void alltoall_on_host(HostExecutor &host, const OpRun &run);
void alltoall_on_device(nccl::DeviceExecutor &device, const OpRun &run);
// reducescatter.cc
void reducescatter_on_host(HostExecutor &host, const OpRun &run);
void reducescatter_on_device(nccl::DeviceExecutor &device, const OpRun &run);
// add_process_set.cc
void add_process_set_on_host(HostExecutor &host, const OpRun &run);

}  // namespace perseus::comm::ops
