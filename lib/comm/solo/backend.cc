#include "lib/comm/solo/backend.h"

#include <cstring>

namespace perseus::comm::solo {

namespace {

// send == recv is the in-place form of every collective; the contract rules out other overlaps.
void copy(const void *send, void *recv, size_t bytes) {
  if (send != recv && bytes > 0) std::memcpy(recv, send, bytes);
}

}  // namespace

// Every op (sum, average, min, max, product) over one contribution is that contribution.
void Backend::allreduce(const void *send, void *recv, size_t count, DataType type, ReduceOp) {
  copy(send, recv, count * element_size(type));
}

void Backend::broadcast(void *, size_t, DataType, int) {}  // the root (0) already holds it

void Backend::allgather(const void *send, void *recv, size_t count, DataType type) {
  copy(send, recv, count * element_size(type));
}

void Backend::barrier() {}

void Backend::allgatherv(const void *send, void *recv, const std::vector<size_t> &counts) {
  copy(send, recv, counts.at(0));
}

void Backend::alltoallv(const void *send, const std::vector<size_t> &send_counts, void *recv,
                        const std::vector<size_t> &) {
  copy(send, recv, send_counts.at(0));
}

void Backend::reducescatter(const void *send, void *recv, const std::vector<size_t> &counts,
                            DataType type, ReduceOp) {
  copy(send, recv, counts.at(0) * element_size(type));
}

}  // namespace perseus::comm::solo
