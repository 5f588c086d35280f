// Reduce-scatter: the input holds one block per member (counts, in rank order); each member
// gets its block reduced over every member. A true reduce-scatter on both memories: half the
// traffic of an all-reduce of the input (host_executor.h, transport/backend.h).

#include "lib/comm/ops/ops.h"

namespace perseus::comm::ops {

void reducescatter_on_host(HostExecutor &host, const OpRun &run) {
  const Descriptor &d = run.mine;
  const std::vector<size_t> counts(d.counts.begin(), d.counts.end());
  host.reducescatter(d.process_set, run.request->send, run.request->recv, counts, run.me, d.type,
                     d.op, {d.prescale, d.postscale});
}

void reducescatter_on_device(nccl::DeviceExecutor &device, const OpRun &run) {
  const Descriptor &d = run.mine;
  const std::vector<size_t> counts(d.counts.begin(), d.counts.end());
  device.reducescatter(run.request->send, run.request->recv, counts, d.type, d.op,
                       run.request->ready_event.get());
}

}  // namespace perseus::comm::ops
