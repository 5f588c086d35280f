#pragma once
// The backend of a job of one rank that no launcher started (perseus_init in a process run
// alone, as Horovod allows): every collective over one rank is a copy of its input, so nothing
// listens, connects or starts a thread.

#include "lib/comm/transport/backend.h"

namespace perseus::comm::solo {

class Backend : public transport::Backend {
 public:
  void allreduce(const void *send, void *recv, size_t count, DataType type, ReduceOp op) override;
  void broadcast(void *buffer, size_t count, DataType type, int root) override;
  void allgather(const void *send, void *recv, size_t count, DataType type) override;
  void barrier() override;
  void allgatherv(const void *send, void *recv, const std::vector<size_t> &counts) override;
  void alltoallv(const void *send, const std::vector<size_t> &send_counts, void *recv,
                 const std::vector<size_t> &recv_counts) override;
  void reducescatter(const void *send, void *recv, const std::vector<size_t> &counts, DataType type,
                     ReduceOp op) override;
};

}  // namespace perseus::comm::solo
