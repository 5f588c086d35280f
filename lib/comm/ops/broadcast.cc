// Broadcast: the root's count elements to every member; a member that joined receives into
// scratch memory.

#include "lib/comm/ops/ops.h"

namespace perseus::comm::ops {

namespace {

void *ready(const OpRun &run) {
  return run.request && run.request->ready_event ? run.request->ready_event.get() : nullptr;
}

}  // namespace

void broadcast_on_host(HostExecutor &host, const OpRun &run) {
  const Descriptor &d = run.mine;
  host.broadcast(d.process_set, run.request ? run.request->recv : nullptr,
                 static_cast<size_t>(d.count) * element_size(d.type),
                 index_of(run.members, d.root));
}

void broadcast_on_device(nccl::DeviceExecutor &device, const OpRun &run) {
  const Descriptor &d = run.mine;
  device.broadcast(run.request ? run.request->recv : nullptr, static_cast<size_t>(d.count), d.type,
                   d.root, ready(run));
}

}  // namespace perseus::comm::ops
