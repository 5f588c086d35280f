// Alltoall: each member sends counts[i] elements to member i, in rank order; what it receives
// (output_counts[i] from member i) is held by the request.

#include "lib/comm/ops/ops.h"

namespace perseus::comm::ops {

namespace {

// Elements to each member, from each member, and whether any member sends anything.
struct Plan {
  std::vector<size_t> out;
  std::vector<size_t> in;
  size_t total_in = 0;
  bool anything = false;
};

Plan plan(const OpRun &run) {
  Plan p;
  const auto me = static_cast<size_t>(run.me);
  for (size_t i = 0; i < run.members.size(); ++i) {
    const Descriptor &from = run.agreed.per_rank[static_cast<size_t>(run.members[i])];
    p.out.push_back(static_cast<size_t>(run.mine.counts[i]));
    p.in.push_back(static_cast<size_t>(from.counts[me]));
    p.total_in += p.in.back();
    for (uint64_t c : from.counts) p.anything = p.anything || c > 0;
  }
  return p;
}

}  // namespace

void alltoall_on_host(HostExecutor &host, const OpRun &run) {
  const Descriptor &d = run.mine;
  const size_t unit = element_size(d.type);
  Request &request = *run.request;
  const Plan p = plan(run);
  request.output.resize(p.total_in * unit);
  request.output_counts = p.in;
  if (!p.anything) return;  // the same decision on every member
  host.alltoallv(d.process_set, request.send, in_bytes(p.out, unit),
                 p.total_in ? request.output.data() : nullptr, in_bytes(p.in, unit));
}

void alltoall_on_device(nccl::DeviceExecutor &device, const OpRun &run) {
  const Descriptor &d = run.mine;
  const size_t unit = element_size(d.type);
  Request &request = *run.request;
  const Plan p = plan(run);
  request.output_counts = p.in;
  request.device_output = nccl::allocate_device(d.device, p.total_in * unit);
  request.device_output_bytes = p.total_in * unit;
  device.alltoallv(request.send, p.out, request.device_output.get(), p.in, d.type,
                   request.ready_event.get());
}

}  // namespace perseus::comm::ops
