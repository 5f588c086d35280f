#include "lib/comm/nccl/hierarchy.h"

#include <algorithm>
#include <map>

#include "lib/comm/error.h"
#include "lib/comm/host_places.h"

namespace perseus::comm::nccl {

namespace {

const void *at(const void *base, size_t elements, DataType type) {
  return static_cast<const char *>(base) + elements * element_size(type);
}
void *at(void *base, size_t elements, DataType type) {
  return static_cast<char *>(base) + elements * element_size(type);
}

}  // namespace

std::string HostLayout::describe() const {
  switch (scheme) {
    case Scheme::kFlat:
      return std::to_string(hosts) + " host(s): one flat all-reduce";
    case Scheme::kScatterGather:
      return std::to_string(hosts) + " hosts x " + std::to_string(local_size) +
             " ranks: reduce-scatter in each host, all-reduce across hosts, all-gather";
    case Scheme::kReduceBroadcast:
      return std::to_string(hosts) +
             " hosts with unequal numbers of ranks: reduce in each host, all-reduce across "
             "hosts, broadcast";
  }
  return "";
}

HostLayout plan_hierarchy(const std::vector<std::string> &hosts, int rank) {
  const HostPlace place = place_among_hosts(hosts, rank);
  std::map<std::string, int> ranks_on;
  for (const std::string &host : hosts) ++ranks_on[host];
  HostLayout layout;
  layout.host_index = place.node;
  layout.local_rank = place.local_rank;
  layout.hosts = static_cast<int>(ranks_on.size());
  layout.local_size = place.local_size;
  layout.cross_rank = layout.host_index;
  layout.cross_size = layout.hosts;
  const auto [fewest, most] =
      std::minmax_element(ranks_on.begin(), ranks_on.end(),
                          [](const auto &a, const auto &b) { return a.second < b.second; });
  if (layout.hosts == 1 || most->second == 1) {
    layout.scheme = Scheme::kFlat;
    layout.cross_size = 1;
    layout.cross_rank = 0;
  } else if (most->second == fewest->second) {
    layout.scheme = Scheme::kScatterGather;
    layout.in_cross = true;
  } else {
    layout.scheme = Scheme::kReduceBroadcast;
    layout.in_cross = layout.local_rank == 0;
  }
  return layout;
}

void hierarchical_allreduce(const HostLayout &layout, Communicator &flat, Communicator *local,
                            Communicator *cross, const void *send, void *recv, size_t count,
                            DataType type, ReduceOp op, CudaStream stream) {
  // An average in two levels is the average of the hosts' averages: the job's average when
  // every host has as many ranks, up to rounding, for floating types; not so for integers (the
  // truncations add up differently) nor for hosts of different sizes.
  const bool two_level_average = layout.scheme == Scheme::kScatterGather &&
                                 type != DataType::kUint8 && type != DataType::kInt8 &&
                                 type != DataType::kInt16 && type != DataType::kInt32 &&
                                 type != DataType::kInt64;
  const bool flat_only =
      layout.scheme == Scheme::kFlat || (op == ReduceOp::kAverage && !two_level_average);
  if (flat_only || count == 0) {
    flat.allreduce(send, recv, count, type, op, stream);
    return;
  }
  if (!local || (layout.in_cross && !cross)) {
    throw Error(Code::kInternal,
                "hierarchical all-reduce without its host or cross-host "
                "communicator (" +
                    layout.describe() + ")");
  }
  if (layout.scheme == Scheme::kReduceBroadcast) {
    local->reduce(send, recv, count, type, op, 0, stream);
    if (layout.in_cross) cross->allreduce(recv, recv, count, type, op, stream);
    local->broadcast(recv, recv, count, type, 0, stream);
    return;
  }
  // kScatterGather: this rank's part is at its local rank's place in recv, which makes both the
  // reduce-scatter (from send == recv) and the all-gather NCCL's in-place forms.
  const auto parts = static_cast<size_t>(layout.local_size);
  const size_t part = count / parts;
  const size_t body = part * parts;
  if (part > 0) {
    void *mine = at(recv, static_cast<size_t>(layout.local_rank) * part, type);
    local->reducescatter(send, mine, part, type, op, stream);
    cross->allreduce(mine, mine, part, type, op, stream);
    local->allgather(mine, recv, part, type, stream);
  }
  if (body < count) {
    flat.allreduce(at(send, body, type), at(recv, body, type), count - body, type, op, stream);
  }
}

}  // namespace perseus::comm::nccl
