// Allgatherv: every member's elements in rank order, counts that may differ by rank; the
// result is held by the request (output and output_counts, or device_output).

#include <numeric>

#include "lib/comm/ops/ops.h"

namespace perseus::comm::ops {

namespace {

std::vector<size_t> counts_of(const OpRun &run) {
  std::vector<size_t> counts;
  for (int r : run.members) {
    counts.push_back(static_cast<size_t>(run.agreed.per_rank[static_cast<size_t>(r)].count));
  }
  return counts;
}

}  // namespace

void allgatherv_on_host(HostExecutor &host, const OpRun &run) {
  const Descriptor &d = run.mine;
  const size_t unit = element_size(d.type);
  Request &request = *run.request;
  request.output_counts = counts_of(run);
  const std::vector<size_t> bytes = in_bytes(request.output_counts, unit);
  request.output.resize(std::accumulate(bytes.begin(), bytes.end(), size_t{0}));
  host.allgatherv(d.process_set, d.count ? request.send : nullptr, request.output.data(), bytes);
}

void allgatherv_on_device(nccl::DeviceExecutor &device, const OpRun &run) {
  const Descriptor &d = run.mine;
  const size_t unit = element_size(d.type);
  Request &request = *run.request;
  request.output_counts = counts_of(run);
  size_t total = 0;
  for (size_t c : request.output_counts) total += c;
  request.device_output = nccl::allocate_device(d.device, total * unit);
  request.device_output_bytes = total * unit;
  device.allgatherv(request.send, request.output_counts, d.type, request.device_output.get(),
                    request.ready_event.get());
}

}  // namespace perseus::comm::ops
